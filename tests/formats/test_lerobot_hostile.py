"""LeRobot inputs that once converted silently wrong or with a traceback: each is now either a
faithful conversion or one `error:` line naming the file (exit 1), and nothing is published."""

from __future__ import annotations

import json
import os
import pathlib
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from formats import storage
from formats.errors import FormatError
from formats.sources.lerobot_v3.sample import SyntheticLeRobot, write_dataset
from pipelines import convert

SPEC = SyntheticLeRobot(lengths=(5, 4, 6), cameras=(), episodes_per_meta_file=1, episodes_per_data_file=2)


def _convert(src, dst, *extra) -> int:
    return convert.run([f"--input={src}", f"--output={dst}", "--progress=off", *extra])


def _error(capsys) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


def _info(root: pathlib.Path, **changes) -> pathlib.Path:
    path = root / "meta/info.json"
    info = json.loads(path.read_text())
    info.update(changes)
    path.write_text(json.dumps(info))
    return path


def _feature(root: pathlib.Path, key: str, **changes) -> pathlib.Path:
    path = root / "meta/info.json"
    info = json.loads(path.read_text())
    info["features"][key].update(changes)
    path.write_text(json.dumps(info))
    return path


@pytest.fixture
def dataset(tmp_path) -> pathlib.Path:
    root = tmp_path / "ds"
    write_dataset(str(root), SPEC)
    return root


CASES = {
    "fps zero": (lambda r: _info(r, fps=0), "'fps' must be a positive number of frames per second, found 0"),
    "fps NaN": (lambda r: _info(r, fps=float("nan")), "'fps' must be a positive number of frames per second, found nan"),
    "unknown placeholder": (lambda r: _info(r, data_path="data/chunk-{chunk_index:03d}/episode-{episode_index}.parquet"),
                            "data_path 'data/chunk-{chunk_index:03d}/episode-{episode_index}.parquet' cannot be filled"),
    "bad format spec": (lambda r: _info(r, data_path="data/chunk-{chunk_index:03q}/file-{file_index:03d}.parquet"),
                        "cannot be filled with chunk_index, file_index (ValueError"),
    "a width of 300 million": (lambda r: _info(r, data_path="data/chunk-{chunk_index:03d}/file-{file_index:0>300000000d}.parquet"),
                               "is not a path template: the field 'file_index' asks for a width of more than 255 characters"),
    "a width in Arabic-Indic digits": (lambda r: _info(r, data_path="data/chunk-{chunk_index:03d}/file-{file_index:\u0663\u0660\u0660"
                                                                 "\u0660\u0660\u0660\u0660\u0660d}.parquet"),
                                       "is not a path template: the field 'file_index' asks for a width of more than 255 characters"),
    "a template of 5,000 digits": (lambda r: _info(r, data_path="data/{chunk_index:" + "9" * 5000 + "}.parquet"),
                                   "is not a path template: 5027 characters (a path template has at most 1024)"),
    "a nested spec": (lambda r: _info(r, data_path="data/chunk-{chunk_index:{file_index}}/file-{file_index:03d}.parquet"),
                      "is not a path template: the field 'chunk_index' has a nested format spec"),
    "absurd shape": (lambda r: _feature(r, "action", shape=[10**12]), "feature 'action' has shape [1000000000000]: more than 1e+09 values per frame"),
    "shape as a string": (lambda r: _feature(r, "action", shape="6"), "feature 'action' has shape '6'; expected a list of positive integers"),
    "declared int8, data float32": (lambda r: _feature(r, "action", dtype="int8"),
                                    "feature 'action' is declared int8 but the data files hold float values"),
    "total_episodes disagrees": (lambda r: _info(r, total_episodes=4), "total_episodes is 4 but meta/episodes lists 3 episodes"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_info_json_is_one_line_naming_it(dataset, tmp_path, capsys, case):
    corrupt, message = CASES[case]
    path = corrupt(dataset)
    assert _convert(dataset, tmp_path / "out") == convert.EXIT_FAILED
    line = _error(capsys)
    assert line.startswith(f"error: {path}: ") and message in line, line
    assert not (tmp_path / "out").exists()


def test_a_missing_episode_index_file_is_caught_by_total_episodes(dataset, tmp_path, capsys):
    (dataset / "meta/episodes/chunk-000/file-001.parquet").unlink()
    assert _convert(dataset, tmp_path / "out") == convert.EXIT_FAILED
    assert "total_episodes is 3 but meta/episodes lists 2 episodes" in _error(capsys)


def test_truncated_task_table_is_one_line(dataset, tmp_path, capsys):
    tasks = dataset / "meta/tasks.parquet"
    tasks.write_bytes(tasks.read_bytes()[:40])
    assert _convert(dataset, tmp_path / "out") == convert.EXIT_FAILED
    assert _error(capsys).startswith(f"error: {tasks}: cannot read the task table:")


def test_a_symlinked_chunk_folder_inside_the_dataset_is_read(dataset, tmp_path):
    chunk = dataset / "meta/episodes/chunk-000"
    shutil.move(chunk, dataset / "meta/chunk-000-real")
    os.symlink("../chunk-000-real", chunk)
    assert _convert(dataset, tmp_path / "out") == convert.EXIT_OK
    assert json.loads((tmp_path / "out/mixtrain.json").read_text())["num_sequences"] == 3


def test_glob_characters_in_the_root_do_not_match_a_sibling(tmp_path):
    mine, sibling = tmp_path / "ds[12]", tmp_path / "ds1"
    write_dataset(str(mine), SPEC)
    write_dataset(str(sibling), SyntheticLeRobot(lengths=(7, 7, 7, 7, 7), cameras=()))
    assert _convert(mine, tmp_path / "out") == convert.EXIT_OK
    sidecar = json.loads((tmp_path / "out/mixtrain.json").read_text())
    assert (sidecar["num_sequences"], sidecar["num_timesteps"]) == (3, 15)


@pytest.mark.parametrize("target", ["meta/info.json", "meta/tasks.parquet", "meta/episodes/chunk-000", "meta/episodes/chunk-000/file-000.parquet"])
def test_metadata_reached_through_a_symlink_out_of_the_root_is_refused(dataset, tmp_path, capsys, target):
    inside = dataset / target
    outside = tmp_path / "elsewhere" / pathlib.Path(target).name
    outside.parent.mkdir()
    shutil.move(inside, outside)
    os.symlink(outside, inside)
    assert _convert(dataset, tmp_path / "out") == convert.EXIT_FAILED
    line = _error(capsys)
    assert f"is a symlink to {outside}, outside the dataset root" in line, line


def test_declared_dtype_matches_data_in_every_real_and_generated_layout(tmp_path):
    """The dtype check refuses nothing lerobot itself writes: float64 and bool features included."""
    root = tmp_path / "extra"
    write_dataset(str(root), SyntheticLeRobot(lengths=(4, 3), cameras=(), extra_step_features=True, list_data_files=(0,)))
    assert _convert(root, tmp_path / "out") == convert.EXIT_OK
    table = pq.read_table(tmp_path / "out/data")
    assert table.schema.field("obs_sensor").type == pa.list_(pa.list_(pa.float64(), 2))


def test_a_data_file_rewritten_after_planning_is_named_as_changed(dataset, tmp_path):
    """Planning caches each data file's footer; a file replaced before its episodes are read is
    reported as changed, not as a thrift decoding error."""
    from formats import storage
    from formats.sources import lerobot_v3

    fs, root = storage.open_root(str(dataset))
    meta, refs = lerobot_v3.plan(fs, root)
    data = dataset / refs[2].data_file
    table = pq.read_table(data)
    pq.write_table(table.slice(0, 3), data, row_group_size=1)  # rewritten in place: another footer
    with pytest.raises(lerobot_v3.FormatError) as caught:
        lerobot_v3.load(fs, root, refs[2], meta)
    assert str(caught.value) == f"{data}: episode_000002: changed while it was being converted (rerun the conversion)"


@pytest.mark.parametrize("change, message", [
    (lambda t: np.concatenate([[np.nan], t[1:]]), "timestamp: non-finite value nan at step 0"),
    (lambda t: t[::-1].copy(), "timestamp: not strictly increasing at step 1"),
    (lambda t: t * 3, "contradicts the declared 30 fps"),
])
def test_a_broken_clock_is_refused_not_rebased(tmp_path, capsys, change, message):
    root = tmp_path / "ds"
    write_dataset(str(root), SyntheticLeRobot(lengths=(6, 5), cameras=()))
    data = root / "data/chunk-000/file-000.parquet"
    table = pq.read_table(data)
    timestamps = table.column("timestamp").to_numpy().astype(np.float32)
    first = slice(0, 6)
    timestamps[first] = change(timestamps[first]).astype(np.float32)
    pq.write_table(table.set_column(table.schema.get_field_index("timestamp"), "timestamp", pa.array(timestamps)), data)
    assert _convert(root, tmp_path / "out") == convert.EXIT_FAILED
    line = _error(capsys)
    assert line.startswith(f"error: {data}: episode_000000: ") and message in line, line


def test_a_flipped_bit_in_a_checksummed_page_is_refused(tmp_path, capsys):
    root = tmp_path / "ds"
    write_dataset(str(root), SyntheticLeRobot(lengths=(6, 5), cameras=()))
    data = root / "data/chunk-000/file-000.parquet"
    table = pq.read_table(data)
    pq.write_table(table, data, write_page_checksum=True, compression="none", use_dictionary=False)
    raw = bytearray(data.read_bytes())
    needle = table.column("action").combine_chunks().flatten().to_numpy()[3].tobytes()
    position = raw.find(needle)
    assert position > 0
    raw[position] ^= 0x01
    data.write_bytes(bytes(raw))
    assert _convert(root, tmp_path / "out") == convert.EXIT_FAILED
    line = _error(capsys)
    assert line.startswith(f"error: {data}") and "CRC checksum verification failed" in line, line


def test_a_folder_swapped_for_a_symlink_out_of_the_root_after_a_check_is_still_refused(tmp_path):
    """The root's real path is resolved once per process; the folders below it are looked at on
    every call, so one replaced by a symlink mid-run is caught at the next file."""

    root, outside = tmp_path / "ds", tmp_path / "elsewhere"
    (root / "videos/chunk-000").mkdir(parents=True)
    (outside / "chunk-000").mkdir(parents=True)
    for folder in (root / "videos", outside):
        (folder / "chunk-000/file-000.mp4").write_bytes(b"")
    fs, _ = storage.open_root(str(root))
    assert storage.resolve_inside(str(root), "videos/chunk-000/file-000.mp4", what="video file", fs=fs) == \
        f"{root}/videos/chunk-000/file-000.mp4"
    (root / "videos").rename(root / "videos_before")
    (root / "videos").symlink_to(outside)
    with pytest.raises(FormatError, match=f"video file 'videos/chunk-000/file-000.mp4' is a symlink to {outside}/chunk-000/file-000.mp4, "
                                          "outside the dataset root"):
        storage.resolve_inside(str(root), "videos/chunk-000/file-000.mp4", what="video file", fs=fs)
