"""ORTF v0.2: datasets written to the spec (several chunks, cameras, depth, audio, annotations) and bad input."""

import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from formats import storage
from formats.errors import ColumnNameError, FormatError
from formats.sequence import FileRef, VideoSegment
from formats.sources import ortf
from formats.sources.ortf.sample import STATE_COMPONENTS, SyntheticORTF, write_dataset

EXACT = SyntheticORTF(slow_camera=None)


@pytest.fixture(scope="module")
def exact(tmp_path_factory):
    path = tmp_path_factory.mktemp("ortf") / "ds"
    return path, write_dataset(str(path), EXACT)


def _all(path):
    fs, root = storage.open_root(str(path))
    meta, refs = ortf.plan(fs, root)
    return meta, refs, [ortf.load(fs, root, ref, meta) for ref in refs]


def test_every_episode_one_sequence_with_exact_step_values(exact):
    path, truth = exact
    meta, refs, sequences = _all(path)
    assert len(sequences) == 5 and {ref.steps_file for ref in refs} == {f"data/chunk-00{i}/steps.parquet" for i in range(3)}
    for sequence, episode, row in zip(sequences, truth["episodes"], truth["episode_rows"]):
        assert sequence.sequence_id == episode["episode_id"].replace("/", "_").replace("#", "_")
        assert sequence.scalars["episode_id"] == episode["episode_id"]
        for component in STATE_COMPONENTS:
            got = sequence.trajectories[f"obs_{component}"]
            assert got.dtype == np.float32 and got.tobytes() == episode["state"][component].tobytes()
        assert sequence.trajectories["action"].tobytes() == episode["action"].tobytes()
        assert np.array_equal(sequence.timestamp, episode["timestamp"] - episode["timestamp"][0])
        assert sequence.steps["is_last"].to_pylist() == [i == episode["length"] - 1 for i in range(episode["length"])]
        assert sequence.steps["is_terminal"].to_pylist()[-1] == (not episode["failed"])
        for key in ("success", "failure_reason", "operator_notes", "recorded_at", "duration_seconds"):
            assert sequence.scalars[key] == row[key]
        assert sequence.scalars["task"] == truth["tasks"][row["task_id"]]["instruction"]
        assert sequence.scalars["task_type"] == truth["tasks"][row["task_id"]]["type"]
        for camera in ("cam_wrist", "cam_overhead", "depth"):
            segment = sequence.videos[f"video_{camera}"]
            assert segment == VideoSegment(row["video_files"][camera], episode["length"])  # whole file, byte copy
        assert sequence.files["audio"] == FileRef(row["audio_file"])
        assert json.loads(sequence.scalars["scene_objects"]) == episode["scene_objects"]
        folder = f"annotations/episode_{refs[sequences.index(sequence)].position:06d}"
        assert sequence.files["annotation_files"] == [FileRef(f"{folder}/first_frame.jpg", name="first_frame.jpg")]
    failed = [s for s in sequences if s.scalars["success"] is False]
    assert len(failed) == 1 and failed[0].scalars["failure_reason"] == "gripper slipped, object dropped"
    assert any("✓" in s.scalars["operator_notes"] for s in sequences)


def test_manifest_semantics_reach_the_columns(exact):
    path, _ = exact
    meta, _, _ = _all(path)
    joints = meta.column("obs_joint_positions").meta
    assert joints["names"] == [f"panda_joint{i}" for i in range(1, 8)] and joints["units"] == "radians"
    assert meta.column("obs_ee_orientation").meta["order"] == "wxyz"
    action = meta.column("action").meta
    assert action["names"] == ["dx", "dy", "dz", "droll", "dpitch", "dyaw", "gripper"]
    assert action["units"][:3] == ["meters"] * 3 and action["ranges"][6] == [0, 1]
    assert action["action_space"]["type"] == "end_effector_delta"
    camera = meta.column("video_cam_wrist").meta
    assert camera["intrinsics"]["fx"] == 60.0 and camera["codec"] == "h264" and camera["sensor"] == "cam_wrist_rgb"
    depth = meta.column("video_depth").meta
    assert depth["is_depth_map"] and depth["pix_fmt"] == "gray16le" and depth["depth_units"] == "millimeters"
    assert meta.column("audio").meta["sample_rate"] == 16000
    manifest = meta.source["manifest"]
    assert {"robot", "action_space", "observation_space", "sensors", "frames", "collection"} <= set(manifest)
    assert meta.source["tasks"][1]["instruction"] == "Öffne die Schublade"


def test_slower_camera_is_retimed_and_npz_depth_is_a_file(tmp_path):
    path = tmp_path / "ds"
    write_dataset(str(path), SyntheticORTF(depth_format="npz", lengths=(6, 5)))
    meta, refs, sequences = _all(path)
    overhead = sequences[0].videos["video_cam_overhead"]
    assert overhead.frame_indices == (0, 0, 1, 1, 2, 2)
    assert meta.column("video_cam_overhead").meta["retimed"] is True
    assert sequences[0].files["depth"] == FileRef("videos/depth/chunk-000/episode_000000.npz")
    assert meta.column("depth").meta["format"] == "npz"


def test_six_digit_chunk_folders_and_sequential_ids(tmp_path):
    path = tmp_path / "ds"
    write_dataset(str(path), SyntheticORTF(sequential_ids=True, lengths=(4, 3, 5), episodes_per_chunk=1, audio=False, annotations=False))
    for chunk in range(3):
        (path / f"data/chunk-{chunk:03d}").rename(path / f"data/chunk-{chunk:06d}")
    meta, refs, sequences = _all(path)
    assert [r.steps_file for r in refs] == [f"data/chunk-{i:06d}/steps.parquet" for i in range(3)]
    assert [s.sequence_id for s in sequences] == ["000000", "000001", "000002"]
    assert "audio" not in {spec.name for spec in meta.columns}


def _copy(exact, tmp_path):
    path = tmp_path / "copy"
    shutil.copytree(exact[0], path)
    return path


def _edit_manifest(path, change):
    manifest = json.loads((path / "meta/manifest.json").read_text())
    change(manifest)
    (path / "meta/manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("change, message", [
    (lambda m: m.pop("frames"), r"manifest.json: required field\(s\) \['frames'\] missing"),
    (lambda m: m.update(ortf_version="0.1"), "ortf_version '0.1' is not supported"),
    (lambda m: m.update(sensors={}), "'sensors' must be a list, found dict"),
    (lambda m: m["action_space"]["dimensions"].pop(), "action holds 7 values, action_space.dimensions defines 6"),
    (lambda m: m["robot"]["joints"].pop(), r"observation.state.joint_positions holds 7 values for the manifest's 6 robot joints"),
    (lambda m: m["observation_space"]["state"].update(ee_position={"dim": 4}), "observation_space.state.ee_position.dim says 4"),
    (lambda m: m["observation_space"]["state"].update(wrench={"dim": 6}),
     "observation_space.state.wrench is declared in the manifest but missing from the steps"),
    (lambda m: m["observation_space"]["images"].update(cam_wrist="nope"), "names sensor 'nope', which is not in sensors"),
])
def test_manifest_violations_are_refused_at_plan(exact, tmp_path, change, message):
    path = _copy(exact, tmp_path)
    _edit_manifest(path, change)
    fs, root = storage.open_root(str(path))
    with pytest.raises(FormatError, match=message):
        ortf.plan(fs, root)


def _edit_episodes(path, change):
    table = pq.read_table(path / "meta/episodes.parquet")
    rows = table.to_pylist()
    change(rows)
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), path / "meta/episodes.parquet")


def test_episode_index_violations(exact, tmp_path):
    path = _copy(exact, tmp_path)
    fs, root = storage.open_root(str(path))

    def wrong_chunk(rows):
        rows[0]["chunk_id"] = 1

    _edit_episodes(path, wrong_chunk)
    meta, refs = ortf.plan(fs, root)
    with pytest.raises(FormatError, match=r"chunk-001/steps.parquet: ep-0000_kitchen_0: episode 'ep-0000/kitchen#0' has no steps in this file"):
        ortf.load(fs, root, refs[0], meta)

    def wrong_start(rows):
        rows[0]["chunk_id"] = 0
        rows[1]["start_step"] += 1
        rows[1]["end_step"] += 1

    _edit_episodes(path, wrong_start)
    meta, refs = ortf.plan(fs, root)
    with pytest.raises(FormatError, match=r"ep-0001_kitchen_0: start_step 13 does not match the episode's rows \(row 12 of the file\)"):
        ortf.load(fs, root, refs[1], meta)

    def wrong_span(rows):
        rows[1]["end_step"] += 3

    _edit_episodes(path, wrong_span)
    with pytest.raises(FormatError, match="ep-0001_kitchen_0: start_step 13 / end_step 25 do not span its length 9"):
        ortf.plan(fs, root)

    def colliding(rows):
        rows[1].update(start_step=12, end_step=21)
        rows[1]["episode_id"] = "ep-0000#kitchen/0"

    _edit_episodes(path, colliding)
    with pytest.raises(ColumnNameError, match="both become sequence id 'ep-0000_kitchen_0'"):
        ortf.plan(fs, root)


def test_missing_files_and_bad_tasks(exact, tmp_path):
    path = _copy(exact, tmp_path)
    fs, root = storage.open_root(str(path))
    (path / "meta/tasks.jsonl").write_text('{"task_id": 0, "instruction": "x"}\nnot json\n')
    with pytest.raises(FormatError, match=r"tasks.jsonl: line 2 is not a task object"):
        ortf.plan(fs, root)
    (path / "meta/tasks.jsonl").unlink()
    shutil.rmtree(path / "data/chunk-002")
    with pytest.raises(FormatError, match=r"data/chunk-002/steps.parquet: not found \(chunk_id 2\)"):
        ortf.plan(fs, root)
    (path / "meta/manifest.json").unlink()
    with pytest.raises(FormatError, match=r"meta/manifest.json: not found \(required by ORTF v0.2\)"):
        ortf.plan(fs, root)


def _rewrite_steps(path, change):
    for steps in sorted(path.glob("data/chunk-*/steps.parquet")):
        pq.write_table(change(pq.read_table(steps)), steps)


def test_spec_legal_variants_from_other_writers(exact, tmp_path):
    """Variants the spec allows that our writer does not produce."""
    path = _copy(exact, tmp_path)

    def as_lists(table):  # pandas-style list<float> vectors, int64 episode ids
        for name in [n for n in table.column_names if pa.types.is_fixed_size_list(table.schema.field(n).type)]:
            flat = table.column(name).combine_chunks()
            table = table.set_column(table.schema.get_field_index(name), name,
                                     pa.ListArray.from_arrays(pa.array(np.arange(len(flat) + 1) * flat.type.list_size, pa.int32()), flat.flatten()))
        ids = pa.array([int(v.split("-")[1].split("/")[0]) for v in table.column("episode_id").to_pylist()], pa.int64())
        return table.set_column(table.schema.get_field_index("episode_id"), "episode_id", ids)

    _rewrite_steps(path, as_lists)
    table = pq.read_table(path / "meta/episodes.parquet")
    ids = pa.array(list(range(table.num_rows)), pa.int64())
    pq.write_table(table.set_column(table.schema.get_field_index("episode_id"), "episode_id", ids).drop_columns(["video_files"]),
                   path / "meta/episodes.parquet")
    _edit_manifest(path, lambda m: m["observation_space"]["images"].pop("depth"))  # as in the spec's example manifest
    meta, refs, sequences = _all(path)
    assert [s.sequence_id for s in sequences] == ["0", "1", "2", "3", "4"]  # integer ids, as stored
    assert meta.column("action").arrow_type == pa.list_(pa.list_(pa.float32(), 7))
    assert sequences[2].trajectories["obs_joint_positions"].tobytes() == exact[1]["episodes"][2]["state"]["joint_positions"].tobytes()
    # depth is still found (frame_index column + default path), with the file's real pixel format
    assert sequences[3].videos["video_depth"].path == "videos/depth/chunk-001/episode_000003.mp4"
    assert meta.column("video_depth").meta["pix_fmt"] == "gray16le" and meta.column("video_depth").meta["codec"] == "ffv1"


def test_annotations_follow_the_episode_not_the_row(exact, tmp_path):
    path = _copy(exact, tmp_path)
    table = pq.read_table(path / "meta/episodes.parquet")
    ids = pa.array([f"{i:06d}" for i in range(table.num_rows)])
    pq.write_table(table.set_column(table.schema.get_field_index("episode_id"), "episode_id", ids).slice(1),  # episode 0 removed
                   path / "meta/episodes.parquet")
    _rewrite_steps(path, lambda t: t.set_column(t.schema.get_field_index("episode_id"), "episode_id",
                                                pa.array([f"{int(v.split('-')[1].split('/')[0]):06d}" for v in t.column("episode_id").to_pylist()])))
    (path / "annotations/episode_000002/sub").mkdir()
    (path / "annotations/episode_000002/sub/extra.jpg").write_bytes(b"\xff\xd8jpeg")
    meta, refs, sequences = _all(path)
    second = sequences[1]  # episode "000002", row 1
    assert second.sequence_id == "000002" and json.loads(second.scalars["scene_objects"]) == exact[1]["episodes"][2]["scene_objects"]
    assert [f.name for f in second.files["annotation_files"]] == ["first_frame.jpg", "sub/extra.jpg"]


def test_steps_schema_drift_between_chunks_is_refused(exact, tmp_path):
    path = _copy(exact, tmp_path)
    steps = path / "data/chunk-001/steps.parquet"
    pq.write_table(pq.read_table(steps).drop_columns(["observation.state.ee_position"]), steps)
    fs, root = storage.open_root(str(path))
    with pytest.raises(FormatError, match=r"chunk-001/steps.parquet: steps schema differs from data/chunk-000/steps.parquet: "
                                          r"columns \['observation.state.ee_position'\] missing"):
        ortf.plan(fs, root)


def test_a_camera_missing_from_some_episodes_is_null_there(exact, tmp_path):
    path = _copy(exact, tmp_path)
    rows = pq.read_table(path / "meta/episodes.parquet").to_pylist()
    rows[1]["video_files"]["cam_overhead"] = None
    pq.write_table(pa.Table.from_pylist(rows), path / "meta/episodes.parquet")
    meta, refs, sequences = _all(path)
    assert "video_cam_overhead" not in sequences[1].videos and "video_cam_overhead" in sequences[0].videos
    assert meta.column("video_cam_overhead").meta["optional"] is True


def test_slower_camera_without_frame_index_is_aligned_by_time(tmp_path):
    path = tmp_path / "ds"
    write_dataset(str(path), SyntheticORTF(lengths=(6,), audio=False, annotations=False, depth_format=None))
    _rewrite_steps(path, lambda t: t.drop_columns(["observation.images.cam_overhead.frame_index"]))
    meta, refs, sequences = _all(path)
    assert sequences[0].videos["video_cam_overhead"].frame_indices == (0, 0, 1, 1, 2, 2)
