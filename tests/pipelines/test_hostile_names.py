"""Names from the data that become output paths (issue 27, security 1): an RLDS split, an ORTF
episode id, a LeRobot camera key, a source's file names. Each is made safe (the conversion writes
only inside the output) or refused at plan with one `error:` line naming the metadata file and the
key, exit 1; in no case is anything written beside the output. Every source that derives a path
from its data, and every table format (the paths are made in one place for all of them).
"""

from __future__ import annotations

import json
import os
import re
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from formats import mixtrain
from formats.errors import FormatError
from formats.sequence import VIDEO, ColumnSpec, path_component
from formats.sources.lerobot_v3.sample import SyntheticLeRobot
from formats.sources.lerobot_v3.sample import write_dataset as write_lerobot
from formats.sources.ortf.sample import SyntheticORTF
from formats.sources.ortf.sample import write_dataset as write_ortf
from formats.sources.rlds.sample import SyntheticRLDS
from formats.sources.rlds.sample import write_dataset as write_rlds
from pipelines import convert
from tests import toy_source

TABLE_FORMATS = ("parquet", "iceberg", "delta", "lance")
# The hostile names: path traversal, separators, relative folders, terminal controls, NUL, overlong.
ESCAPE = "../../../evil"


def _writers():
    return {
        "ortf": lambda p: write_ortf(str(p), SyntheticORTF(lengths=(4, 3), cameras=("cam_wrist",), slow_camera=None, depth_format=None,
                                                           audio=False, annotations=False, urdf=False, episodes_per_chunk=2)),
        "rlds": lambda p: write_rlds(str(p), SyntheticRLDS(splits={"train": (3, 4), "val": (2,)}, shards={"train": 1, "val": 1})),
        "lerobot_v3": lambda p: write_lerobot(str(p), SyntheticLeRobot(lengths=(3, 2), cameras=("observation.images.front",), codec="h264")),
    }


@pytest.fixture(scope="module")
def originals(tmp_path_factory):
    root = tmp_path_factory.mktemp("names")
    for name, write in _writers().items():
        write(root / name)
    return root


# --- editors -------------------------------------------------------------------------------------

def _split(number: int, name: str):
    """dataset_info.json's split `number` renamed; its shard files keep their names (pinned template)."""
    def edit(src):
        path = src / "dataset_info.json"
        info = json.loads(path.read_text())
        split = info["splits"][number]
        split["filepathTemplate"] = f"{{DATASET}}-{split['name']}.{{FILEFORMAT}}-{{SHARD_X_OF_Y}}"
        split["name"] = name
        path.write_text(json.dumps(info))
    return edit


def _episode_id(name: str):
    """ORTF episode 0's id in meta/episodes.parquet and in its steps."""
    def edit(src):
        episodes = pq.read_table(src / "meta/episodes.parquet")
        old = episodes.column("episode_id")[0].as_py()

        def renamed(table):
            ids = [name if value == old else value for value in table.column("episode_id").to_pylist()]
            return table.set_column(table.schema.get_field_index("episode_id"), "episode_id", pa.array(ids, pa.string()))
        pq.write_table(renamed(episodes), src / "meta/episodes.parquet")
        for steps in src.glob("data/chunk-*/steps.parquet"):
            pq.write_table(renamed(pq.read_table(steps)), steps)
    return edit


def _lerobot_cameras(*keys: str):
    """A LeRobot dataset written afresh with these camera keys (the writer stores each under videos/<key>/)."""
    def edit(src):
        shutil.rmtree(src)
        write_lerobot(str(src), SyntheticLeRobot(lengths=(3, 2), cameras=keys, codec="h264"))
    return edit


REFUSED = [
    # RLDS: a split name begins every sequence id, which names the sequence's videos
    ("rlds", "split_traversal", _split(0, ESCAPE), "dataset_info.json",
     r"splits\[0\].name '../../../evil' cannot name an output file: it holds a path separator"),
    ("rlds", "split_backslash", _split(0, "a\\b"), "dataset_info.json",
     r"splits\[0\].name 'a\\\\b' cannot name an output file: it holds a path separator"),
    ("rlds", "split_dotdot", _split(1, ".."), "dataset_info.json", r"splits\[1\].name '..' cannot name an output file: it is a relative folder name"),
    ("rlds", "split_escape_code", _split(0, "tr\x1b[2Jain"), "dataset_info.json",
     r"splits\[0\].name 'tr\\x1b\[2Jain' cannot name an output file: it holds the control character '\\x1b'"),
    ("rlds", "split_nul", _split(0, "train\x00"), "dataset_info.json", r"holds the control character '\\x00'"),
    ("rlds", "split_overlong", _split(0, "t" * 300), "dataset_info.json", r"is longer than 200 bytes"),
    ("rlds", "split_twice", _split(1, "train"), "dataset_info.json", r"splits\[1\].name 'train' names an earlier split too"),
    # ORTF: an episode id is made safe character by character; what is still no file name is refused
    ("ortf", "episode_dotdot", _episode_id(".."), "meta/episodes.parquet",
     r"row 0: episode_id '..' as sequence id '..' cannot name an output file: it is a relative folder name"),
    ("ortf", "episode_dot", _episode_id("."), "meta/episodes.parquet", r"row 0: episode_id '.' as sequence id '.' .*relative folder"),
    ("ortf", "episode_empty", _episode_id(""), "meta/episodes.parquet", r"row 0: episode_id '' as sequence id '' .*it is empty"),
    ("ortf", "episode_overlong", _episode_id("e" * 300), "meta/episodes.parquet", r"row 0: .*is longer than 200 bytes"),
    # LeRobot: two cameras whose keys differ only by separators would share one column and one file per episode
    ("lerobot_v3", "cameras_collide", _lerobot_cameras("observation.images.a.b", "observation.images.a/b"), "meta/info.json",
     r"source features 'observation.images.a.b' and 'observation.images.a/b' both map to column 'video_a_b'"),
]

MADE_SAFE = [
    # ORTF: '/' and every other character outside [A-Za-z0-9._-] become '_'
    ("ortf", "episode_traversal", _episode_id(ESCAPE), ".._.._.._evil"),
    ("ortf", "episode_controls", _episode_id("ep\x1b]0;owned\x07\x9b2J"), "ep__0_owned__2J"),
    # LeRobot: a camera key becomes a snake_case column name ([a-z0-9_])
    ("lerobot_v3", "camera_traversal", _lerobot_cameras("observation.images.../../../evil"), "episode_000000"),
]


def _tree(root) -> set[str]:
    """Every path under root (files and folders), relative."""
    return {os.path.relpath(os.path.join(folder, name), root) for folder, folders, files in os.walk(root) for name in folders + files}


def _run(src, out, table_format="parquet") -> int:
    return convert.run([f"--input={src}", f"--output={out}", "--progress=off", f"--table_format={table_format}",
                        *(["--fps=10"] if (src / "dataset_info.json").exists() else [])])


def _outside(tmp_path, before: set[str]) -> set[str]:
    """What appeared under tmp_path outside the output folder."""
    return {path for path in _tree(tmp_path) - before if path != "out" and not path.startswith("out/")}


def _skip_missing(table_format):
    if table_format == "lance":
        pytest.importorskip("lance")
    if table_format in ("iceberg", "delta"):
        pytest.importorskip({"iceberg": "pyiceberg", "delta": "deltalake"}[table_format])


@pytest.mark.parametrize("source, name, corrupt, blamed, message", REFUSED, ids=[f"{r[0]}-{r[1]}" for r in REFUSED])
def test_a_name_that_cannot_be_a_file_name_is_refused_at_plan(originals, tmp_path, capsys, source, name, corrupt, blamed, message):
    src = tmp_path / "work" / source
    shutil.copytree(originals / source, src)
    corrupt(src)
    before = _tree(tmp_path)
    status = _run(src, tmp_path / "work/out")
    lines = capsys.readouterr().err.strip().splitlines()
    assert status == convert.EXIT_FAILED and len(lines) == 1 and lines[0].startswith("error: "), lines
    assert f"{src}/{blamed}" in lines[0] and re.search(message, lines[0]), lines[0]
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("source, name, corrupt, sequence", MADE_SAFE, ids=[f"{r[0]}-{r[1]}" for r in MADE_SAFE])
def test_a_name_made_safe_converts_inside_the_output(originals, tmp_path, source, name, corrupt, sequence):
    src = tmp_path / "work" / source
    shutil.copytree(originals / source, src)
    corrupt(src)
    before = _tree(tmp_path)
    assert _run(src, tmp_path / "work/out") == convert.EXIT_OK
    assert _outside(tmp_path / "work", {p[len("work/"):] for p in before if p.startswith("work/")}) == set()
    table = pq.read_table(tmp_path / "work/out/data")
    videos = [name for name in table.column_names if name.startswith("video_")]
    row = table.filter(pa.compute.equal(table.column("sequence_id"), sequence)).to_pylist()[0]
    for column in videos:  # each camera its own file, under files/<column>/
        assert row[column] == f"files/{column}/{sequence}.mp4" and (tmp_path / "work/out" / row[column]).is_file()
    paths = [path for path in table.to_pydict()[videos[0]]]
    assert len(set(paths)) == len(paths) == table.num_rows


@pytest.mark.parametrize("table_format", TABLE_FORMATS)
@pytest.mark.parametrize("source, corrupt, blamed", [("rlds", _split(0, ESCAPE), "dataset_info.json"),
                                                     ("ortf", _episode_id(".."), "meta/episodes.parquet")], ids=["rlds-split", "ortf-episode"])
def test_every_table_format_refuses_a_traversing_name(originals, tmp_path, capsys, table_format, source, corrupt, blamed):
    _skip_missing(table_format)
    src = tmp_path / "work" / source
    shutil.copytree(originals / source, src)
    corrupt(src)
    before = _tree(tmp_path)
    assert _run(src, tmp_path / "work/out", table_format) == convert.EXIT_FAILED
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {src}/{blamed}: "), lines
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("table_format", TABLE_FORMATS)
def test_every_table_format_keeps_a_made_safe_name_inside_the_output(originals, tmp_path, table_format):
    _skip_missing(table_format)
    src = tmp_path / "work/ortf"
    shutil.copytree(originals / "ortf", src)
    _episode_id(ESCAPE)(src)
    before = {p[len("work/"):] for p in _tree(tmp_path) if p.startswith("work/")}
    assert _run(src, tmp_path / "work/out", table_format) == convert.EXIT_OK
    assert _outside(tmp_path / "work", before) == set()
    assert not any("evil" in path and ".._.._.._evil" not in path for path in _tree(tmp_path / "work/out"))


@pytest.fixture
def toy():
    toy_source.register()
    yield toy_source
    toy_source.unregister()


def test_a_source_that_forgets_is_refused_by_the_plan_for_every_source(toy, tmp_path, capsys):
    """The toy source takes its sequence ids from file names as they are: the plan's own check
    (every source, before any worker) refuses one holding a terminal control."""
    src = tmp_path / "work/toy"
    toy_source.write_dataset(str(src), lengths=(3, 4))
    for folder, suffix in (("episodes", "npz"), ("videos/front", "mp4")):
        os.rename(src / folder / f"episode_001.{suffix}", src / folder / f"episode\x1b[2J.{suffix}")
    before = _tree(tmp_path)
    assert convert.run([f"--input={src}", f"--output={tmp_path / 'work/out'}", "--progress=off"]) == convert.EXIT_FAILED
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"error: {src}: sequence id 'episode\\x1b[2J' cannot name an output file: it holds the control character '\\x1b'"]
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("name, reason", [(ESCAPE, "holds a path separator"), ("a\\b", "holds a path separator"),
                                          ("..", "is a relative folder name"), (".", "is a relative folder name"), ("", "is empty"),
                                          ("x\x07", r"holds the control character '\\x07'"),
                                          ("x\x9b", r"holds the control character '\\x9b'"),
                                          ("x\x7f", r"holds the control character '\\x7f'"), ("é" * 101, "is longer than 200 bytes")])
def test_output_paths_are_made_of_checked_names_only(name, reason):
    """The workers' last line: video_path / file_path refuse what a plan let through (a reused
    Lance blob's id, a future source), and every component of the path is checked."""
    for make in (lambda: mixtrain.video_path("video_front", name), lambda: mixtrain.video_path(name, "episode_0"),
                 lambda: mixtrain.file_path("audio", name, "a.wav", False), lambda: mixtrain.file_path("annotations", "ep", name, True)):
        with pytest.raises(FormatError, match=f"cannot name an output file: it {reason}$"):
            make()
    with pytest.raises(FormatError, match=reason):
        path_component(name, "name")


def test_checked_names_give_the_same_paths_as_before():
    """Valid names: paths unchanged (outputs stay byte-identical)."""
    assert mixtrain.video_path("video_front", "train_00000_000001") == "files/video_front/train_00000_000001.mp4"
    assert mixtrain.file_path("audio", "ep-0000_kitchen_0", "x.wav", False) == "files/audio/ep-0000_kitchen_0.wav"
    assert mixtrain.file_path("audio", "ep", "noext", False) == "files/audio/ep.bin"
    assert mixtrain.file_path("annotation_files", "ep", "first_frame.jpg", True) == "files/annotation_files/ep/first_frame.jpg"
    assert path_component("é" * 100, "name") == "é" * 100


def test_the_plan_check_names_the_source_for_a_column():
    columns = [ColumnSpec("video_../x", VIDEO, pa.string())]
    with pytest.raises(FormatError, match=r"^src: column 'video_../x' cannot name an output file: it holds a path separator$"):
        mixtrain.check_output_names(columns, [], "src")


# --- read side: a row's file path leading out of the dataset --------------------------------------

@pytest.fixture(scope="module")
def converted(originals, tmp_path_factory):
    """An ORTF conversion with a camera and audio files."""
    base = tmp_path_factory.mktemp("converted")
    write_ortf(str(base / "src"), SyntheticORTF(lengths=(4, 3), cameras=("cam_wrist",), slow_camera=None, depth_format=None,
                                                audio=True, annotations=False, urdf=False))
    assert _run(base / "src", base / "dst") == convert.EXIT_OK
    return base / "dst"


def _cells(dst, column, value):
    """Row 0's cell of `column` in the (one) shard replaced by `value`."""
    shard = dst / "data/part-00000.parquet"
    table = pq.read_table(shard)
    cells = table.column(column).to_pylist()
    cells[0] = value
    pq.write_table(table.set_column(table.schema.get_field_index(column), column, pa.array(cells, table.schema.field(column).type)), shard)
    return table.column("sequence_id")[0].as_py()


@pytest.mark.parametrize("column, escape, reason", [
    ("video_cam_wrist", "../outside.mp4", "escapes the dataset root"),
    ("video_cam_wrist", "/OUTSIDE/outside.mp4", "is absolute; paths in metadata must be inside the dataset"),
    ("audio", "../outside.wav", "escapes the dataset root"),
], ids=["video-traversal", "video-absolute", "audio-traversal"])
def test_validate_and_the_reader_never_open_a_file_outside_the_dataset(converted, tmp_path, capsys, column, escape, reason):
    """A row naming a file beside the dataset (there, and valid: before, validate probed it and
    said valid) is a finding of validate, an error of the reader, and no thumbnail of inspect."""
    from formats.read import reader
    from pipelines import inspect, validate

    dst = tmp_path / "dst"
    shutil.copytree(converted, dst)
    original = (dst / pq.read_table(dst / "data").column(column)[0].as_py())
    shutil.copy(original, tmp_path / escape.rsplit("/", 1)[-1])
    escape = escape.replace("/OUTSIDE", str(tmp_path))
    sequence_id = _cells(dst, column, escape)
    assert validate.main([str(dst)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert f"{dst / 'data/part-00000.parquet'}: {sequence_id}: {column} file {escape!r} {reason}" in out, out
    if column.startswith("video_"):
        with pytest.raises(FormatError, match=re.escape(f"video file {escape!r} {reason}")):
            reader.open_dataset(str(dst)).frames(sequence_id, column, 0, 1)
        assert inspect.main([str(dst), f"--html={tmp_path / 'report.html'}"]) == 0
        assert f"video file {escape!r} {reason}".replace("'", "&#x27;") in (tmp_path / "report.html").read_text()


def test_iceberg_partition_values_become_bounded_file_names_inside_the_table(tmp_path):
    """--partition_by puts a value of the data (a task) in a shard's file name: percent-encoded
    (no '/', '..' or control survives), and a long one cut with a digest (an 80-character CJK
    instruction made a name too long to create: the conversion failed)."""
    pytest.importorskip("pyiceberg")
    from formats.mixtrain.tables import TableSettings, lake

    tasks = ("日本" * 40, "../../x\x1b[2J/" * 3, "Pick up the cube.")
    src = tmp_path / "work/src"
    write_lerobot(str(src), SyntheticLeRobot(lengths=(3, 2, 4), cameras=(), tasks=tasks))
    before = {p[len("work/"):] for p in _tree(tmp_path) if p.startswith("work/")}
    assert convert.run([f"--input={src}", f"--output={tmp_path / 'work/out'}", "--progress=off", "--table_format=iceberg",
                        "--partition_by=task"]) == convert.EXIT_OK
    assert _outside(tmp_path / "work", before) == set()
    names = [path.rsplit("/", 1)[-1] for path in _tree(tmp_path / "work/out") if path.endswith(".parquet") and "/data/" in path]
    assert len(names) == 3 and all(len(name.encode()) <= 200 and name.isascii() for name in names), names
    assert "part-00000.task=Pick%20up%20the%20cube..parquet" in names  # a short value: named as before
    rows = lake.read_rows(f"file://{tmp_path / 'work/out'}", TableSettings(format="iceberg")).sort_by("sequence_id")
    assert rows.column("task").to_pylist() == list(tasks)


def test_two_files_of_a_row_with_one_name_are_refused_before_any_copy(tmp_path):
    """files/<column>/<id>/<name>: two source files of one row sharing a name would be one output
    file, the last copied winning (no built-in source lists such a row: a guard for any)."""
    from formats.sequence import FileRef, Sequence
    from transforms.video import _WriteVideosFn

    for folder in ("a", "b"):
        (tmp_path / "src" / folder).mkdir(parents=True)
        (tmp_path / "src" / folder / "x.png").write_bytes(folder.encode())
    (tmp_path / "staging").mkdir()
    write = _WriteVideosFn(str(tmp_path / "src"), str(tmp_path / "staging"), 10.0, {}, {}, False)
    write.setup()
    sequence = Sequence("ep", 1, np.zeros(1), files={"annotation_files": [FileRef("a/x.png"), FileRef("b/x.png")]})
    with pytest.raises(FormatError, match=r"^ep: annotation_files files 'a/x.png' and 'b/x.png' would both be written as 'x.png'$"):
        list(write.process(sequence))
    assert _tree(tmp_path / "staging") == set()
    named = Sequence("ep", 1, np.zeros(1), files={"annotation_files": [FileRef("a/x.png"), FileRef("b/x.png", name="y.png")]})
    assert [s.files for s in write.process(named)] == [{"annotation_files": ["files/annotation_files/ep/x.png", "files/annotation_files/ep/y.png"]}]


def test_a_dataset_in_a_folder_whose_name_is_not_utf8_reads_and_validates(converted, tmp_path):
    """A folder name of bytes that are not UTF-8 (a Latin-1 é, as an older system wrote it): the
    reader, validate and validate --deep hand Arrow the file's bytes, not a string it cannot encode."""
    from formats.read.reader import open_dataset
    from pipelines import validate

    moved = os.fsdecode(os.fsencode(str(tmp_path)) + b"/caf\xe9")
    shutil.copytree(converted, moved)
    dataset = open_dataset(moved)
    ids = dataset.sequence_ids()
    assert len(ids) == 2 and [dataset.sequence(i)["sequence_id"] for i in ids] == ids
    assert dataset.scan().num_rows == 2
    assert validate.validate(moved) == []
    assert validate.main([moved, "--deep"]) == 0
