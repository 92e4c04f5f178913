"""`python -m pipelines.export --to=lerobot_v3`: LeRobot v3.0 -> Mixtrain -> LeRobot v3.0 gives back
every frame's values bit for bit, the tasks, the episodes and their metadata, and videos whose
frames decode to the source's (read with tests/lerobot_layout.py, an independent reader of
lerobot's layout); other sources export and read back; the command line refuses what it cannot do
in one line and leaves the output as it was."""

from __future__ import annotations

import io
import json
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from formats.read.reader import open_dataset
from formats.sources.lerobot_v3.sample import SyntheticLeRobot, write_dataset
from pipelines import conversion, export
from tests.conftest import MULTI_FILE_SPEC, shared_lerobot
from tests.lerobot_layout import LeRobotV3, LeRobotV21, image_keys, images

ROOT = pathlib.Path(__file__).resolve().parents[2]
VIDEO_FIXTURES = ("so100_tiny", "multi_lerobot061", "stream_lerobot061")


def _convert(source, output, *extra: str) -> None:
    out, console = io.StringIO(), io.StringIO()
    assert conversion.run([f"--input={source}", f"--output={output}", "--progress=off", *extra], out=out, console=console) == 0, \
        console.getvalue()


def _export(source, output, *extra: str, to: str = "lerobot_v3") -> tuple[int, str, str]:
    out, console = io.StringIO(), io.StringIO()
    code = export.run([f"--input={source}", f"--output={output}", f"--to={to}", *extra], out=out, console=console)
    return code, out.getvalue(), console.getvalue()


def _round_trip(source, folder) -> tuple[LeRobotV3, LeRobotV3]:
    _convert(source, folder / "mixtrain")
    code, out, console = _export(folder / "mixtrain", folder / "lerobot")
    assert code == 0 and console == "", console
    assert out.startswith("exported "), out
    return LeRobotV3(source), LeRobotV3(folder / "lerobot")


def _assert_same_lerobot(source: LeRobotV3, exported: LeRobotV3) -> None:
    for key in ("codebase_version", "fps", "robot_type", "total_episodes", "total_frames", "total_tasks", "splits"):
        assert exported.info.get(key) == source.info.get(key), key
    assert exported.info["features"] == source.info["features"]  # dtypes, shapes, names, video info: as the source declared
    assert list(exported.info["features"]) == list(source.info["features"])
    assert exported.tasks == source.tasks
    assert _hf_features(exported) == (_hf_features(source) or _hf_features(exported))  # as lerobot's writer records them
    for episode in range(source.info["total_episodes"]):
        theirs, ours = source.episodes[episode], exported.episodes[episode]
        for key in ("episode_index", "tasks", "length", "dataset_from_index", "dataset_to_index"):
            assert ours[key] == theirs[key], (episode, key)
        expected, got = source.frames(episode), exported.frames(episode)
        assert got.column_names == expected.column_names
        for name in expected.column_names:  # every frame's value, bit for bit, in the source's own type
            assert got.column(name).type == expected.column(name).type, name
            assert got.column(name).equals(expected.column(name)), (episode, name)
        for key in source.video_keys:
            want, have = source.video(episode, key), exported.video(episode, key)
            assert len(want) == len(have) == theirs["length"], (episode, key)
            assert all(np.array_equal(a, b) for a, b in zip(want, have)), (episode, key)


def _hf_features(dataset) -> dict | None:
    """The Hugging Face features in the first data file's schema metadata (lerobot's writer puts
    them there; lerobot 0.3 reads v2.1 image columns by them)."""
    first = dataset.episodes[0]
    path = dataset.info["data_path"].format(chunk_index=first.get("data/chunk_index"), file_index=first.get("data/file_index"),
                                            episode_chunk=0, episode_index=0)
    metadata = pq.read_schema(dataset.root / path).metadata or {}
    return json.loads(metadata[b"huggingface"])["info"]["features"] if b"huggingface" in metadata else None


@pytest.mark.parametrize("name", VIDEO_FIXTURES)
def test_lerobot_fixtures_come_back_exactly(name, tmp_path):
    source, exported = _round_trip(shared_lerobot(name), tmp_path)
    _assert_same_lerobot(source, exported)


def test_many_files_b_frames_multi_task_episodes_and_splits_come_back_exactly(multi_file_dataset, tmp_path):
    """H.264 with B-frames (edit lists), several data and video files, a two-task episode (per-frame
    task_index), per-step bool and float64 features, train/val splits."""
    root, _ = multi_file_dataset
    source, exported = _round_trip(root, tmp_path)
    _assert_same_lerobot(source, exported)
    multi = [entry for entry in exported.episodes if len(entry["tasks"]) > 1]
    assert multi and len(set(exported.frames(multi[0]["episode_index"]).column("task_index").to_pylist())) == 2
    for entry in exported.episodes:  # per-episode statistics: those of the episode's own frames
        for key in ("observation.state", "action", "next.reward"):
            values = np.asarray(exported.frames(entry["episode_index"]).column(key).to_pylist(), np.float64).reshape(entry["length"], -1)
            expected = {"min": values.min(0), "max": values.max(0), "mean": values.mean(0), "std": values.std(0),
                        "q01": np.quantile(values, 0.01, axis=0), "q50": np.quantile(values, 0.5, axis=0),
                        "q99": np.quantile(values, 0.99, axis=0)}
            for name, value in expected.items():
                assert np.allclose(entry[f"stats/{key}/{name}"], value, rtol=1e-12, atol=0), (entry["episode_index"], key, name)
            assert entry[f"stats/{key}/count"] == [entry["length"]]


@pytest.mark.parametrize("to, codec", [("lerobot_v3", "h264"), ("lerobot_v2.1", "h264"), ("lerobot_v3", "ffv1")])
def test_image_features_come_back_as_images(to, codec, tmp_path):
    """lerobot 0.6's image features (PNG RGB, 16-bit TIFF depth), which the conversion encodes to
    video, come back as images in the data files: features as the source declared them, the cells
    struct<bytes, path> named as lerobot names them, depth values bit for bit (the conversion's
    depth encode is lossless), RGB pixels those of the Mixtrain video: the source's own, bit for
    bit, when the conversion encoded them with FFV1 (the default H.264 is lossy)."""
    source = LeRobotV3(shared_lerobot("images_lerobot061"))
    _convert(source.root, tmp_path / "m", f"--video_codec={codec}")
    code, out, console = _export(tmp_path / "m", tmp_path / "l", to=to)
    assert code == 0 and console == "" and out.startswith("exported 4 episodes, 42 frames, 2 cameras as "), console
    exported = (LeRobotV3 if to == "lerobot_v3" else LeRobotV21)(tmp_path / "l")
    assert exported.info["features"] == source.info["features"] and image_keys(source.info) == ["observation.images.front",
                                                                                                  "observation.images.front_depth"]
    assert exported.video_keys == [] and not (tmp_path / "l" / "videos").exists()
    features = _hf_features(exported)  # Image for the image columns: lerobot 0.3 reads them as images by it
    if to == "lerobot_v3":
        assert features == _hf_features(source)
    else:
        assert features["observation.images.front"] == {"_type": "Image"}
        assert features["observation.state"] == {"feature": {"dtype": "float32", "_type": "Value"}, "length": 6, "_type": "Sequence"}
    mixtrain = open_dataset(str(tmp_path / "m"))
    for episode in range(source.info["total_episodes"]):
        theirs, ours = source.frames(episode), exported.frames(episode)
        assert ours.schema.types == theirs.schema.types
        for name in theirs.column_names:
            if name not in image_keys(source.info):
                assert ours.column(name).equals(theirs.column(name)), (episode, name)
        for key, column in (("observation.images.front", "video_front"), ("observation.images.front_depth", "video_front_depth")):
            paths = ours.column(key).combine_chunks().field("path").to_pylist()
            assert paths == theirs.column(key).combine_chunks().field("path").to_pylist()  # frame-000000.png / .tiff
            got = images(ours, key)
            decoded = mixtrain.frames(f"episode_{episode:06d}", column)
            assert len(got) == len(decoded) == theirs.num_rows
            assert all(np.array_equal(a.reshape(b.shape), b) for a, b in zip(got, decoded)), (episode, key)  # the Mixtrain pixels
            if key.endswith("depth") or codec == "ffv1":
                want = images(theirs, key)
                assert all(np.array_equal(a, b) for a, b in zip(got, want)), (episode, key)  # the source's values
                assert got[0].dtype == (np.uint16 if key.endswith("depth") else np.uint8)
    _convert(tmp_path / "l", tmp_path / "again")
    again = open_dataset(str(tmp_path / "again"))
    for sequence_id in mixtrain.sequence_ids():
        assert np.array_equal(again.frames(sequence_id, "video_front_depth"), mixtrain.frames(sequence_id, "video_front_depth"))


def test_the_second_conversion_equals_the_first(tmp_path):
    """Mixtrain -> LeRobot -> Mixtrain: every row, column type and source field the same (the
    source's address aside); every video frame the same."""
    source = tmp_path / "src"
    write_dataset(str(source), MULTI_FILE_SPEC)
    _convert(source, tmp_path / "a")
    assert _export(tmp_path / "a", tmp_path / "l")[0] == 0
    _convert(tmp_path / "l", tmp_path / "b")
    first, second = open_dataset(str(tmp_path / "a")), open_dataset(str(tmp_path / "b"))
    assert first.column_types == second.column_types
    left, right = first.metadata["source"], second.metadata["source"]
    assert {**left, "uri": None} == {**right, "uri": None}
    names = [name for name in first.schema.names if not name.startswith("video_")]
    assert first.scan(names).equals(second.scan(names))
    for sequence_id in first.sequence_ids():
        for column in first.video_columns:
            assert np.array_equal(first.frames(sequence_id, column), second.frames(sequence_id, column)), (sequence_id, column)


def test_two_workers_write_the_bytes_of_one(tmp_path, multi_file_dataset):
    root, _ = multi_file_dataset
    _convert(root, tmp_path / "m", "--num_shards=3")
    assert _export(tmp_path / "m", tmp_path / "one", "--data_file_mb=0.002", "--video_file_mb=0.02")[0] == 0
    assert _export(tmp_path / "m", tmp_path / "two", "--data_file_mb=0.002", "--video_file_mb=0.02", "--direct_num_workers=2")[0] == 0
    one = {p.relative_to(tmp_path / "one"): p.read_bytes() for p in (tmp_path / "one").rglob("*") if p.is_file()}
    two = {p.relative_to(tmp_path / "two"): p.read_bytes() for p in (tmp_path / "two").rglob("*") if p.is_file()}
    assert one == two
    assert len([p for p in one if p.parts[0] == "data"]) > 1  # the size limits rolled files over
    _assert_same_lerobot(LeRobotV3(root), LeRobotV3(tmp_path / "one"))


@pytest.mark.parametrize("source_id", ["lerobot_v2", "ortf", "l5kit", "rlds"])
def test_other_sources_export_and_read_back(source_id, sample_inputs, tmp_path):
    folder, options = sample_inputs[source_id]
    _convert(folder, tmp_path / "m", *options)
    code, out, console = _export(tmp_path / "m", tmp_path / "l")  # L5Kit without cameras: its frame_rate_hz
    assert code == 0 and console == "", console
    dataset, lerobot = open_dataset(str(tmp_path / "m")), LeRobotV3(tmp_path / "l")
    by_source = {entry["source_sequence_id"]: entry["episode_index"] for entry in lerobot.episodes} if source_id != "lerobot_v2" else None
    keys = {feature["column"]: key for key, feature in _feature_columns(dataset, lerobot).items()}
    assert lerobot.info["total_frames"] == sum(dataset.scan(["length"]).column("length").to_pylist())
    for sequence_id in dataset.sequence_ids():
        episode = by_source[sequence_id] if by_source else int(sequence_id.rsplit("_", 1)[1])
        frames = lerobot.frames(episode)
        length = dataset.sequence(sequence_id, ["length"])["length"]
        assert frames.num_rows == length and frames.column("frame_index").to_pylist() == list(range(length))
        for column, values in dataset.trajectories(sequence_id).items():
            if column in keys:
                exported = np.asarray(frames.column(keys[column]).to_pylist(), dtype=values.dtype).reshape(values.shape)
                assert np.array_equal(exported, values, equal_nan=True), (sequence_id, column)
        for key in lerobot.video_keys:
            assert len(lerobot.video(episode, key)) == length
    left = [entry for entry in dataset.column_types if dataset.column_types[entry]["type"] not in ("trajectory", "steps", "video",
                                                                                                     "timestamps")]
    said = [line for line in out.splitlines() if line.startswith("left out: ")]
    assert [line.split()[2] for line in said] == left
    assert [item.split()[0] for item in lerobot.info.get("mixtrain_export", {}).get("left_out", [])] == left


def _feature_columns(dataset, lerobot: LeRobotV3) -> dict:
    """LeRobot key -> {"column": the Mixtrain column} for the exported numeric features."""
    from formats.exports.lerobot import plan_export

    plan = plan_export(dataset)
    return {feature.key: {"column": feature.column} for feature in plan.frame_features
            if feature.dtype not in ("string",) and feature.key in lerobot.info["features"] and feature.column in dataset.schema.names
            and dataset.kind(feature.column) == "trajectory"}


def test_an_episode_of_one_frame(tmp_path):
    source = tmp_path / "src"
    write_dataset(str(source), SyntheticLeRobot(lengths=(1, 4, 1), episodes_per_video_file=2))
    original, exported = _round_trip(source, tmp_path)
    _assert_same_lerobot(original, exported)


# --- LeRobot v2.1 -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def v21_dataset(tmp_path_factory):
    """A v2.1 dataset as lerobot 0.3 writes it: H.264 cameras, a two-task episode, per-step extras."""
    from formats.sources.lerobot_v2.sample import write_dataset as write_v21

    root = tmp_path_factory.mktemp("v21") / "src"
    write_v21(str(root), SyntheticLeRobot(codec="h264", gop=2, lengths=(20, 15, 9, 1), multi_task_episodes=(1,), extra_step_features=True))
    return root


def test_lerobot_v21_comes_back_exactly(v21_dataset, tmp_path):
    """v2.1 -> Mixtrain -> v2.1: info.json, episodes.jsonl and tasks.jsonl as they were, every data
    file's columns equal in their own types, every MP4 the source's samples (packets) and frames."""
    _convert(v21_dataset, tmp_path / "m")
    code, out, console = _export(tmp_path / "m", tmp_path / "out", to="lerobot_v2.1")
    assert code == 0 and console == "" and out.startswith("exported 4 episodes, 45 frames, 2 cameras as lerobot_v2.1 "), (out, console)
    source, exported = LeRobotV21(v21_dataset), LeRobotV21(tmp_path / "out")
    assert exported.info == source.info
    assert (tmp_path / "out/meta/episodes.jsonl").read_text() == (v21_dataset / "meta/episodes.jsonl").read_text()
    assert (tmp_path / "out/meta/tasks.jsonl").read_text() == (v21_dataset / "meta/tasks.jsonl").read_text()
    for entry in source.episodes:
        episode = entry["episode_index"]
        expected, got = source.frames(episode), exported.frames(episode)
        assert got.column_names == expected.column_names
        for name in expected.column_names:
            assert got.column(name).type == expected.column(name).type and got.column(name).equals(expected.column(name)), (episode, name)
        for key in source.video_keys:
            assert _packets(exported.video_path(episode, key)) == _packets(source.video_path(episode, key))
            want, have = source.video(episode, key), exported.video(episode, key)
            assert len(want) == len(have) == entry["length"] and all(np.array_equal(a, b) for a, b in zip(want, have)), (episode, key)
        for key in ("observation.state", "action"):  # the statistics lerobot 0.3 keeps per episode, of the episode's frames
            for name in ("min", "max", "mean", "std", "count"):
                assert np.allclose(exported.stats[episode][key][name], source.stats[episode][key][name], rtol=1e-6), (episode, key, name)


def _packets(path) -> list[bytes]:
    import av

    with av.open(str(path)) as container:
        return [bytes(packet) for packet in container.demux(video=0) if packet.size]


@pytest.mark.parametrize("name", VIDEO_FIXTURES)
def test_lerobot_v3_fixtures_export_to_v21_frame_for_frame(name, tmp_path):
    """v3.0 -> Mixtrain -> v2.1 (for trainers pinned to v2.1): the same features, tasks, episodes,
    every frame's values and every decoded video frame, one file per episode."""
    _convert(shared_lerobot(name), tmp_path / "m")
    assert _export(tmp_path / "m", tmp_path / "out", to="lerobot_v2.1")[0] == 0
    source, exported = LeRobotV3(shared_lerobot(name)), LeRobotV21(tmp_path / "out")
    assert exported.info["codebase_version"] == "v2.1" and exported.info["features"] == source.info["features"]
    assert exported.tasks == source.tasks and exported.info["total_frames"] == source.info["total_frames"]
    for entry in source.episodes:
        episode = entry["episode_index"]
        assert exported.episodes[episode]["tasks"] == entry["tasks"] and exported.episodes[episode]["length"] == entry["length"]
        expected, got = source.frames(episode), exported.frames(episode)
        for column in expected.column_names:
            assert got.column(column).equals(expected.column(column)), (episode, column)
        for key in source.video_keys:
            want, have = source.video(episode, key), exported.video(episode, key)
            assert len(want) == len(have) == entry["length"] and all(np.array_equal(a, b) for a, b in zip(want, have)), (episode, key)


# --- the command line -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("export_cli")
    source = folder / "src"
    write_dataset(str(source), SyntheticLeRobot(lengths=(6, 5)))
    _convert(source, folder / "m")
    return folder / "m"


def test_an_existing_output_is_refused_and_left_as_it_was(converted, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    code, out, console = _export(converted, tmp_path / "out")
    assert (code, out) == (1, "")
    assert console == f"error: {tmp_path / 'out'}: exists and is not empty; pass --overwrite to replace it\n"
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["keep.txt"]
    assert _export(converted, tmp_path / "out", "--overwrite")[0] == 0
    assert not (tmp_path / "out" / "keep.txt").exists() and (tmp_path / "out" / "meta" / "info.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging folder left beside it


def test_the_output_cannot_be_the_input_or_inside_it(converted):
    for output in (converted, converted / "lerobot"):
        code, _, console = _export(converted, output)
        assert code == 1 and console == f"error: {output}: the output must not be the input, inside it, or hold it\n"


def test_a_missing_input_is_one_line(tmp_path):
    code, _, console = _export(tmp_path / "nothing", tmp_path / "out")
    assert code == 1 and console.startswith("error: ") and console.count("\n") == 1 and "mixtrain.json" in console
    assert not (tmp_path / "out").exists()


def test_a_frame_rate_for_a_dataset_that_records_one_is_refused(converted, tmp_path):
    for given in ("25", "30"):  # another rate, or the same one (no effect): refused either way
        code, _, console = _export(converted, tmp_path / "out", f"--fps={given}")
        assert code == 1 and console.endswith(f"records 30 frames a second; --fps={given} is for a dataset that records none\n"), console
        assert not (tmp_path / "out").exists()


def test_unknown_options_and_formats_are_refused_by_the_command(converted, tmp_path):
    for argv, expected in (([f"--input={converted}", f"--output={tmp_path / 'o'}", "--to=lerobot_v2.0"],
                            "error: argument --to: invalid choice: 'lerobot_v2.0' (choose from lerobot_v3, lerobot_v2.1) (see --help)\n"),
                           ([f"--input={converted}", f"--output={tmp_path / 'o'}", "--to=lerobot_v3", "--bogus=1"],
                            "error: unrecognized arguments: --bogus=1 (see --help)\n")):
        done = subprocess.run([sys.executable, "-m", "pipelines.export", *argv], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert (done.returncode, done.stdout, done.stderr.replace("'", "").replace("lerobot_v2.0 (", "'lerobot_v2.0' (")) == (2, "", expected)
    done = subprocess.run([sys.executable, "-m", "pipelines.export", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    for option in ("--input", "--output", "--to", "--overwrite", "--fresh", "--data_file_mb", "--video_file_mb", "--fps",
                   "--direct_num_workers", "--runner", "--dask_client_address"):
        assert option in done.stdout


# --- what a received dataset may claim ---------------------------------------------------------


def _copy(converted, tmp_path):
    target = tmp_path / "m"
    shutil.copytree(converted, target)
    return target


def test_a_name_lerobot_cannot_hold_is_refused(converted, tmp_path):
    target = _copy(converted, tmp_path)
    sidecar = json.loads((target / "mixtrain.json").read_text())
    sidecar["column_types"]["action"]["source"] = "../action"
    (target / "mixtrain.json").write_text(json.dumps(sidecar))
    code, _, console = _export(target, tmp_path / "out")
    assert code == 1 and console == (f"error: {target / 'mixtrain.json'}: column 'action': '../action' is not a name LeRobot can hold "
                                     "(letters, digits, '_', '.', '-' only, not starting with '.', none of timestamp, frame_index, "
                                     "episode_index, index, task_index)\n")
    assert not (tmp_path / "out").exists()
    sidecar["column_types"]["action"]["source"] = ".."  # a key that would be a path segment of its own
    (target / "mixtrain.json").write_text(json.dumps(sidecar))
    assert "'..' is not a name LeRobot can hold" in _export(target, tmp_path / "out")[2]


def _edit_sidecar(converted, tmp_path, change) -> pathlib.Path:
    target = _copy(converted, tmp_path)
    sidecar = json.loads((target / "mixtrain.json").read_text())
    change(sidecar)
    (target / "mixtrain.json").write_text(json.dumps(sidecar))
    return target


@pytest.mark.parametrize("value, said", [(-5, "-5"), (float("nan"), "nan"), ("abc", "'abc'"), (True, "True")])
def test_a_frame_rate_that_is_not_one_is_refused(converted, tmp_path, value, said):
    target = _edit_sidecar(converted, tmp_path, lambda sidecar: sidecar["source"].update(fps=value))
    code, _, console = _export(target, tmp_path / "out")
    assert code == 1 and console == f"error: {target / 'mixtrain.json'}: source.fps {said} is not a frame rate\n"


def test_a_dtype_or_shape_the_data_does_not_have_is_refused(converted, tmp_path):
    target = _edit_sidecar(converted, tmp_path, lambda sidecar: sidecar["source"]["features"]["action"].update(dtype="int64"))
    code, _, console = _export(target, tmp_path / "out")
    assert code == 1 and console == (f"error: {target / 'mixtrain.json'}: column 'action': source.features says action is 'int64', "
                                     "the data holds float32\n")
    shutil.rmtree(target)
    target = _edit_sidecar(converted, tmp_path, lambda sidecar: sidecar["source"]["features"]["observation.state"].update(shape=[5]))
    code, _, console = _export(target, tmp_path / "out")
    assert code == 1 and console == f"error: {target / 'mixtrain.json'}: column 'obs_state': shape [5] recorded for 6 values a step\n"


def test_a_task_table_holding_one_text_twice_is_refused(converted, tmp_path):
    target = _edit_sidecar(converted, tmp_path, lambda sidecar: sidecar["source"].update(
        tasks={"0": "Pick up the cube.", "1": "Pick up the cube.", "2": "Open the drawer."}))
    code, _, console = _export(target, tmp_path / "out")
    assert code == 1 and console == f"error: {target / 'mixtrain.json'}: source.tasks holds one text under two indices\n"


def test_an_export_converted_back_exports_again_with_its_source_ids(sample_inputs, tmp_path):
    folder, options = sample_inputs["rlds"]
    _convert(folder, tmp_path / "m", *options)
    assert _export(tmp_path / "m", tmp_path / "l")[0] == 0
    _convert(tmp_path / "l", tmp_path / "m2")
    assert _export(tmp_path / "m2", tmp_path / "l2")[0] == 0
    first, second = LeRobotV3(tmp_path / "l"), LeRobotV3(tmp_path / "l2")
    assert [entry["source_sequence_id"] for entry in second.episodes] == [entry["source_sequence_id"] for entry in first.episodes]
    assert second.info["features"] == first.info["features"]


def test_tasks_the_task_table_does_not_hold_are_refused(converted, tmp_path):
    target = _edit_sidecar(converted, tmp_path, lambda sidecar: sidecar["source"].update(tasks={"0": "something else"}))
    code, _, console = _export(target, tmp_path / "out")
    assert code == 1 and "is not in the source's task table" in console and console.count("\n") == 1, console


def test_a_camera_at_another_rate_is_refused(converted, tmp_path):
    target = _copy(converted, tmp_path)
    sidecar = json.loads((target / "mixtrain.json").read_text())
    sidecar["column_types"]["video_wrist"]["fps"] = 15
    (target / "mixtrain.json").write_text(json.dumps(sidecar))
    code, _, console = _export(target, tmp_path / "out")
    assert code == 1 and console == (f"error: {target / 'mixtrain.json'}: camera video_wrist runs at 15 frames a second, the dataset "
                                     "at 30: LeRobot shows every camera at the dataset's rate\n")


@pytest.mark.parametrize("table_format", ["iceberg", "delta"])
def test_a_lake_table_exports_as_the_standalone_dataset_does(converted, tmp_path, table_format):
    source = converted.parent / "src"
    _convert(source, tmp_path / "lake", f"--table_format={table_format}")
    assert _export(tmp_path / "lake", tmp_path / "from_lake")[0] == 0
    assert _export(converted, tmp_path / "from_standalone")[0] == 0
    lake = {p.relative_to(tmp_path / "from_lake"): p.read_bytes() for p in (tmp_path / "from_lake").rglob("*") if p.is_file()}
    standalone = {p.relative_to(tmp_path / "from_standalone"): p.read_bytes() for p in (tmp_path / "from_standalone").rglob("*")
                  if p.is_file()}
    assert lake == standalone


@pytest.mark.parametrize("to", ["lerobot_v3", "lerobot_v2.1"])
def test_a_lance_dataset_exports_as_the_standalone_dataset_does(converted, tmp_path, to):
    """Videos stored as blobs inside the Lance table are read from it (and their sizes, which roll
    video files over, from its blob descriptors): the bytes of the standalone dataset's export."""
    _convert(converted.parent / "src", tmp_path / "lance", "--table_format=lance")
    extra = ("--video_file_mb=0.000001",) if to == "lerobot_v3" else ()  # each episode past the size: a file each
    code, out, console = _export(tmp_path / "lance", tmp_path / "from_lance", *extra, to=to)
    assert code == 0 and console == "", console
    assert _export(converted, tmp_path / "from_standalone", *extra, to=to)[0] == 0
    lance = {p.relative_to(tmp_path / "from_lance"): p.read_bytes() for p in (tmp_path / "from_lance").rglob("*") if p.is_file()}
    standalone = {p.relative_to(tmp_path / "from_standalone"): p.read_bytes() for p in (tmp_path / "from_standalone").rglob("*")
                  if p.is_file()}
    assert lance == standalone and any(path.suffix == ".mp4" for path in lance)
    if to == "lerobot_v3":
        assert len([path for path in lance if path.parts[0] == "videos"]) > 2  # the blob sizes rolled the video files over


def _rewrite_shard(target, change) -> None:
    shard = next((target / "data").glob("*.parquet"))
    table = pq.read_table(shard)
    pq.write_table(change(table), shard)


def test_a_length_the_steps_do_not_have_is_refused_naming_the_sequence(converted, tmp_path):
    target = _copy(converted, tmp_path)
    _rewrite_shard(target, lambda table: table.set_column(table.column_names.index("length"), "length",
                                                          pa.array([length + 1 for length in table.column("length").to_pylist()],
                                                                   pa.int64())))
    code, _, console = _export(target, tmp_path / "out")
    # the videos are counted first: before any frame is built for a length nothing holds
    assert code == 1 and console == (f"error: file://{target}: sequence episode_000000: files/video_front/episode_000000.mp4 holds 6 "
                                     "frames for 7 timesteps\n")
    assert not (tmp_path / "out").exists()
    _rewrite_shard(target, lambda table: table.set_column(table.column_names.index("length"), "length",
                                                          pa.array([10**10] * table.num_rows, pa.int64())))
    code, _, console = _export(target, tmp_path / "out")
    assert code == 1 and console.endswith(": sequence episode_000000: length 10000000000 is past 1000000000 frames\n"), console
    assert [p.name for p in tmp_path.iterdir()] == ["m"]


def test_an_episode_column_named_like_lerobots_own_is_refused(converted, tmp_path):
    target = _copy(converted, tmp_path)
    _rewrite_shard(target, lambda table: table.append_column("dataset_from_index", pa.array([100] * table.num_rows, pa.int64())))
    code, _, console = _export(target, tmp_path / "out")
    assert code == 1 and console.endswith("column 'dataset_from_index' would overwrite LeRobot's own episodes column of that name\n")


def test_a_per_step_task_index_outside_the_tasks_is_refused(multi_file_dataset, tmp_path):
    root, _ = multi_file_dataset
    _convert(root, tmp_path / "m")
    _rewrite_shard(tmp_path / "m", lambda table: table.set_column(
        table.column_names.index("task_index"), "task_index",
        pa.array([None if steps is None else [-1] * len(steps) for steps in table.column("task_index").to_pylist()],
                 table.schema.field("task_index").type)))
    code, _, console = _export(tmp_path / "m", tmp_path / "out")
    assert code == 1 and console.endswith(": task_index points outside the row's tasks\n") and "sequence episode_" in console, console


def test_the_first_episodes_of_a_dataset_keep_its_splits_cut_to_them(multi_file_dataset, tmp_path):
    root, _ = multi_file_dataset
    _convert(root, tmp_path / "m", "--limit=6")
    assert _export(tmp_path / "m", tmp_path / "out")[0] == 0
    info = json.loads((tmp_path / "out/meta/info.json").read_text())
    assert info["total_episodes"] == 6 and info["splits"] == {"train": "0:5", "val": "5:6"}


def test_the_tasks_table_has_the_text_as_its_pandas_index(converted, tmp_path):
    """lerobot reads an item's task text as tasks.iloc[task_index].name: the text must be the index."""
    import pandas

    assert _export(converted, tmp_path / "out")[0] == 0
    tasks = pandas.read_parquet(tmp_path / "out/meta/tasks.parquet")
    assert tasks.index.name == "task" and list(tasks.columns) == ["task_index"]
    assert [tasks.iloc[i].name for i in tasks["task_index"]] == list(LeRobotV3(tmp_path / "out").tasks.values())


def test_a_video_url_or_a_damaged_video_is_refused_not_copied(converted, tmp_path):
    for cell in ("file:///etc/hostname", "http://example.com/x.mp4"):
        target = _copy(converted, tmp_path)
        _rewrite_shard(target, lambda table, cell=cell: table.set_column(table.column_names.index("video_front"), "video_front",
                                                                          pa.array([cell] * table.num_rows, pa.string())))
        code, _, console = _export(target, tmp_path / "out")
        assert code == 1 and console.endswith(f"video_front names {cell!r}: the export copies only video files inside the dataset\n")
        shutil.rmtree(target)
    target = _copy(converted, tmp_path)
    video = next((target / "files" / "video_front").glob("*.mp4"))
    video.write_bytes(video.read_bytes()[:-200])  # its last samples cut off
    code, _, console = _export(target, tmp_path / "out")
    assert code == 1 and console.startswith("error: ") and console.count("\n") == 1 and not (tmp_path / "out").exists(), console


def test_a_video_path_outside_the_dataset_is_refused(converted, tmp_path):
    target = _copy(converted, tmp_path)
    _rewrite_shard(target, lambda table: table.set_column(table.column_names.index("video_front"), "video_front",
                                                          pa.array(["../../../etc/passwd"] * table.num_rows, pa.string())))
    code, _, console = _export(target, tmp_path / "out")
    assert code == 1 and console.startswith("error: ") and "../../../etc/passwd" in console and console.count("\n") == 1, console
    assert not (tmp_path / "out").exists()


def test_gray_image_features_that_are_not_depth_come_back_as_gray_images(tmp_path):
    """A 16-bit gray image feature that is not a depth map (an infrared camera, PNG): gray frames,
    written back as 16-bit PNG (depth alone is TIFF), every value the source's (FFV1 keeps 16 bits)."""
    source = tmp_path / "src"
    write_dataset(str(source), SyntheticLeRobot(lengths=(10, 12), cameras=(), image_cameras=("observation.images.ir",),
                                                image_format="png16"))
    _convert(source, tmp_path / "m")
    code, out, console = _export(tmp_path / "m", tmp_path / "l")
    assert code == 0 and console == "", console
    theirs, ours = LeRobotV3(source), LeRobotV3(tmp_path / "l")
    assert ours.info["features"]["observation.images.ir"] == theirs.info["features"]["observation.images.ir"]
    for episode in range(2):
        got, want = images(ours.frames(episode), "observation.images.ir"), images(theirs.frames(episode), "observation.images.ir")
        assert len(got) == len(want) == (10, 12)[episode]
        assert all(a.dtype == np.uint16 and np.array_equal(a, b) for a, b in zip(got, want)), episode
        paths = ours.frames(episode).column("observation.images.ir").combine_chunks().field("path").to_pylist()
        assert paths == [f"frame-{i:06d}.png" for i in range(len(got))]


@pytest.mark.parametrize("to", ["lerobot_v3", "lerobot_v2.1"])
def test_a_dataset_of_no_episode_gives_meta_with_typed_empty_tables(to, tmp_path):
    from formats.exports import lerobot

    index = [lerobot.Feature(key, key, dtype, (1,)) for key, dtype in zip(lerobot.INDEX_FEATURES, ("float32", "int64", "int64", "int64",
                                                                                                  "int64"))]
    camera = lerobot.Feature("video_front", "observation.images.front", "video", (48, 64, 3), ["height", "width", "channels"])
    plan = lerobot.ExportPlan(fps=30, robot_type=None, features=[camera, *index], tasks=[], episodes=[], groups=0, columns=[],
                              episode_columns=["operator"], splits=None, left_out=[])
    import fsspec

    info = lerobot.Writer(plan, {}, to).write_meta([], fsspec.filesystem("file"), str(tmp_path))
    assert (info["total_episodes"], info["total_frames"]) == (0, 0)
    if to == "lerobot_v3":
        table = pq.read_table(tmp_path / "meta/episodes/chunk-000/file-000.parquet")
        assert table.num_rows == 0 and table.schema.field("tasks").type == pa.list_(pa.string())
        assert table.schema.field("videos/observation.images.front/from_timestamp").type == pa.float64()
    else:
        assert (tmp_path / "meta/episodes.jsonl").read_text() == "" and (tmp_path / "meta/episodes_stats.jsonl").read_text() == ""
