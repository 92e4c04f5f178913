"""RLDS: the real bridge fixture, datasets written with TFDS' own serializer, TFRecord framing, bad input."""

import io
import json
import pathlib
import shutil

import numpy as np
import pytest

from formats import storage
from formats.errors import FormatError
from formats.sequence import ImageFrames
from formats.sources import rlds
from formats.sources.rlds import records as rlds_records
from formats.sources.rlds import tfrecord
from formats.sources.rlds.sample import SyntheticRLDS, write_dataset

BRIDGE = pathlib.Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "rlds" / "bridge_dataset" / "1.0.0"


@pytest.fixture(scope="module")
def bridge():
    if not BRIDGE.is_dir():
        pytest.skip(f"real fixture not found at {BRIDGE} (../shared/fixtures is absent in a plain clone)")
    return BRIDGE


def _all(path, **options):
    fs, root = storage.open_root(str(path))
    meta, shards = rlds.plan(fs, root, options)
    records = [record for shard in shards for record in rlds.expand_ref(fs, root, shard, meta)]
    return meta, shards, records, [rlds.load(fs, root, record, meta) for record in records]


def _examples(path):
    """Every record of every shard parsed straight from the protobuf: an independent reference."""
    from tensorflow_datasets.proto import tf_example_pb2

    out = {}
    for shard in sorted(path.glob("*.tfrecord-*")):
        data = shard.read_bytes()
        position, index = 0, 0
        while position < len(data):
            length = int.from_bytes(data[position:position + 8], "little")
            example = tf_example_pb2.Example()
            example.ParseFromString(data[position + 12: position + 12 + length])
            out[(shard.name, index)] = example.features.feature
            position += 16 + length
            index += 1
    return out


def test_bridge_every_episode_one_sequence_with_exact_values(bridge):
    meta, shards, records, sequences = _all(bridge)
    assert [(s.split, s.position, s.records) for s in shards] == [("train", 0, 25), ("val", 0, 25)]
    assert [r.sequence_id for r in records][:2] == ["train_00000_000000", "train_00000_000001"]
    assert len(sequences) == 50 and {s.length for s in sequences} == {10}
    assert meta.fps == 5.0  # bridge's control rate, from the known-rates table
    reference = _examples(bridge)
    for record, sequence in zip(records, sequences):
        feature = reference[(record.path, record.index)]
        for column, key, dim in (("action", "steps/action", 7), ("obs_state", "steps/observation/state", 7),
                                 ("language_embedding", "steps/language_embedding", 512)):
            want = np.array(feature[key].float_list.value, np.float32).reshape(-1, dim)
            assert sequence.trajectories[column].dtype == np.float32
            assert sequence.trajectories[column].tobytes() == want.tobytes()
        assert sequence.steps["reward"].tolist() == list(feature["steps/reward"].float_list.value)
        assert sequence.steps["is_first"].tolist() == [bool(v) for v in feature["steps/is_first"].int64_list.value]
        texts = [v.decode() for v in feature["steps/language_instruction"].bytes_list.value]
        assert sequence.scalars["task"] == texts[0] and sequence.steps["language_instruction"] is None
        assert sequence.scalars["truncated"] is True  # bridge's is_last is never true
        assert sequence.scalars["episode_id"] == feature["episode_metadata/episode_id"].int64_list.value[0]
        assert sequence.scalars["file_path"] == feature["episode_metadata/file_path"].bytes_list.value[0].decode()
        for camera in range(4):
            images = sequence.videos[f"video_image_{camera}"]
            assert isinstance(images, ImageFrames)
            assert images.frames == list(feature[f"steps/observation/image_{camera}"].bytes_list.value)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    path = tmp_path_factory.mktemp("rlds") / "synthetic_rlds" / "1.0.0"
    spec = SyntheticRLDS(depth_camera=True, template="{SPLIT}/{DATASET}.{FILEFORMAT}@{SHARD_INDEX}.of.{NUM_SHARDS}")
    return path, write_dataset(str(path), spec), spec


def test_written_dataset_round_trips_every_value(written):
    path, truth, spec = written
    meta, shards, records, sequences = _all(path, fps=10)
    assert [s.path for s in shards][:2] == ["train/synthetic_rlds.tfrecord@00000.of.00003", "train/synthetic_rlds.tfrecord@00001.of.00003"]
    by_split = {"train": [], "val": []}
    for record, sequence in zip(records, sequences):
        by_split[record.split].append(sequence)
    for split, sequences in by_split.items():
        assert [s.length for s in sequences] == list(spec.splits[split])
        for number, (sequence, values) in enumerate(zip(sequences, truth[split])):
            assert sequence.trajectories["obs_state"].dtype == np.float64  # float64 kept float64
            assert sequence.trajectories["obs_state"].tobytes() == values["state"].tobytes()
            for column, key in (("action_world_vector", "world_vector"), ("action_rotation_delta", "rotation_delta"),
                                ("action_gripper_closedness_action", "gripper_closedness_action")):
                assert sequence.trajectories[column].tobytes() == values[key].tobytes()
            assert sequence.trajectories["joint_torques"].tobytes() == values["joint_torques"].reshape(-1, 6).tobytes()  # zlib
            assert sequence.steps["reward"].dtype == np.float64 and sequence.steps["reward"].tolist() == values["reward"].tolist()
            assert sequence.steps["obs_gripper"].tobytes() == values["gripper"].tobytes()
            assert sequence.steps["is_last"].tolist() == values["is_last"].tolist()
            assert sequence.steps["is_terminal"].tolist() == values["is_terminal"].tolist()
            # RLDS: an episode is truncated unless it ends on a terminal step (is_last never set, or not is_terminal).
            assert sequence.scalars["truncated"] == (number not in spec.terminal_episodes)
            assert sequence.scalars["success"] == (number in spec.terminal_episodes)
            if number in spec.varying_instruction_episodes:
                assert sequence.scalars["task"] is None
                assert sequence.steps["language_instruction"].to_pylist() == values["instructions"]
            else:
                assert sequence.scalars["task"] == values["instructions"][0]
            assert len(sequence.videos["video_image"]) == len(sequence.videos["video_wrist_image"]) == sequence.length
    types = {spec.name: spec for spec in meta.columns}
    assert types["video_depth"].meta["is_depth_map"] and types["video_depth"].meta["pix_fmt"] == "gray16le"
    assert types["joint_torques"].meta["shape"] == [2, 3]
    assert types["obs_state"].meta["description"] == "joint angles"


def test_splits_option_and_known_or_required_fps(written):
    path, _, _ = written
    fs, root = storage.open_root(str(path))
    meta, shards = rlds.plan(fs, root, {"fps": 10, "splits": ["val"]})
    assert {s.split for s in shards} == {"val"}
    with pytest.raises(FormatError, match=r"split\(s\) \['test'\] not in the dataset \(it has \['train', 'val'\]\)"):
        rlds.plan(fs, root, {"fps": 10, "splits": ["test"]})
    with pytest.raises(FormatError, match="'synthetic_rlds': RLDS does not record a frame rate .* pass --fps=<Hz>"):
        rlds.plan(fs, root, {})


def test_bgr_cameras_are_swapped(written):
    path, truth, _ = written
    fs, root = storage.open_root(str(path))
    meta, shards = rlds.plan(fs, root, {"fps": 10, "bgr_cameras": ["video_image"]})
    record = next(rlds.expand_ref(fs, root, shards[0], meta))
    frames = rlds.load(fs, root, record, meta).videos["video_image"].frames
    assert np.array_equal(frames[0], truth["train"][0]["frames"][0][..., ::-1])  # PNG: exact
    assert meta.column("video_image").meta["channel_order"] == "bgr (swapped to rgb)"


def test_tfrecord_framing_round_trip_and_checksums():
    buffer = io.BytesIO()
    assert tfrecord.write_records(buffer, [b"alpha", b"", b"x" * 1000]) == 3
    data = buffer.getvalue()
    spans = list(tfrecord.scan(io.BytesIO(data), len(data)))
    assert [tfrecord.read_record(io.BytesIO(data), o, n) for o, n in spans] == [b"alpha", b"", b"x" * 1000]
    corrupt = bytearray(data)
    corrupt[spans[2][0] + 10] ^= 0xFF
    with pytest.raises(FormatError, match=r"record at byte \d+: data checksum mismatch"):
        tfrecord.read_record(io.BytesIO(bytes(corrupt)), *spans[2])
    with pytest.raises(FormatError, match=r"record 2: truncated: needs bytes up to 1053, file ends at 1040"):
        list(tfrecord.scan(io.BytesIO(data[:1040]), 1040))
    bad_length = bytearray(data)
    bad_length[0] ^= 0x01
    with pytest.raises(FormatError, match="record 0: length checksum mismatch at byte 0"):
        list(tfrecord.scan(io.BytesIO(bytes(bad_length)), len(data)))


def _copy(written, tmp_path):
    path = tmp_path / "copy" / "1.0.0"
    shutil.copytree(written[0], path)
    return path


def test_corrupt_record_names_file_and_sequence(written, tmp_path):
    path = _copy(written, tmp_path)
    shard = path / "val/synthetic_rlds.tfrecord@00000.of.00001"
    data = bytearray(shard.read_bytes())
    data[200] ^= 0xFF
    shard.write_bytes(bytes(data))
    fs, root = storage.open_root(str(path))
    meta, shards = rlds.plan(fs, root, {"fps": 10, "splits": ["val"]})
    record = next(rlds.expand_ref(fs, root, shards[0], meta))
    with pytest.raises(FormatError, match=r"val/synthetic_rlds.tfrecord@00000.of.00001: val_00000_000000: record at byte 12: data checksum mismatch"):
        rlds.load(fs, root, record, meta)


def test_shard_problems_found_when_indexing(written, tmp_path):
    path = _copy(written, tmp_path)
    info = json.loads((path / "dataset_info.json").read_text())
    info["splits"][1]["shardLengths"] = ["5"]
    (path / "dataset_info.json").write_text(json.dumps(info))
    fs, root = storage.open_root(str(path))
    meta, shards = rlds.plan(fs, root, {"fps": 10, "splits": ["val"]})
    with pytest.raises(FormatError, match=r"@00000.of.00001: 2 records, dataset_info.json shardLengths says 5"):
        list(rlds.expand_ref(fs, root, shards[0], meta))
    shard = path / "val/synthetic_rlds.tfrecord@00000.of.00001"
    shard.write_bytes(shard.read_bytes()[:-7])
    with pytest.raises(FormatError, match=r"@00000.of.00001: val shard 0: record 1: truncated"):
        list(rlds.expand_ref(fs, root, shards[0], meta))
    shard.unlink()
    with pytest.raises(FormatError, match=r"@00000.of.00001: shard 0 of split 'val' not found \(from filepathTemplate"):
        rlds.plan(fs, root, {"fps": 10})


@pytest.mark.parametrize("change, message", [
    (lambda f: f["featuresDict"]["features"].pop("steps"), "no 'steps' Dataset feature: not an RLDS dataset"),
    (lambda f: f["featuresDict"]["features"]["steps"]["sequence"]["feature"]["featuresDict"]["features"]["action"]
     ["featuresDict"]["features"]["world_vector"]["tensor"]["shape"].update(dimensions=["-1"]),
     r"steps/action/world_vector has shape \[None\] with unknown dimensions \(ragged per step\)"),
])
def test_unsupported_features_are_refused_at_plan(written, tmp_path, change, message):
    path = _copy(written, tmp_path)
    features = json.loads((path / "features.json").read_text())
    change(features)
    (path / "features.json").write_text(json.dumps(features))
    fs, root = storage.open_root(str(path))
    with pytest.raises(FormatError, match=message):
        rlds.plan(fs, root, {"fps": 10})


def test_malformed_metadata(written, tmp_path):
    path = _copy(written, tmp_path)
    fs, root = storage.open_root(str(path))
    (path / "dataset_info.json").write_text("{")
    with pytest.raises(FormatError, match=r"dataset_info.json: malformed JSON"):
        rlds.plan(fs, root, {"fps": 10})
    (path / "dataset_info.json").write_text(json.dumps({"name": "x", "fileFormat": "riegeli", "splits": []}))
    with pytest.raises(FormatError, match=r"fileFormat 'riegeli' is not supported \(only tfrecord and array_record\)$"):
        rlds.plan(fs, root, {"fps": 10})


def _custom(tmp_path, features, steps_of, metadata=None, name="custom_rlds"):
    """A one-split dataset of two episodes with the given TFDS features."""
    from formats.sources.rlds.sample import write_episodes

    path = tmp_path / name / "1.0.0"
    episodes = [{"steps": steps_of(number), **({"episode_metadata": metadata(number)} if metadata else {})} for number in range(2)]
    write_episodes(str(path), name, features, {"train": episodes})
    return _all(path, fps=3)


def test_string_tensor_instruction_inside_observation_becomes_task(tmp_path):
    import tensorflow_datasets.core.features as tff

    features = tff.FeaturesDict({"steps": tff.Dataset({
        "observation": {"natural_language_instruction": tff.Tensor(shape=(), dtype=np.str_), "base_pose": tff.Tensor(shape=(3,), dtype=np.float32)},
        "action": {"world_vector": tff.Tensor(shape=(3,), dtype=np.float32)},
        "is_last": tff.Scalar(dtype=np.bool_), "is_terminal": tff.Scalar(dtype=np.bool_)})})
    meta, _, _, sequences = _custom(tmp_path, features, lambda n: [
        {"observation": {"natural_language_instruction": f"pick {n}", "base_pose": np.ones(3, np.float32) * i},
         "action": {"world_vector": np.zeros(3, np.float32)}, "is_last": i == 2, "is_terminal": i == 2} for i in range(3)])
    assert meta.column("task").meta["source"] == "observation/natural_language_instruction"
    assert [s.scalars["task"] for s in sequences] == ["pick 0", "pick 1"]
    assert [s.scalars["truncated"] for s in sequences] == [False, False]


def test_language_table_instruction_codes_are_decoded(tmp_path):
    import tensorflow_datasets.core.features as tff

    features = tff.FeaturesDict({"steps": tff.Dataset({
        "observation": {"instruction": tff.Tensor(shape=(16,), dtype=np.int32), "effector_translation": tff.Tensor(shape=(2,), dtype=np.float32)},
        "action": tff.Tensor(shape=(2,), dtype=np.float32), "is_last": tff.Scalar(dtype=np.bool_)})})

    def codes(text):
        raw = np.zeros(16, np.int32)
        raw[:len(text.encode())] = list(text.encode())
        return raw

    _, _, _, sequences = _custom(tmp_path, features, lambda n: [
        {"observation": {"instruction": codes("push the red star" [:16] if n == 0 else ("push" if i < 1 else "pull")),
                         "effector_translation": np.zeros(2, np.float32)},
         "action": np.zeros(2, np.float32), "is_last": i == 1} for i in range(2)])
    assert sequences[0].scalars["task"] == "push the red sta"
    assert sequences[1].scalars["task"] is None and sequences[1].steps["obs_instruction"].to_pylist() == ["push", "pull"]


def test_episode_level_zlib_tensor_is_decoded(tmp_path):
    import tensorflow_datasets.core.features as tff

    features = tff.FeaturesDict({
        "steps": tff.Dataset({"action": tff.Tensor(shape=(2,), dtype=np.float32)}),
        "episode_metadata": {"calibration": tff.Tensor(shape=(2, 2), dtype=np.float64, encoding="zlib")}})
    _, _, _, sequences = _custom(tmp_path, features, lambda n: [{"action": np.zeros(2, np.float32)}] * 2,
                                 metadata=lambda n: {"calibration": np.eye(2) * (n + 1)})
    assert [s.scalars["calibration"] for s in sequences] == [[1.0, 0.0, 0.0, 1.0], [2.0, 0.0, 0.0, 2.0]]


def test_bgr_all_leaves_depth_alone_and_unknown_names_are_refused(written):
    path, _, _ = written
    fs, root = storage.open_root(str(path))
    meta, _ = rlds.plan(fs, root, {"fps": 10, "bgr_cameras": ["all"]})
    assert meta.column("video_depth").meta["channel_order"] == "rgb" and meta.column("video_image").meta["channel_order"] != "rgb"
    with pytest.raises(FormatError, match=r"--bgr_cameras names \['image_9'\], which are not cameras"):
        rlds.plan(fs, root, {"fps": 10, "bgr_cameras": ["image_9"]})
    with pytest.raises(FormatError, match="--bgr_cameras names 'observation/depth', which is not an 8-bit colour camera"):
        rlds.plan(fs, root, {"fps": 10, "bgr_cameras": ["video_depth"]})


def test_dataset_folder_instead_of_version_folder_names_the_versions(written):
    from formats import sources

    path, _, _ = written
    fs, root = storage.open_root(str(path.parent))
    with pytest.raises(FormatError, match=r"a TFDS dataset folder; pass one of its version folders as --input \(.*/synthetic_rlds/1.0.0\)"):
        sources.detect(fs, root)


def test_a_zlib_tensor_that_inflates_past_its_shape_is_refused_unexpanded():
    import zlib

    entry = {"path": "joint_torques", "dtype": "float32", "shape": [2, 3], "encoding": "zlib"}
    ref = rlds.RecordRef("train", 0, 4, "shard", 0, 0, "train_00000_000004")
    good = zlib.compress(np.arange(6, dtype=np.float32).tobytes())
    assert rlds_records._numeric([good], entry, 1, ref).tolist() == [np.arange(6, dtype=np.float32).tolist()]
    bomb = zlib.compress(bytes(100_000_000))  # 100 MB of zeros in 97 kB
    with pytest.raises(FormatError, match=r"^record 4: steps/joint_torques step 1 inflates to more than the 24 bytes its shape needs$"):
        rlds_records._numeric([good, bomb], entry, 2, ref)
    with pytest.raises(FormatError, match=r"^record 4: steps/joint_torques step 0: zlib stream ends early \(24 bytes\)$"):
        rlds_records._numeric([good[:-4]], entry, 1, ref)
