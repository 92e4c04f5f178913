"""What a dataset holds, shown to a person (issue 27, security 2 and 3): values from the sidecar,
stats.json, _errors.jsonl and the source reach the HTML report escaped or typed (no markup of
theirs runs), and reach a terminal (inspect, validate, convert's messages) with every control
character escaped (no ESC/BEL/CSI byte of theirs is printed).
"""

from __future__ import annotations

import copy
import html
import html.parser
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from formats.errors import FormatError
from formats.mixtrain import schema
from formats.sources.lerobot_v3.sample import SyntheticLeRobot
from formats.sources.lerobot_v3.sample import write_dataset as write_lerobot
from formats.sources.ortf.sample import SyntheticORTF
from formats.sources.ortf.sample import write_dataset as write_ortf
from formats.sources.rlds.sample import SyntheticRLDS
from formats.sources.rlds.sample import write_dataset as write_rlds
from formats.text import for_terminal
from pipelines import convert, inspect

# Markup a value might carry: a script element, an event handler attribute breaking out of a
# quoted attribute, and an SVG one (the report draws inline SVG).
PAYLOADS = ("<script>alert(1)</script>", '"><img src=x onerror=alert(2)>', "'><svg onload=alert(3)>")
# The keys the reader itself checks and refuses with one line (tested below): the rest is shown.
ROOT = pathlib.Path(__file__).resolve().parents[2]
READER_CHECKED = {("mixtrain",), ("num_sequences",), ("num_timesteps",), ("num_shards",), ("shards",), ("quality",)}


@pytest.fixture(scope="module")
def ortf_dataset(tmp_path_factory):
    """ORTF: trajectories with names and units, three cameras (one depth), audio and annotation files."""
    base = tmp_path_factory.mktemp("display")
    write_ortf(str(base / "src"), SyntheticORTF(lengths=(6, 5)))
    assert convert.run([f"--input={base / 'src'}", f"--output={base / 'dst'}", "--progress=off"]) == 0
    return base / "dst"


class _Markup(html.parser.HTMLParser):
    """Every element and attribute of a page."""

    def __init__(self):
        super().__init__()
        self.tags: dict[str, int] = {}
        self.handlers: list = []
        self.sources: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags[tag] = self.tags.get(tag, 0) + 1
        self.handlers += [(tag, name) for name, _ in attrs if name.startswith("on")]
        self.sources += [value for name, value in attrs if name in ("src", "href", "xlink:href")]


def _markup(page: str) -> _Markup:
    parser = _Markup()
    parser.feed(page)
    parser.close()
    return parser


def _report(dst, path) -> str:
    assert inspect.main([str(dst), f"--html={path}"]) == 0
    return path.read_text()


def _assert_only_own_markup(page: str, clean: str, same_sections: bool = True) -> None:
    """The hostile page has the clean page's elements and nothing else: no script, no handler, no
    source that is not one of our inline JPEGs; and the payloads are there, as text."""
    hostile, own = _markup(page), _markup(clean)
    assert "script" not in hostile.tags and hostile.handlers == []
    assert set(hostile.tags) <= set(own.tags), set(hostile.tags) - set(own.tags)
    if same_sections:  # every plot and thumbnail still drawn
        assert hostile.tags.get("img", 0) == own.tags.get("img", 0) and hostile.tags.get("svg", 0) == own.tags.get("svg", 0)
    assert all(source.startswith("data:image/jpeg;base64,") for source in hostile.sources)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def _leaves(value, path=()):
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _leaves(item, (*path, index))
    elif not isinstance(value, bool) and value is not None:
        yield path, value


def _set(value, path, new):
    for key in path[:-1]:
        value = value[key]
    value[path[-1]] = new


def _refused_by_schema(sidecar: dict, path: tuple, payload: str) -> bool:
    """Whether the sidecar's schema check refuses a payload at `path` (a dim, a resolution, a dtype:
    one error line, tests/pipelines/test_sidecar_input.py); what it accepts must reach the page escaped."""
    trial = copy.deepcopy(sidecar)
    _set(trial, path, payload)
    try:
        schema.check_sidecar(trial, "mixtrain.json")
    except FormatError:
        return True
    return False


def _hostile_sidecar(sidecar: dict, types: bool = False) -> tuple[dict, int]:
    """Every string and number the reader does not check itself replaced by a payload (video fps
    is checked: a camera's rate must be a number; so is what the sidecar's schema types). Column
    kinds (`type`) and the statistics file's name only when `types`: the page then has no plots,
    thumbnails or statistics to show."""
    count = 0
    original = copy.deepcopy(sidecar)
    for path, _ in list(_leaves(sidecar)):
        if path[:1] in {p[:1] for p in READER_CHECKED} or (path[0] == "column_types" and path[-1] == "fps"):
            continue
        if _refused_by_schema(original, path, PAYLOADS[count % len(PAYLOADS)]):
            continue
        if (path == ("stats",) or path[0] == "column_types" and len(path) == 3 and path[-1] == "type") and not types:
            continue
        _set(sidecar, path, PAYLOADS[count % len(PAYLOADS)])
        count += 1
    return sidecar, count


@pytest.mark.parametrize("types", [False, True], ids=["values", "values_and_kinds"])
def test_every_sidecar_value_reaches_the_page_escaped_or_typed(ortf_dataset, tmp_path, types):
    """The reported case: a camera's resolution went into the page verbatim and Chromium ran it;
    here every one of the sidecar's values at once (names, units, resolutions, dims, codecs,
    source, converter options, created_at; then the column kinds too)."""
    clean = _report(ortf_dataset, tmp_path / "clean.html")
    copy = tmp_path / "copy"
    shutil.copytree(ortf_dataset, copy)
    sidecar, count = _hostile_sidecar(json.loads((copy / "mixtrain.json").read_text()), types)
    assert count > 150
    (copy / "mixtrain.json").write_text(json.dumps(sidecar))
    page = _report(copy, tmp_path / "hostile.html")
    _assert_only_own_markup(page, clean, same_sections=not types)
    for payload in PAYLOADS[1:]:
        assert payload not in page and html.escape(payload) in page


@pytest.mark.parametrize("field", ["width", "height"])
def test_a_resolution_holding_markup_is_refused_before_any_page(ortf_dataset, tmp_path, field, capsys):
    """The reported case (a camera's resolution holding a script, which Chromium ran): a
    resolution is typed (positive integers), so the sidecar is refused with one line and no page
    is written; the report's own escaping of a resolution is the second line of defence."""
    copy = tmp_path / "copy"
    shutil.copytree(ortf_dataset, copy)
    sidecar = json.loads((copy / "mixtrain.json").read_text())
    sidecar["column_types"]["video_cam_wrist"]["resolution"][field] = PAYLOADS[0]
    (copy / "mixtrain.json").write_text(json.dumps(sidecar))
    capsys.readouterr()
    assert inspect.main([str(copy), f"--html={tmp_path / 'hostile.html'}"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {copy / 'mixtrain.json'}: column_types.video_cam_wrist.resolution must be ")
    assert not (tmp_path / "hostile.html").exists()


@pytest.mark.parametrize("shape", ["every_value", "every_list", "every_entry"])
def test_statistics_holding_markup_are_refused_before_any_page(ortf_dataset, tmp_path, shape, capsys):
    """stats.json values that are not numbers (markup in them): stats.json is typed, so one error
    line naming it and the key, and no page; the report's escaping of statistics is the second line."""
    copy = tmp_path / "copy"
    shutil.copytree(ortf_dataset, copy)
    stats = json.loads((copy / "stats.json").read_text())
    for column, entry in stats.items():
        if shape == "every_entry":
            stats[column] = PAYLOADS[0]
            continue
        for key, value in entry.items():
            entry[key] = [PAYLOADS[0]] * len(value) if shape == "every_value" and isinstance(value, list) else PAYLOADS[0]
    (copy / "stats.json").write_text(json.dumps(stats))
    capsys.readouterr()
    assert inspect.main([str(copy), f"--html={tmp_path / 'hostile.html'}"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {copy / 'stats.json'}: ")
    assert not (tmp_path / "hostile.html").exists()


def test_skipped_records_holding_markup_are_shown_as_text(ortf_dataset, tmp_path):
    clean = _report(ortf_dataset, tmp_path / "clean.html")
    copy = tmp_path / "copy"
    shutil.copytree(ortf_dataset, copy)
    (copy / "_errors.jsonl").write_text("".join(json.dumps({"sequence_id": payload, "error": payload, "stage": "load"}) + "\n"
                                                for payload in PAYLOADS))
    _assert_only_own_markup(_report(copy, tmp_path / "hostile.html"), clean)


def test_source_names_and_tasks_holding_markup_are_shown_as_text(tmp_path):
    """From the source, through a conversion: tasks (thumbnail table), feature names (columns and
    statistics tables, plot titles)."""
    src = tmp_path / "src"
    write_lerobot(str(src), SyntheticLeRobot(lengths=(4, 3), state_dim=3, codec="h264", tasks=PAYLOADS[:2]))
    info = json.loads((src / "meta/info.json").read_text())
    info["features"]["observation.state"]["names"] = list(PAYLOADS)
    (src / "meta/info.json").write_text(json.dumps(info))
    assert convert.run([f"--input={src}", f"--output={tmp_path / 'dst'}", "--progress=off"]) == 0
    clean_src = tmp_path / "clean_src"
    write_lerobot(str(clean_src), SyntheticLeRobot(lengths=(4, 3), state_dim=3, codec="h264"))
    assert convert.run([f"--input={clean_src}", f"--output={tmp_path / 'clean'}", "--progress=off"]) == 0
    _assert_only_own_markup(_report(tmp_path / "dst", tmp_path / "hostile.html"), _report(tmp_path / "clean", tmp_path / "clean.html"))


@pytest.mark.parametrize("key", sorted(READER_CHECKED))
def test_a_checked_sidecar_key_holding_markup_is_one_error_line(ortf_dataset, tmp_path, capsys, key):
    copy = tmp_path / "copy"
    shutil.copytree(ortf_dataset, copy)
    sidecar = json.loads((copy / "mixtrain.json").read_text())
    _set(sidecar, key, PAYLOADS[0] if key != ("shards",) else [PAYLOADS[0]])
    (copy / "mixtrain.json").write_text(json.dumps(sidecar))
    assert inspect.main([str(copy), f"--html={tmp_path / 'r.html'}"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and not (tmp_path / "r.html").exists()


# --- terminal ------------------------------------------------------------------------------------

# Terminal controls a name might carry: clear the screen, ring the bell, a C1 CSI (red text), set
# the window title (OSC ... BEL), a carriage return that overwrites the line, a bidi override.
CONTROLS = ("cam\x1b[2J", "bell\x07", "csi\x9b31m", "title\x1b]0;owned\x07", "over\rwrite", "rtl\u202etxt")
SHOWN = ("cam\\x1b[2J", "bell\\x07", "csi\\x9b31m", "title\\x1b]0;owned\\x07", "over\\x0dwrite", "rtl\\u202etxt")
_RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")  # every control but the newline ending a line


def _assert_no_raw_controls(*streams: bytes) -> str:
    """No control byte (C0 but newline, DEL, C1 as UTF-8) in what reached the terminal; its text."""
    text = ""
    for data in streams:
        assert not any(code in data for code in (b"\x1b", b"\x07", b"\r", b"\x00", b"\xc2\x9b", b"\xe2\x80\xae")), data[-2000:]
        decoded = data.decode("utf-8")
        assert _RAW.search(decoded) is None, decoded[-2000:]
        text += decoded
    return text


def _cli(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"pipelines.{module}", *map(str, args)], capture_output=True, timeout=300,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


def _control_sidecar(dst) -> None:
    """Every string value of the sidecar the reader and its schema do not check, a control payload in turn."""
    sidecar = json.loads((dst / "mixtrain.json").read_text())
    original = copy.deepcopy(sidecar)
    strings = [path for path, value in _leaves(sidecar) if isinstance(value, str) and path[:1] not in {p[:1] for p in READER_CHECKED}
               and path != ("stats",) and not (path[0] == "column_types" and path[-1] == "type")
               and not _refused_by_schema(original, path, CONTROLS[0])]
    for number, path in enumerate(strings):
        _set(sidecar, path, CONTROLS[number % len(CONTROLS)])
    (dst / "mixtrain.json").write_text(json.dumps(sidecar))
    (dst / "_errors.jsonl").write_text("".join(json.dumps({"sequence_id": c, "error": c, "stage": "load"}) + "\n" for c in CONTROLS))


@pytest.fixture(scope="module")
def control_dataset(tmp_path_factory):
    """A LeRobot conversion whose feature names and tasks hold terminal controls (`converted`),
    and a copy whose sidecar and _errors.jsonl hold them too (returned)."""
    base = tmp_path_factory.mktemp("controls")
    src = base / "src"
    write_lerobot(str(src), SyntheticLeRobot(lengths=(4, 3), state_dim=len(CONTROLS), codec="h264", tasks=CONTROLS[:2]))
    info = json.loads((src / "meta/info.json").read_text())
    info["features"]["observation.state"]["names"] = list(CONTROLS)
    (src / "meta/info.json").write_text(json.dumps(info))
    assert convert.run([f"--input={src}", f"--output={base / 'converted'}", "--progress=off"]) == 0
    shutil.copytree(base / "converted", base / "dst")
    _control_sidecar(base / "dst")
    return base / "dst"


def test_inspect_prints_no_control_character_of_the_data(control_dataset, tmp_path):
    done = _cli("inspect", control_dataset, f"--html={tmp_path / 'report.html'}")
    assert done.returncode == 0, done.stderr[-2000:]
    out = _assert_no_raw_controls(done.stdout, done.stderr)
    for shown in SHOWN:
        assert shown in out, shown
    names = next(line for line in out.splitlines() if line.startswith("  obs_state "))  # the six names, escaped, in some turn
    assert "dim 6    [" in names and all(shown in names.split("dim 6    [", 1)[1] for shown in SHOWN), names


def test_validate_prints_no_control_character_of_the_data(control_dataset, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(control_dataset.parent / "converted", copy)  # the conversion, its sidecar as written
    sidecar = json.loads((copy / "mixtrain.json").read_text())
    sidecar["column_types"]["video_front"].update(pix_fmt=CONTROLS[0], codec=CONTROLS[3])
    (copy / "mixtrain.json").write_text(json.dumps(sidecar))
    done = _cli("validate", copy)
    assert done.returncode == 1
    out = _assert_no_raw_controls(done.stdout, done.stderr)
    assert [line.split(": ", 2)[-1] for line in out.splitlines()[:2]] == [f"codec h264, column_types says {SHOWN[3]}"] * 2


def _rlds_template(src):
    path = src / "dataset_info.json"
    info = json.loads(path.read_text())
    info["splits"][0]["filepathTemplate"] = "x\x1b[2J\x07\x9b31m-{SHARD_X_OF_Y}"
    path.write_text(json.dumps(info))


def _ortf_video(src):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(src / "meta/episodes.parquet")
    rows = table.column("video_files").to_pylist()
    rows[0] = {**rows[0], "cam_wrist": "videos/cam\x1b]0;owned\x07\x9b2J.mp4"}
    pq.write_table(table.set_column(table.schema.get_field_index("video_files"), "video_files", pa.array(rows)), src / "meta/episodes.parquet")


CONVERT_CASES = {
    "rlds_shard_name": (lambda p: write_rlds(str(p), SyntheticRLDS(splits={"train": (3,)}, shards={"train": 1})), _rlds_template,
                        "x\\x1b[2J\\x07\\x9b31m-00000-of-00001: shard 0 of split 'train' not found"),
    "ortf_video_path": (lambda p: write_ortf(str(p), SyntheticORTF(lengths=(4, 3), cameras=("cam_wrist",), slow_camera=None,
                                                                   depth_format=None, audio=False, annotations=False, urdf=False)),
                        _ortf_video, "videos/cam\\x1b]0;owned\\x07\\x9b2J.mp4"),
}


@pytest.mark.parametrize("case", sorted(CONVERT_CASES))
def test_convert_prints_no_control_character_of_the_data(tmp_path, case):
    write, corrupt, shown = CONVERT_CASES[case]
    write(tmp_path / "src")
    corrupt(tmp_path / "src")
    done = _cli("convert", f"--input={tmp_path / 'src'}", f"--output={tmp_path / 'out'}", "--progress=off",
                "--fps=10" if case.startswith("rlds") else "--on_error=fail")
    assert done.returncode == 1
    err = _assert_no_raw_controls(done.stdout, done.stderr)
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and shown in lines[0], err


@pytest.mark.parametrize("text, shown", [("\x1b[2J\x07", "\\x1b[2J\\x07"), ("a\nb\tc\r", "a\\x0ab\\x09c\\x0d"), ("\x9b\x85\x7f", "\\x9b\\x85\\x7f"),
                                         ("\u202eabc\u2066", "\\u202eabc\\u2066"), ("élan 日本 ✓", "élan 日本 ✓")])
def test_for_terminal_escapes_controls_and_keeps_text(text, shown):
    assert for_terminal(text) == shown
