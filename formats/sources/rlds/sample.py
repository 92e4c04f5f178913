"""Write RLDS datasets as TFDS prepares them, without TensorFlow, for tests and samples.

The features are real TFDS FeatureConnectors (features.json is what their `save_config` writes), episodes are
encoded with their `encode_example` and serialized with tfds' own `ExampleSerializer` into
`tf.train.Example`s, and shards are TFRecord or ArrayRecord files (`file_format`, tfds'
`file_format=` option) named by `filepathTemplate` with counts in dataset_info.json, as
`tfds.core.DatasetBuilder.download_and_prepare` writes them. Images are given as already-encoded
PNG/JPEG bytes (what TFDS stores), so no image library is needed.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import tempfile
from collections.abc import Sequence as Seq

import numpy as np

from formats import samples, storage
from formats.sources.lerobot_v3.sample import encode_image, synthetic_frames
from formats.sources.rlds import arrayrecord, tfrecord

__all__ = ["SyntheticRLDS", "write_dataset", "write_episodes", "write_shard", "FILE_FORMATS"]

FILE_FORMATS = ("tfrecord", "array_record")


@dataclasses.dataclass
class SyntheticRLDS:
    name: str = "synthetic_rlds"
    splits: dict = dataclasses.field(default_factory=lambda: {"train": (8, 9, 5, 12, 7), "val": (6, 4)})
    shards: dict = dataclasses.field(default_factory=lambda: {"train": 3, "val": 1})
    width: int = 64
    height: int = 48
    template: str = "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"
    terminal_episodes: Seq[int] = (0, 2)  # per split: is_last and is_terminal on the last step
    truncated_episodes: Seq[int] = (1,)  # per split: is_last never true (the others end on is_last alone)
    varying_instruction_episodes: Seq[int] = (3,)  # the instruction changes half-way
    depth_camera: bool = False  # a 16-bit PNG depth camera
    seed: int = 0
    file_format: str = "tfrecord"  # or "array_record" (tfds' file_format=array_record)


def _features(spec: SyntheticRLDS):
    import tensorflow_datasets.core.features as tff

    observation = {
        "image": tff.Image(shape=(spec.height, spec.width, 3), encoding_format="png"),
        "wrist_image": tff.Image(shape=(spec.height, spec.width, 3), encoding_format="jpeg"),
        "state": tff.Tensor(shape=(7,), dtype=np.float64, doc="joint angles"),
        "gripper": tff.Scalar(dtype=np.float32),
    }
    if spec.depth_camera:
        observation["depth"] = tff.Image(shape=(spec.height, spec.width, 1), dtype=np.uint16, encoding_format="png")
    return tff.FeaturesDict({
        "steps": tff.Dataset({
            "observation": observation,
            "action": {
                "world_vector": tff.Tensor(shape=(3,), dtype=np.float32),
                "rotation_delta": tff.Tensor(shape=(3,), dtype=np.float32),
                "gripper_closedness_action": tff.Tensor(shape=(1,), dtype=np.float32),
                "terminate_episode": tff.Scalar(dtype=np.int32),
            },
            "joint_torques": tff.Tensor(shape=(2, 3), dtype=np.float32, encoding="zlib"),
            "reward": tff.Scalar(dtype=np.float64),
            "discount": tff.Scalar(dtype=np.float32),
            "is_first": tff.Scalar(dtype=np.bool_),
            "is_last": tff.Scalar(dtype=np.bool_),
            "is_terminal": tff.Scalar(dtype=np.bool_),
            "language_instruction": tff.Text(),
        }),
        "episode_metadata": {"file_path": tff.Text(), "episode_id": tff.Scalar(dtype=np.int64), "success": tff.Scalar(dtype=np.bool_)},
    })


def _episode(spec: SyntheticRLDS, rng, number: int, length: int, camera_offset: int) -> tuple[dict, dict]:
    frames = synthetic_frames(number, camera_offset, length, spec.height, spec.width)
    wrist = synthetic_frames(number, camera_offset + 1, length, spec.height, spec.width)
    depth = (frames[..., 0].astype(np.uint16) * 257 + number).astype(np.uint16)
    state = rng.normal(size=(length, 7))
    truth = {
        "state": state.astype(np.float32).astype(np.float64),  # what tf.train.Example can hold
        "gripper": rng.random(length).astype(np.float32),
        "world_vector": rng.normal(size=(length, 3)).astype(np.float32),
        "rotation_delta": rng.normal(size=(length, 3)).astype(np.float32),
        "gripper_closedness_action": rng.random((length, 1)).astype(np.float32),
        "joint_torques": rng.normal(size=(length, 2, 3)).astype(np.float32),
        "reward": np.zeros(length),
        "frames": frames,
        "wrist": wrist,
        "depth": depth,
    }
    terminal = number in spec.terminal_episodes
    truncated = number in spec.truncated_episodes
    truth["reward"][-1] = 1.0 if terminal else 0.0
    instructions = [f"task {number}"] * length
    if number in spec.varying_instruction_episodes:
        instructions[length // 2:] = [f"task {number} part 2"] * (length - length // 2)
    truth["instructions"] = instructions
    truth["is_last"] = np.array([i == length - 1 and not truncated for i in range(length)])
    truth["is_terminal"] = np.array([i == length - 1 and terminal for i in range(length)])
    steps = []
    for i in range(length):
        observation = {
            "image": io.BytesIO(encode_image(frames[i], "png")),
            "wrist_image": io.BytesIO(encode_image(wrist[i], "jpeg")),
            "state": state[i],
            "gripper": truth["gripper"][i],
        }
        if spec.depth_camera:
            observation["depth"] = io.BytesIO(encode_image(depth[i], "png16"))
        steps.append({
            "observation": observation,
            "action": {
                "world_vector": truth["world_vector"][i],
                "rotation_delta": truth["rotation_delta"][i],
                "gripper_closedness_action": truth["gripper_closedness_action"][i],
                "terminate_episode": int(i == length - 1),
            },
            "joint_torques": truth["joint_torques"][i],
            "reward": truth["reward"][i],
            "discount": 1.0,
            "is_first": i == 0,
            "is_last": bool(truth["is_last"][i]),
            "is_terminal": bool(truth["is_terminal"][i]),
            "language_instruction": instructions[i],
        })
    episode = {"steps": steps, "episode_metadata": {"file_path": f"/raw/{number}.npy", "episode_id": 1000 + number, "success": terminal}}
    return episode, truth


def write_dataset(url: str, spec: SyntheticRLDS | None = None) -> dict:
    """Write the dataset at `url` (the version folder); return {split: [truth per record, in shard order]}."""
    spec = spec or SyntheticRLDS()
    rng = np.random.default_rng(spec.seed)
    truth: dict = {}
    episodes: dict = {}
    for split, lengths in spec.splits.items():
        truth[split], episodes[split] = [], []
        for number, length in enumerate(lengths):
            episode, values = _episode(spec, rng, number, length, camera_offset=len(truth) - 1)
            episodes[split].append(episode)
            truth[split].append(values)
    write_episodes(url, spec.name, _features(spec), episodes, spec.shards, spec.template, spec.file_format)
    return truth


def write_shard(fs, path: str, records: list[bytes], file_format: str = "tfrecord") -> None:
    """One shard of serialized records in the given container: TFRecord framing, or ArrayRecord
    with the writer options tfds uses (written to a local file first: array_record writes OS paths only)."""
    if file_format == "tfrecord":
        with fs.open(path, "wb") as handle:
            tfrecord.write_records(handle, records)
        return
    if file_format != "array_record":
        raise ValueError(f"file_format {file_format!r}: one of {FILE_FORMATS}")
    local = storage.local_path(fs, path)
    if local is not None:
        arrayrecord.write_records(local, records)
        return
    with tempfile.TemporaryDirectory(prefix="mixtrain-rlds-sample-") as folder:
        arrayrecord.write_records(os.path.join(folder, "shard"), records)
        fs.put_file(os.path.join(folder, "shard"), path)


def write_episodes(url: str, name: str, features, episodes: dict, shards: dict | None = None,
                   template: str = "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}", file_format: str = "tfrecord") -> None:
    """Serialize {split: [episode dicts]} with TFDS' encoder into shards laid out as TFDS does."""
    from google.protobuf import json_format
    from tensorflow_datasets.core import example_serializer

    fs, root = storage.open_root(url)
    fs.makedirs(root, exist_ok=True)
    serializer = example_serializer.ExampleSerializer(features.get_serialized_info())
    info_splits = []
    for split, split_episodes in episodes.items():
        count = (shards or {}).get(split, 1)
        shard_of = [number * count // len(split_episodes) for number in range(len(split_episodes))]  # contiguous, like TFDS
        records: list[list[bytes]] = [[] for _ in range(count)]
        for number, episode in enumerate(split_episodes):
            records[shard_of[number]].append(serializer.serialize_example(features.encode_example(episode)))
        sizes = 0
        for position, shard in enumerate(records):
            file_name = template.format(DATASET=name, SPLIT=split, FILEFORMAT=file_format, SHARD_INDEX=f"{position:05d}",
                                        NUM_SHARDS=f"{count:05d}", SHARD_X_OF_Y=f"{position:05d}-of-{count:05d}")
            fs.makedirs(storage.join(root, file_name).rsplit("/", 1)[0], exist_ok=True)
            write_shard(fs, storage.join(root, file_name), shard, file_format)
            sizes += fs.size(storage.join(root, file_name))
        info_splits.append({"name": split, "filepathTemplate": template, "numBytes": str(sizes),
                            "shardLengths": [str(len(shard)) for shard in records]})
    info = {"name": name, "fileFormat": file_format, "version": "1.0.0", "moduleName": f"{name}.builder",
            "description": "synthetic RLDS written by mixtrain-convert's tests", "splits": info_splits}
    fs.pipe_file(storage.join(root, "dataset_info.json"), json.dumps(info, indent=2).encode())
    # What FeatureConnector.save_config writes: the feature proto as JSON.
    features_json = json_format.MessageToDict(features.to_proto())
    fs.pipe_file(storage.join(root, "features.json"), json.dumps(features_json, indent=4, sort_keys=True).encode())


def _small(path: str) -> dict:
    return write_dataset(path, SyntheticRLDS(splits={"train": (6, 4, 5)}, shards={"train": 2}))


def _bundled(path: str, episodes: int, file_format: str = "tfrecord") -> str:
    lengths = tuple(8 + (5 * i) % 9 for i in range(episodes))
    write_dataset(path, SyntheticRLDS(splits={"train": lengths}, shards={"train": max(1, episodes // 5)}, file_format=file_format))
    return f"an rlds sample with {episodes} episodes ({sum(lengths)} steps, {file_format} shards; convert it with --fps)"


# Synthetic RLDS has no known control rate: a conversion needs --fps.
samples.register(samples.Sample("rlds", _small, _bundled, convert_args=("--fps=10",),
                                bundled_choices={"file_format": FILE_FORMATS}))
