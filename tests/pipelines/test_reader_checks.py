"""The reader does not trust what it cannot check for free (issue 27, item 10): a video holding
fewer frames than the sequence's length, and bytes-layout cells whose size does not match the
column_types entry (an edited dim or dtype), are one FormatError naming the file and sequence on
every table format; an edit the cells cannot show (a dtype of the same width, a stats.json
rewritten) is found by validate --deep, which recomputes the statistics."""

from __future__ import annotations

import json
import shutil

import pytest

from formats import storage
from formats.errors import FormatError
from formats.read import reader
from formats.sources.lerobot_v3.sample import SyntheticLeRobot
from formats.sources.lerobot_v3.sample import write_dataset as write_lerobot
from pipelines import convert, inspect, validate

SPEC = SyntheticLeRobot(lengths=(9, 5, 7), codec="h264", gop=None, episodes_per_video_file=3, cameras=("observation.images.front",))
TABLE_FORMATS = {"parquet": [], "delta": ["--table_format=delta"], "iceberg": ["--table_format=iceberg"],
                 "lance": ["--table_format=lance", "--lance_videos=reference"]}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = tmp_path_factory.mktemp("reader_checks") / "src"
    write_lerobot(str(root), SPEC)
    return root


def _convert(source, dst, *options) -> str:
    assert convert.run([f"--input={source}", f"--output={dst}", "--progress=off", *options]) == 0
    return str(dst)


@pytest.mark.parametrize("table_format", sorted(TABLE_FORMATS))
def test_a_video_shorter_than_its_sequence_is_refused_by_frames(source, tmp_path, table_format):
    if table_format == "lance":
        pytest.importorskip("lance")
    url = _convert(source, tmp_path / "dst", *TABLE_FORMATS[table_format])
    dataset = reader.open_dataset(url)
    long_id, short_id = "episode_000000", "episode_000001"  # 9 and 5 timesteps
    assert dataset.frames(long_id, "video_front").shape[0] == 9
    long_file = storage.open_root(dataset.video_url(long_id, "video_front"))[1]
    shutil.copyfile(storage.open_root(dataset.video_url(short_id, "video_front"))[1], long_file)
    with pytest.raises(FormatError) as raised:
        reader.open_dataset(url).frames(long_id, "video_front")
    assert str(raised.value) in (f"{long_file}: 5 frames decoded from timestep 0, but the sequence has 9 timesteps",
                                 f"file://{long_file}: 5 frames decoded from timestep 0, but the sequence has 9 timesteps")
    with pytest.raises(FormatError, match="3 frames decoded from timestep 2, but the sequence has 9 timesteps"):
        reader.open_dataset(url).frames(long_id, "video_front", start=2)
    assert reader.open_dataset(url).frames(long_id, "video_front", 0, 5).shape[0] == 5  # what the file holds still reads


@pytest.fixture(scope="module")
def bytes_dataset(source, tmp_path_factory):
    return _convert(source, tmp_path_factory.mktemp("bytes") / "dst", "--array_layout=bytes")


def _edited(bytes_dataset, tmp_path, **entry) -> tuple:
    copy = tmp_path / "copy"
    shutil.copytree(bytes_dataset, copy)
    sidecar = json.loads((copy / "mixtrain.json").read_text())
    sidecar["column_types"]["action"].update(entry)
    if "dim" in entry:
        sidecar["column_types"]["action"]["cell_shape"] = [-1, entry["dim"]]
    (copy / "mixtrain.json").write_text(json.dumps(sidecar))
    return copy, copy / "mixtrain.json"


READS = {
    "sequence": lambda ds: ds.sequence("episode_000000"),
    "trajectories": lambda ds: ds.trajectories("episode_000000", ["action"]),
    "rows": lambda ds: list(ds.rows(["sequence_id", "action"])),
    "windows": lambda ds: list(ds.windows(2, columns=["action"])),
}
# Edits a cell's size shows: (entry changes, what the message says of episode_000000). action is
# [T, 6] float32: 24 bytes a step, 216 bytes for its 9 steps.
SIZE_LIES = {
    "dim_halved": ({"dim": 3}, "a cell of 216 bytes holds 18 steps as column_types says 3 x float32 a step, but the sequence has 9 timesteps"),
    "dim_doubled": ({"dim": 12}, "a trajectory cell of 216 bytes is not a whole number of 12 x float32 steps "
                                 "(column_types says 12 x float32 a step)"),
    "dim_plus_one": ({"dim": 7}, "a trajectory cell of 216 bytes is not a whole number of 7 x float32 steps"),
    "dtype_wider": ({"dtype": "float64"}, "a trajectory cell of 216 bytes is not a whole number of 6 x float64 steps"),
    "dtype_narrower": ({"dtype": "float16"}, "a cell of 216 bytes holds 18 steps as column_types says 6 x float16 a step, but the sequence has 9"),
    "dtype_bytes": ({"dtype": "uint8"}, "a cell of 216 bytes holds 36 steps as column_types says 6 x uint8 a step, but the sequence has 9"),
}


@pytest.mark.parametrize("read", sorted(READS))
@pytest.mark.parametrize("lie", sorted(SIZE_LIES))
def test_a_bytes_cell_that_does_not_fit_column_types_is_refused(bytes_dataset, tmp_path, read, lie):
    entry, message = SIZE_LIES[lie]
    root, sidecar = _edited(bytes_dataset, tmp_path, **entry)
    dataset = reader.open_dataset(str(root))
    with pytest.raises(FormatError) as raised:
        READS[read](dataset)
    text = str(raised.value)
    assert text.startswith(f"{sidecar}: episode_00000") and "column 'action'" in text, text
    described = f"{entry.get('dim', 6)} x {entry.get('dtype', 'float32')}"
    assert ("is not a whole number of" in text or "but the sequence has" in text) and described in text
    if text.startswith(f"{sidecar}: episode_000000:"):  # the 9-step episode (windows may meet another first)
        assert text == f"{sidecar}: episode_000000: column 'action': {message}" or message in text, text
    assert validate.main([str(root)]) == 1  # validate: the steps of each cell against length (a finding)


def test_the_html_report_refuses_a_lying_cell_with_one_line(bytes_dataset, tmp_path, capsys):
    root, sidecar = _edited(bytes_dataset, tmp_path, dim=3)
    assert inspect.main([str(root), f"--html={tmp_path / 'report.html'}"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {sidecar}: episode_000") and "column 'action'" in err


def test_validate_deep_recomputes_statistics_a_same_width_dtype_edit_changes(bytes_dataset, tmp_path, capsys):
    assert validate.main([bytes_dataset, "--deep"]) == 0
    capsys.readouterr()
    root, _ = _edited(bytes_dataset, tmp_path, dtype="int32")  # 4 bytes like float32: every size still fits
    assert len(reader.open_dataset(str(root)).trajectories("episode_000000")["action"]) == 9
    assert validate.validate(str(root)) == []  # sizes agree: only the statistics can tell
    assert validate.main([str(root), "--deep"]) == 1
    out = capsys.readouterr().out
    assert f"{root / 'stats.json'}: action.mean[0] is " in out and ", the rows give " in out


@pytest.mark.parametrize("stat", ["mean", "std", "min", "max", "q50", "count"])
def test_validate_deep_names_the_column_and_stat_of_an_edited_stats_json(bytes_dataset, tmp_path, capsys, stat):
    copy = tmp_path / "copy"
    shutil.copytree(bytes_dataset, copy)
    stats = json.loads((copy / "stats.json").read_text())
    stats["obs_state"][stat][0] = stats["obs_state"][stat][0] + 1
    (copy / "stats.json").write_text(json.dumps(stats))
    assert validate.main([str(copy), "--deep"]) == 1
    findings = [line for line in capsys.readouterr().out.splitlines() if "stats.json" in line]
    original = json.loads(open(f"{bytes_dataset}/stats.json").read())["obs_state"][stat]
    assert findings == [f"{copy / 'stats.json'}: obs_state.{stat}[0] is {json.dumps(stats['obs_state'][stat][0])}, "
                        f"the rows give {json.dumps(original[0])}"]
