"""LeRobot v3 reader: the real fixture, synthetic multi-file datasets, and bad input."""

import json
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from formats import storage
from formats.errors import FormatError
from formats.sources import lerobot_v3


def _plan(path):
    fs, root = storage.open_root(str(path))
    meta, refs = lerobot_v3.plan(fs, root)
    return fs, root, meta, refs


def test_fixture_plan_and_load_match_the_source_rows(so100_tiny):
    fs, root, meta, refs = _plan(so100_tiny)
    assert [r.length for r in refs] == [51, 54, 25, 44, 23]
    assert [r.sequence_id for r in refs] == [f"episode_{i:06d}" for i in range(5)]
    names = [c.name for c in meta.columns]
    assert names[:4] == ["sequence_id", "length", "duration_seconds", "timestamp"]
    assert {"obs_state", "action", "video_front", "video_wrist", "task", "tasks", "split", "episode_index"} <= set(names)
    source = pq.read_table(so100_tiny / "data/chunk-000/file-000.parquet")
    state = np.stack(source.column("observation.state").to_numpy(zero_copy_only=False))
    episode = source.column("episode_index").to_numpy()
    for ref in refs:
        sequence = lerobot_v3.load(fs, root, ref, meta)
        rows = episode == ref.episode_index
        assert sequence.trajectories["obs_state"].dtype == np.float32
        assert sequence.trajectories["obs_state"].tobytes() == state[rows].tobytes()
        raw_ts = source.column("timestamp").to_numpy()[rows].astype(np.float64)
        np.testing.assert_array_equal(sequence.timestamp, raw_ts - raw_ts[0])
        assert sequence.videos["video_front"].path == "videos/observation.images.front/chunk-000/file-000.mp4"
    # Task text comes from the pandas index column of meta/tasks.parquet.
    first = lerobot_v3.load(fs, root, refs[0], meta)
    assert first.scalars["task"] == "Pick up the red cube and place it in the bin."
    assert first.scalars["split"] == "train"


def test_multi_file_dataset_reads_every_episode_exactly(multi_file_dataset):
    path, truth = multi_file_dataset
    fs, root, meta, refs = _plan(path)
    assert len(refs) == 7
    assert len({r.data_file for r in refs}) == 4  # 2 episodes per file over 2 chunk folders
    assert len({seg.path for r in refs for _, seg in r.videos}) == 6  # 3 files per camera, 2 cameras
    for ref in refs:
        sequence = lerobot_v3.load(fs, root, ref, meta)
        i = ref.episode_index
        assert sequence.trajectories["obs_state"].tobytes() == truth["state"][i].tobytes()
        assert sequence.trajectories["action"].tobytes() == truth["action"][i].tobytes()
        assert sequence.trajectories["obs_sensor"].dtype == np.float64
        np.testing.assert_array_equal(sequence.trajectories["obs_sensor"], truth["sensor"][i])
        np.testing.assert_array_equal(sequence.steps["next_reward"], truth["reward"][i])
        assert sequence.steps["next_done"].to_pylist() == truth["done"][i].tolist()
        assert sequence.scalars["split"] == ("train" if i < 5 else "val")
    multi = lerobot_v3.load(fs, root, refs[1], meta)
    assert multi.scalars["tasks"] == ["Open the drawer.", "Pick up the cube."]
    assert multi.steps["task_index"].tolist() == [0] * 7 + [1] * 8


def test_memory_filesystem(multi_file_dataset):
    path, truth = multi_file_dataset
    fs, _ = storage.open_root("memory://lerobot_mem")
    fs.put(str(path), "/lerobot_mem", recursive=True)
    mem_fs, root, meta, refs = _plan("memory://lerobot_mem")
    sequence = lerobot_v3.load(mem_fs, root, refs[3], meta)
    assert sequence.trajectories["obs_state"].tobytes() == truth["state"][3].tobytes()


def test_refs_keep_their_identity_and_share_repeated_values(so100_tiny):
    """The launcher holds a ref per episode (a million at once): slotted, one object per data file,
    video file and task list. Their repr is what --incremental fingerprints hash: pinned as it was."""
    fs, root, meta, refs = _plan(so100_tiny)
    assert repr(refs[1]) == REF_1_REPR
    assert not hasattr(refs[1], "__dict__") and not hasattr(refs[1].videos[0][1], "__dict__")
    assert refs[0].data_file is refs[4].data_file and refs[0].tasks is refs[3].tasks  # the same task list
    assert refs[0].videos[0][1].path is refs[4].videos[0][1].path
    again = pickle.loads(pickle.dumps(refs, protocol=pickle.HIGHEST_PROTOCOL))  # how the plan files carry them
    assert again == refs and [repr(ref) for ref in again] == [repr(ref) for ref in refs]
    assert [ref.read_group for ref in again] == ["data/chunk-000/file-000.parquet"] * 5


REF_1_REPR = ("EpisodeRef(episode_index=1, sequence_id='episode_000001', length=54, data_file='data/chunk-000/file-000.parquet', "
              "from_index=51, to_index=105, tasks=('Open the top drawer.',), videos=(('video_front', VideoSegment("
              "path='videos/observation.images.front/chunk-000/file-000.mp4', frames=54, start=1.7, end=3.5, frame_indices=None)), "
              "('video_wrist', VideoSegment(path='videos/observation.images.wrist/chunk-000/file-000.mp4', frames=54, start=1.7, "
              "end=3.5, frame_indices=None))), scalars=(('episode_index', 1), ('split', 'train')))")


def test_refs_planned_in_batches_are_the_refs_planned_at_once(multi_file_dataset, monkeypatch):
    path, _ = multi_file_dataset
    _, _, _, whole = _plan(path)
    monkeypatch.setattr(lerobot_v3, "_PLAN_BATCH_ROWS", 2)  # 7 episodes in 4 batches
    _, _, _, batched = _plan(path)
    assert batched == whole and [repr(ref) for ref in batched] == [repr(ref) for ref in whole]
    assert batched[0].data_file is batched[1].data_file and batched[0].scalars[1] is batched[4].scalars[1]  # ("split", "train")
    assert [ref.scalars[1] for ref in batched] == [("split", "train")] * 5 + [("split", "val")] * 2


def _info(path):
    return json.loads((path / "meta/info.json").read_text())


def test_missing_info_json(writable_so100):
    (writable_so100 / "meta/info.json").unlink()
    with pytest.raises(FormatError, match=r"meta/info.json: not found; a LeRobot v3 dataset needs meta/info.json"):
        _plan(writable_so100)


def test_malformed_info_json(writable_so100):
    (writable_so100 / "meta/info.json").write_text("{not json")
    with pytest.raises(FormatError, match=r"meta/info.json: malformed JSON"):
        _plan(writable_so100)


def test_v21_is_left_to_lerobot_v2(writable_so100):
    info = _info(writable_so100)
    info["codebase_version"] = "v2.1"
    (writable_so100 / "meta/info.json").write_text(json.dumps(info))
    fs, root = storage.open_root(str(writable_so100))
    assert not lerobot_v3.detect(fs, root)
    with pytest.raises(FormatError) as caught:
        _plan(writable_so100)
    assert str(caught.value) == (f"{writable_so100 / 'meta/info.json'}: codebase_version 'v2.1' is not supported "
                                 "(the lerobot_v3 source reads v3.0, lerobot_v2 reads v2.0 and v2.1)")


def test_wrong_type_in_metadata(writable_so100):
    info = _info(writable_so100)
    info["fps"] = "thirty"
    (writable_so100 / "meta/info.json").write_text(json.dumps(info))
    with pytest.raises(FormatError, match=r"'fps' must be int/float, found 'thirty'"):
        _plan(writable_so100)


def test_image_feature_missing_from_the_data_is_an_error_not_a_dropped_camera(writable_so100):
    info = _info(writable_so100)
    info["features"]["observation.image"] = {"dtype": "image", "shape": [48, 64, 3], "names": None}
    (writable_so100 / "meta/info.json").write_text(json.dumps(info))
    fs, root = storage.open_root(str(writable_so100))
    meta, refs = lerobot_v3.plan(fs, root)
    assert meta.column("video_image").meta["encoded_from"] == "images"
    message = r"file-000.parquet: episode_000000: columns \['observation.image'\] declared in meta/info.json are missing"
    with pytest.raises(FormatError, match=message):
        lerobot_v3.load(fs, root, refs[0], meta)


def _rewrite_episodes(path, change):
    file = path / "meta/episodes/chunk-000/file-000.parquet"
    table = pq.read_table(file)
    pq.write_table(change(table), file)


def test_offsets_past_the_data_file_name_file_and_episode(writable_so100):
    def shift(table):
        rows = table.to_pylist()
        rows[4]["dataset_from_index"] += 100
        rows[4]["dataset_to_index"] += 100
        return pa.Table.from_pylist(rows, schema=table.schema)

    _rewrite_episodes(writable_so100, shift)
    fs, root, meta, refs = _plan(writable_so100)
    with pytest.raises(FormatError) as caught:
        lerobot_v3.load(fs, root, refs[4], meta)
    message = str(caught.value)
    assert "data/chunk-000/file-000.parquet" in message and "episode_000004" in message
    assert "offsets index 274..297 point past the data file (0 of 23 rows found)" in message


def test_zero_length_episode_is_refused(writable_so100):
    def zero(table):
        rows = table.to_pylist()
        rows[2]["length"] = 0
        rows[2]["dataset_to_index"] = rows[2]["dataset_from_index"]
        return pa.Table.from_pylist(rows, schema=table.schema)

    _rewrite_episodes(writable_so100, zero)
    with pytest.raises(FormatError, match=r"episode_000002: length 0"):
        _plan(writable_so100)


def test_duplicate_episode_index(writable_so100):
    def duplicate(table):
        rows = table.to_pylist()
        rows[3]["episode_index"] = 2
        return pa.Table.from_pylist(rows, schema=table.schema)

    _rewrite_episodes(writable_so100, duplicate)
    with pytest.raises(FormatError, match=r"episode_index 2 appears more than once"):
        _plan(writable_so100)


def test_video_path_escaping_the_root_is_refused(writable_so100):
    info = _info(writable_so100)
    info["data_path"] = "../outside/file-{file_index:03d}.parquet"
    (writable_so100 / "meta/info.json").write_text(json.dumps(info))
    with pytest.raises(FormatError, match=r"escapes the dataset root"):
        _plan(writable_so100)
