"""LeRobot v2.0 / v2.1 read in place: the values written, the same dataset as after lerobot's own
v2.1 -> v3.0 converter (formats/sources/lerobot_v2/sample.py reproduces it), recording artefacts,
and hostile input (one `error:` line, exit 1, nothing published)."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
import shutil

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from formats.errors import FormatError
from formats.sources.lerobot_v2.sample import convert_v21_to_v30, write_dataset
from formats.sources.lerobot_v3.sample import SyntheticLeRobot, camera_frames, encode_camera
from pipelines import convert

# Five episodes in three chunk folders, two H.264 cameras (B-frames), a PNG camera, and a task
# that changes halfway through episode 1.
SPEC = SyntheticLeRobot(lengths=(12, 9, 15, 7, 10), codec="h264", gop=2, chunks_size=2, image_cameras=("observation.images.top",),
                        multi_task_episodes=(1,))
CAMERAS = {"video_front": "observation.images.front", "video_wrist": "observation.images.wrist"}


def _convert(src, dst, *extra) -> int:
    return convert.run([f"--input={src}", f"--output={dst}", "--progress=off", *extra])


def _frames(path) -> list[np.ndarray]:
    with av.open(str(path)) as container:
        return [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]


def _packets(path) -> list[bytes]:
    with av.open(str(path)) as container:
        return [bytes(packet) for packet in container.demux(video=0) if packet.size]


def _rows(out: pathlib.Path) -> dict[str, dict]:
    table = pa.concat_tables([pq.read_table(path) for path in sorted((out / "data").glob("*.parquet"))])
    return {row["sequence_id"]: row for row in table.to_pylist()}


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """The same episodes as v2.1, as v2.0, and as lerobot's converter turns the v2.1 copy into v3.0
    (one episode per data and video file, two files per chunk: three chunk folders), each converted."""
    base = tmp_path_factory.mktemp("v2")
    truth = write_dataset(str(base / "v21"), SPEC, version="v2.1")
    write_dataset(str(base / "v20"), SPEC, version="v2.0")
    convert_v21_to_v30(str(base / "v21"), str(base / "v30"), episodes_per_data_file=1, episodes_per_video_file=1, chunks_size=2)
    for name in ("v21", "v20", "v30"):
        assert _convert(base / name, base / f"out_{name}") == convert.EXIT_OK
    return base, truth


def test_v21_converts_to_the_values_written(converted):
    base, truth = converted
    rows = _rows(base / "out_v21")
    assert sorted(rows) == [f"episode_{i:06d}" for i in range(5)]
    sidecar = json.loads((base / "out_v21/mixtrain.json").read_text())
    assert sidecar["source"]["format"] == "lerobot_v2" and sidecar["source"]["codebase_version"] == "v2.1"
    assert sidecar["column_types"]["video_top"]["encoded_from"] == "images"
    for episode, length in enumerate(SPEC.lengths):
        row = rows[f"episode_{episode:06d}"]
        assert row["length"] == length and row["episode_index"] == episode
        assert np.array_equal(np.array(row["obs_state"], np.float32), truth["state"][episode])
        assert np.array_equal(np.array(row["action"], np.float32), truth["action"][episode])
        assert row["timestamp"] == (np.arange(length, dtype=np.float32) / np.float32(30)).astype(np.float64).tolist()
        for column, key in CAMERAS.items():  # copied: the source episode's own pixels, frame for frame
            source = base / f"v21/videos/chunk-{episode // 2:03d}/{key}/episode_{episode:06d}.mp4"
            written = _frames(base / "out_v21" / row[column])
            assert len(written) == length and all(np.array_equal(a, b) for a, b in zip(written, _frames(source)))
        assert len(_frames(base / "out_v21" / row["video_top"])) == length
    # Episode 1 changes task halfway: both tasks listed, each step says which.
    changed = rows["episode_000001"]
    assert changed["tasks"] == ["Open the drawer.", "Pick up the cube."] and changed["task"] == "Open the drawer."
    assert changed["task_index"] == [0] * 4 + [1] * 5
    assert rows["episode_000002"]["tasks"] == ["Pick up the cube."] and rows["episode_000002"]["task_index"] == [0] * 15


def test_v20_gives_the_v21_dataset(converted):
    base, _ = converted
    for shard in sorted((base / "out_v21/data").glob("*.parquet")):
        assert (base / "out_v20/data" / shard.name).read_bytes() == shard.read_bytes()
    assert (base / "out_v20/stats.json").read_bytes() == (base / "out_v21/stats.json").read_bytes()
    v20, v21 = (json.loads((base / f"out_{name}/mixtrain.json").read_text()) for name in ("v20", "v21"))
    assert v20["source"]["codebase_version"] == "v2.0" and "video_info" in v20["source"]["features"]["observation.images.front"]
    assert v20["column_types"] == v21["column_types"] and v21["column_types"]["video_front"]["codec"] == "h264"


def test_v21_and_its_v30_conversion_give_the_same_dataset(converted):
    base, _ = converted
    v2, v3 = base / "out_v21", base / "out_v30"
    shards = sorted(path.relative_to(v2) for path in (v2 / "data").glob("*.parquet"))
    assert shards and shards == sorted(path.relative_to(v3) for path in (v3 / "data").glob("*.parquet"))
    for shard in shards:
        assert (v2 / shard).read_bytes() == (v3 / shard).read_bytes()
    assert (v2 / "stats.json").read_bytes() == (v3 / "stats.json").read_bytes()
    videos = sorted(path.relative_to(v2) for path in (v2 / "files").rglob("*.mp4"))
    assert len(videos) == 15 and videos == sorted(path.relative_to(v3) for path in (v3 / "files").rglob("*.mp4"))
    for video in videos:  # the same compressed samples, decoding to the same pixels
        assert _packets(v2 / video) == _packets(v3 / video)
        assert all(np.array_equal(a, b) for a, b in zip(_frames(v2 / video), _frames(v3 / video), strict=True))
    # mixtrain.json differs only where the layouts do: the source format, its version and folder,
    # and the `fps` the converter adds to every non-video feature.
    a, b = (json.loads((path / "mixtrain.json").read_text()) for path in (v2, v3))
    for sidecar in (a, b):
        del sidecar["created_at"], sidecar["converter"]["options"]["source"]
        del sidecar["source"]["format"], sidecar["source"]["uri"], sidecar["source"]["codebase_version"]
    added = {key: feature.pop("fps") for key, feature in b["source"]["features"].items() if feature["dtype"] != "video"}
    assert set(added.values()) == {30} and len(added) == 8
    assert a == b


def test_an_mp4_holding_more_frames_than_rows_gives_the_rows_frames(tmp_path):
    """lerobot 0.3 shows row i the frame at its timestamp i / fps: frames after the last row are never shown."""
    spec = dataclasses.replace(SPEC, lengths=(6, 8), image_cameras=())
    write_dataset(str(tmp_path / "src"), spec, extra_video_frames={1: 3})
    source = tmp_path / "src/videos/chunk-000/observation.images.front/episode_000001.mp4"
    assert len(_frames(source)) == 11
    assert _convert(tmp_path / "src", tmp_path / "out") == convert.EXIT_OK
    written = _frames(tmp_path / "out/files/video_front/episode_000001.mp4")
    assert len(written) == 8 and all(np.array_equal(a, b) for a, b in zip(written, _frames(source)[:8]))
    assert _convert(tmp_path / "src", tmp_path / "reencoded", "--video=reencode") == convert.EXIT_OK  # the same span in both modes
    assert len(_frames(tmp_path / "reencoded/files/video_front/episode_000001.mp4")) == 8


# --- hostile input ---------------------------------------------------------------------------------

DATA_SPEC = SyntheticLeRobot(lengths=(5, 4, 6), cameras=(), chunks_size=2)
VIDEO_SPEC = SyntheticLeRobot(lengths=(5, 4), codec="h264", gop=2, cameras=("observation.images.front",), chunks_size=2)


@pytest.fixture(scope="module")
def originals(tmp_path_factory):
    base = tmp_path_factory.mktemp("v2_hostile")
    write_dataset(str(base / "data"), DATA_SPEC)
    write_dataset(str(base / "video"), VIDEO_SPEC)
    return base


def _edit_jsonl(path: pathlib.Path, edit) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(row) + "\n" for row in edit(rows)))


def _edit_json(path: pathlib.Path, **changes) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def _rewrite_parquet(path: pathlib.Path, **columns) -> None:
    table = pq.read_table(path)
    for name, values in columns.items():
        table = table.set_column(table.schema.get_field_index(name), name, pa.array(values, table.schema.field(name).type))
    pq.write_table(table, path)


def _truncate(path: pathlib.Path) -> None:
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])


def _two_frames() -> bytes:
    """Episode 1's front camera (4 rows) encoded with its first 2 frames only."""
    return encode_camera(VIDEO_SPEC, camera_frames(VIDEO_SPEC, 1, 0, False)[:2], False, continuous=False)


E0, E1, E2 = "data/chunk-000/episode_000000.parquet", "data/chunk-000/episode_000001.parquet", "data/chunk-001/episode_000002.parquet"
FRONT1 = "videos/chunk-000/observation.images.front/episode_000001.mp4"

# case -> (dataset, corruption, the file the line names, what it says after "error: <file>: ")
CASES = {
    "missing video": ("video", lambda r: (r / FRONT1).unlink(), FRONT1, "episode_000001 (video_front): video file not found"),
    "video shorter than the episode": ("video", lambda r: (r / FRONT1).write_bytes(_two_frames()), FRONT1,
                                       "episode_000001 (video_front): segment [0, 0.133333) s holds 2 frames, expected 4"),
    "truncated video": ("video", lambda r: _truncate(r / FRONT1), "",  # PyAV's text names the file
                        "episode_000001 (video_front): cannot open video: [Errno 1094995529] Invalid data found when processing input: "),
    "truncated data file": ("data", lambda r: _truncate(r / E2), E2, "episode_000002: cannot read data: "),
    "missing data file": ("data", lambda r: (r / E1).unlink(), E1, "episode_000001: data file not found (episode 1)"),
    "length disagrees with the file": (
        "data", lambda r: _edit_jsonl(r / "meta/episodes.jsonl", lambda rows: [{**x, "length": 3} if x["episode_index"] == 1 else x for x in rows]),
        E1, "episode_000001: meta/episodes.jsonl gives episode 1 3 frames, its data file holds 4 rows"),
    "a file under another episode's name": (
        "data", lambda r: _rewrite_parquet(r / E1, episode_index=[0] * 4), E1,
        "episode_000001: the data file holds rows of episode(s) [0], not episode 1 (a data file under another episode's name)"),
    "a data file episodes.jsonl does not list": (
        "data", lambda r: (_edit_jsonl(r / "meta/episodes.jsonl", lambda rows: rows[:2]), _edit_json(r / "meta/info.json", total_episodes=2)),
        E2, "a data file that meta/episodes.jsonl does not list (2 episodes listed); add its episode to meta/episodes.jsonl or move the file away"),
    "another v2 version": ("data", lambda r: _edit_json(r / "meta/info.json", codebase_version="v2.2"), "meta/info.json",
                           "codebase_version 'v2.2' is not supported (the lerobot_v2 source reads v2.0 and v2.1, lerobot_v3 reads v3.0)"),
    "chunks_size as text": ("data", lambda r: _edit_json(r / "meta/info.json", chunks_size="2"), "meta/info.json",
                            "'chunks_size' must be int, found '2'"),
    "total_episodes disagrees": ("data", lambda r: _edit_json(r / "meta/info.json", total_episodes=4), "meta/info.json",
                                 "total_episodes is 4 but meta/episodes.jsonl lists 3 episodes"),
    "video_path escaping the root": (
        "video", lambda r: _edit_json(r / "meta/info.json", video_path="/{video_key}/episode_{episode_index:06d}.mp4"), "meta/info.json",
        "video file '/observation.images.front/episode_000000.mp4' is absolute; paths in metadata must be inside the dataset"),
    "data_path escaping the root": (
        "data", lambda r: _edit_json(r / "meta/info.json", data_path="../elsewhere/episode_{episode_index:06d}.parquet"), "meta/info.json",
        "data file '../elsewhere/episode_000000.parquet' escapes the dataset root"),
    "data_path with v3 placeholders": (
        "data", lambda r: _edit_json(r / "meta/info.json", data_path="data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"),
        "meta/info.json", "data_path 'data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet' cannot be filled with episode_chunk, "
        "episode_index (KeyError: 'chunk_index'); lerobot writes e.g. 'data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet'"),
    "timestamps drift": (
        "video", lambda r: _rewrite_parquet(r / E1, timestamp=[0.0, 1 / 30, 2 / 30 + 0.004, 3 / 30 + 0.004]), E1,
        "episode_000001: episode 1: timestamp 0.0706667 s at step 2 is 0.004 s from frame 2 of the camera videos (2/30 s); "
        "lerobot's reader allows 0.0001 s (tolerance_s), so the frames of this episode are not defined"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_input_is_one_error_line(originals, tmp_path, capsys, case):
    dataset, corrupt, named, message = CASES[case]
    root = tmp_path / "src"
    shutil.copytree(originals / dataset, root)
    corrupt(root)
    capsys.readouterr()
    assert _convert(root, tmp_path / "out") == convert.EXIT_FAILED
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    prefix = f"error: {root / named}: " if named else "error: "
    assert lines[0].startswith(prefix + message) and str(root) in lines[0], lines[0]
    assert not (tmp_path / "out").exists()


def test_the_plan_metadata_does_not_grow_with_the_episodes(tmp_path):
    """The metadata travels in the job graph (every DoFn holds it): a v2 dataset, a data file per
    episode, must not carry a footer signature per episode in it (issue 20's graph size), and its
    data files' footers are read in parallel while planning."""
    import pickle

    from formats import storage
    from formats.sources import lerobot_v2

    sizes = {}
    for count in (4, 40):
        spec = SyntheticLeRobot(lengths=[5] * count, cameras=(), chunks_size=16)
        write_dataset(str(tmp_path / f"d{count}"), spec, version="v2.1")
        fs, root = storage.open_root(str(tmp_path / f"d{count}"))
        meta, refs = lerobot_v2.plan(fs, root)
        assert len(refs) == count and meta.private == {}
        sizes[count] = len(pickle.dumps(meta))
    assert sizes[40] - sizes[4] < 2_000, sizes  # the task table and counts, not 36 more footers


def test_an_episode_field_named_like_a_column_of_ours_names_episodes_jsonl(tmp_path, capsys):
    src = tmp_path / "d"
    write_dataset(str(src), SyntheticLeRobot(lengths=(5, 5), cameras=()), version="v2.1")
    index = src / "meta" / "episodes.jsonl"
    lines = [{**json.loads(line), "duration_seconds": 1.0} for line in index.read_text().splitlines()]
    index.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert _convert(src, tmp_path / "out") == convert.EXIT_FAILED
    assert capsys.readouterr().err.splitlines()[0] == (
        f"error: {index}: source features 'duration_seconds' and 'duration_seconds' both map to column 'duration_seconds'; "
        "rename one in the source")
    assert not (tmp_path / "out").exists()


def test_episode_fields_are_read_from_every_line_not_the_first(tmp_path):
    """A field the first line of episodes.jsonl lacks was dropped for every episode (tasks too: every
    row's tasks became [] and no per-step task column was made)."""
    from formats import storage
    from formats.sources import lerobot_v2

    src = tmp_path / "d"
    write_dataset(str(src), SyntheticLeRobot(lengths=(5, 5, 5), cameras=()), version="v2.1")
    index = src / "meta" / "episodes.jsonl"
    lines = [json.loads(line) for line in index.read_text().splitlines()]
    lines[1]["operator"], lines[2]["operator"] = "ana", "bo"  # not on the first line
    index.write_text("".join(json.dumps(line) + "\n" for line in lines))
    fs, root = storage.open_root(str(src))
    table = lerobot_v2._read_episodes(fs, root)
    assert table.column("operator").to_pylist() == [None, "ana", "bo"]
    del lines[0]["tasks"]  # tasks on some lines only: refused, naming the line
    index.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.raises(FormatError, match=r"episodes.jsonl: line 1: no tasks, where other lines list theirs$"):
        lerobot_v2._read_episodes(fs, root)
    lines[0]["tasks"] = ["a task"]
    lines[1]["operator"], lines[2]["operator"] = 5, 2**70  # past 64 bits: the file is named, not the folder
    index.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.raises(FormatError, match=r"meta/episodes.jsonl: an episode field holds values of different types"):
        lerobot_v2._read_episodes(fs, root)


def test_a_missing_data_file_is_refused_by_the_plan_not_by_a_worker(originals, tmp_path, monkeypatch):
    """Issue 41: a 200,000-line episodes.jsonl was planned whole (18 s, 1.4 GB) before a worker found
    a data file missing. The plan lists each data folder once and names the first missing file
    before it builds a single episode's ref."""
    from formats import storage
    from formats.sources import lerobot_v2

    root = tmp_path / "src"
    shutil.copytree(originals / "data", root)
    (root / E1).unlink()
    built = []
    monkeypatch.setattr(lerobot_v2, "plan_episodes", lambda *args, **kwargs: built.append(args) or (None, []))
    fs, path = storage.open_root(str(root))
    with pytest.raises(FormatError, match=f"^{re.escape(str(root / E1))}: episode_000001: data file not found \\(episode 1\\)$"):
        lerobot_v2.plan(fs, path)
    assert built == []
