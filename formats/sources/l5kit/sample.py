"""Write L5Kit zarr datasets the way l5kit's own writer lays them out, for tests and samples.

l5kit (`l5kit.data.zarr_dataset.ChunkedDataset`) writes a zarr v2 group with the structured
arrays below, blosc-lz4 chunks (full-size last chunk), root attributes `format_version` and
`labels`, and frames pointing into contiguous agent and traffic-light-face ranges. This writer
does the same with configurable chunk sizes, so tests get several chunks, partial last chunks,
frames without agents, and scenes whose agents straddle chunk boundaries.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence as Seq

import numpy as np

from formats import samples, storage
from formats.sources.l5kit.zarr_v2 import write_array, write_group

__all__ = ["SyntheticL5Kit", "write_dataset", "SCENE_DTYPE", "FRAME_DTYPE", "AGENT_DTYPE", "TL_FACE_DTYPE", "LABELS"]

LABELS = [
    "PERCEPTION_LABEL_NOT_SET", "PERCEPTION_LABEL_UNKNOWN", "PERCEPTION_LABEL_DONTCARE", "PERCEPTION_LABEL_CAR",
    "PERCEPTION_LABEL_VAN", "PERCEPTION_LABEL_TRAM", "PERCEPTION_LABEL_BUS", "PERCEPTION_LABEL_TRUCK",
    "PERCEPTION_LABEL_EMERGENCY_VEHICLE", "PERCEPTION_LABEL_OTHER_VEHICLE", "PERCEPTION_LABEL_BICYCLE",
    "PERCEPTION_LABEL_MOTORCYCLE", "PERCEPTION_LABEL_CYCLIST", "PERCEPTION_LABEL_MOTORCYCLIST",
    "PERCEPTION_LABEL_PEDESTRIAN", "PERCEPTION_LABEL_ANIMAL", "AVRESEARCH_LABEL_DONTCARE",
]
SCENE_DTYPE = np.dtype([("frame_index_interval", np.int64, (2,)), ("host", "<U16"), ("start_time", np.int64), ("end_time", np.int64)])
FRAME_DTYPE = np.dtype([
    ("timestamp", np.int64),
    ("agent_index_interval", np.int64, (2,)),
    ("traffic_light_faces_index_interval", np.int64, (2,)),
    ("ego_translation", np.float64, (3,)),
    ("ego_rotation", np.float64, (3, 3)),
])
AGENT_DTYPE = np.dtype([
    ("centroid", np.float64, (2,)),
    ("extent", np.float32, (3,)),
    ("yaw", np.float32),
    ("velocity", np.float32, (2,)),
    ("track_id", np.uint64),
    ("label_probabilities", np.float32, (len(LABELS),)),
])
TL_FACE_DTYPE = np.dtype([("face_id", "<U16"), ("traffic_light_id", "<U16"), ("traffic_light_face_status", np.float32, (3,))])


@dataclasses.dataclass
class SyntheticL5Kit:
    scene_lengths: Seq[int] = (30, 45, 12)
    max_agents_per_frame: int = 12  # 0..max per frame; every 7th frame has none
    max_faces_per_frame: int = 3
    scenes_chunk: int = 2
    frames_chunk: int = 32
    agents_chunk: int = 100
    faces_chunk: int = 50
    with_faces: bool = True
    seed: int = 0


def _rotation(yaw: float) -> np.ndarray:
    c, s = np.cos(yaw), np.sin(yaw)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


def write_dataset(url: str, spec: SyntheticL5Kit | None = None) -> dict:
    """Write the dataset; return the arrays written (`scenes`, `frames`, `agents`, `traffic_light_faces`, `yaw`)."""
    spec = spec or SyntheticL5Kit()
    rng = np.random.default_rng(spec.seed)
    fs, root = storage.open_root(url)
    total_frames = sum(spec.scene_lengths)
    scenes = np.zeros(len(spec.scene_lengths), SCENE_DTYPE)
    frames = np.zeros(total_frames, FRAME_DTYPE if spec.with_faces else np.dtype(
        [f for f in FRAME_DTYPE.descr if f[0] != "traffic_light_faces_index_interval"]))
    agents_per_frame = rng.integers(0, spec.max_agents_per_frame + 1, total_frames)
    agents_per_frame[::7] = 0
    faces_per_frame = rng.integers(0, spec.max_faces_per_frame + 1, total_frames)
    agents = np.zeros(int(agents_per_frame.sum()), AGENT_DTYPE)
    faces = np.zeros(int(faces_per_frame.sum()), TL_FACE_DTYPE)
    yaws = rng.uniform(-np.pi, np.pi, total_frames)
    frame = agent = face = 0
    time = 1_571_846_881_502_692_276
    for index, length in enumerate(spec.scene_lengths):
        scenes[index] = ((frame, frame + length), f"host-a{100 + index}", time - 10**9, time + length * 10**8)
        for _ in range(length):
            count, faces_count = int(agents_per_frame[frame]), int(faces_per_frame[frame])
            frames[frame]["timestamp"] = time + int(rng.integers(-3_000_000, 3_000_000))
            frames[frame]["agent_index_interval"] = (agent, agent + count)
            if spec.with_faces:
                frames[frame]["traffic_light_faces_index_interval"] = (face, face + faces_count)
            frames[frame]["ego_translation"] = rng.normal(size=3) * 100
            frames[frame]["ego_rotation"] = _rotation(yaws[frame])
            block = agents[agent: agent + count]
            block["centroid"] = rng.normal(size=(count, 2)) * 50
            block["extent"] = rng.uniform(0.5, 5, (count, 3))
            block["yaw"] = rng.uniform(-np.pi, np.pi, count)
            block["velocity"] = rng.normal(size=(count, 2))
            block["track_id"] = rng.integers(1, 2**63, count, dtype=np.uint64)
            block["label_probabilities"] = rng.dirichlet(np.ones(len(LABELS)), count)
            lights = faces[face: face + faces_count]
            lights["face_id"] = [f"f{frame}-{k}" for k in range(faces_count)]
            lights["traffic_light_id"] = [f"tl{k}" for k in range(faces_count)]
            lights["traffic_light_face_status"] = rng.dirichlet(np.ones(3), faces_count)
            frame, agent, face = frame + 1, agent + count, face + faces_count
            time += 100_000_000
    write_group(fs, root, {"format_version": 2 if spec.with_faces else 1, "labels": LABELS})
    write_array(fs, storage.join(root, "scenes"), scenes, spec.scenes_chunk)
    write_array(fs, storage.join(root, "frames"), frames, spec.frames_chunk)
    write_array(fs, storage.join(root, "agents"), agents, spec.agents_chunk)
    if spec.with_faces:
        write_array(fs, storage.join(root, "traffic_light_faces"), faces, spec.faces_chunk)
    return {"scenes": scenes, "frames": frames, "agents": agents, "traffic_light_faces": faces, "yaw": yaws}


def _small(path: str) -> dict:
    return write_dataset(path, SyntheticL5Kit(scene_lengths=(10, 14)))


def _bundled(path: str, episodes: int) -> str:
    lengths = tuple(40 + (13 * i) % 37 for i in range(episodes))
    write_dataset(path, SyntheticL5Kit(scene_lengths=lengths, scenes_chunk=5))
    return f"an l5kit sample with {episodes} scenes ({sum(lengths)} frames)"


samples.register(samples.Sample("l5kit", _small, _bundled))
