"""Write ORTF v0.2 datasets (specs/ortf-v0.2.md) for tests and samples: no public writer exists.

Follows the spec's layout: meta/manifest.json (every section), meta/episodes.parquet (the episode
index with `video_files` as a struct per camera, success, failure_reason, operator_notes,
recorded_at, task_id, audio_file), meta/tasks.jsonl, meta/stats.json, data/chunk-XXX/steps.parquet
(episodes chunked by `episodes_per_chunk`, default 1000), videos/<cam>/chunk-XXX/episode_XXXXXX.mp4
(H.264), 16-bit depth as MP4 (FFV1 gray16le) or NPZ, WAV audio, and annotations/episode_XXXXXX/
(scene_objects.json, first_frame.jpg). `start_step`/`end_step` are global step indices (row
positions over the chunks in order). A `slow_camera` records at half the step rate, so its
frame_index is i // 2: readers must re-time it.
"""

from __future__ import annotations

import dataclasses
import io
import json
import posixpath
import wave
from collections.abc import Sequence as Seq

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from formats import samples, storage
from formats.sources.lerobot_v3.sample import encode_image, synthetic_frames
from formats.video import encode_frames
from formats.video.policy import EncodeOptions

__all__ = ["SyntheticORTF", "write_dataset", "STATE_COMPONENTS"]

STATE_COMPONENTS = {"joint_positions": 7, "joint_velocities": 7, "ee_position": 3, "ee_orientation": 4, "gripper_position": 1}
NOTES = ["Perfect execution. No issues.", "Greifer rutschte beim ersten Versuch ab — zweiter Versuch ✓",
         "物体比预期重，放置时略有过冲。", "Had to restart recording - first attempt had calibration drift."]


@dataclasses.dataclass
class SyntheticORTF:
    lengths: Seq[int] = (12, 9, 15, 7, 11)
    episodes_per_chunk: int = 2
    fps: int = 15
    cameras: Seq[str] = ("cam_wrist", "cam_overhead")
    slow_camera: str | None = "cam_overhead"  # half rate: frame_index = i // 2
    depth_format: str | None = "mp4"  # mp4 (16-bit, lossless FFV1) | npz | None
    audio: bool = True
    annotations: bool = True
    failed_episodes: Seq[int] = (2,)
    sequential_ids: bool = False
    urdf: bool = True  # robot/panda.urdf and robot/meshes/  # episode_id "000003" instead of a UUID-like string
    width: int = 64
    height: int = 48
    seed: int = 0


def _manifest(spec: SyntheticORTF) -> dict:
    joints = [{"name": f"panda_joint{i + 1}", "type": "revolute", "index": i, "limits": [-2.9, 2.9]} for i in range(7)]
    sensors = [{"name": f"{camera}_rgb", "type": "camera", "mount": "egocentric" if "wrist" in camera else "exocentric",
                "resolution": {"width": spec.width, "height": spec.height},
                "fps": spec.fps / 2 if camera == spec.slow_camera else spec.fps, "encoding": "h264",
                "intrinsics": {"fx": 60.0, "fy": 60.0, "cx": spec.width / 2, "cy": spec.height / 2},
                "extrinsics": {"parent_frame": "world", "translation": [0.5, 0.0, 1.2], "rotation": [1.0, 0.0, 0.0, 0.0]}}
               for camera in spec.cameras]
    images = {camera: f"{camera}_rgb" for camera in spec.cameras}
    if spec.depth_format:
        sensors.append({"name": "depth", "type": "depth_camera", "mount": "exocentric",
                        "resolution": {"width": spec.width, "height": spec.height}, "fps": spec.fps, "bit_depth": 16,
                        "depth_units": "millimeters", "depth_range": [0.1, 10.0]})
        images["depth"] = "depth"
    if spec.audio:
        sensors.append({"name": "audio", "type": "audio", "sample_rate": 16000, "channels": 1, "codec": "pcm_s16le"})
    dims = ["dx", "dy", "dz", "droll", "dpitch", "dyaw"]
    return {
        "ortf_version": "0.2",
        "dataset_id": "550e8400-e29b-41d4-a716-446655440000",
        "name": "Synthetic Kitchen",
        "description": "Synthetic ORTF written by mixtrain-convert's tests",
        "created_at": "2025-12-21T10:30:00Z",
        "license": "CC-BY-4.0",
        "robot": {"id": "panda-001", "name": "Franka Panda", "type": "manipulator", "dof": 7, "joints": joints,
                  "gripper": {"type": "parallel_jaw", "max_width": 0.08, "fingers": 2}, "end_effector_link": "panda_hand"},
        "action_space": {
            "type": "end_effector_delta", "frame": "end_effector", "control_frequency_hz": spec.fps,
            "dimensions": [{"name": name, "index": i, "type": "position" if i < 3 else "rotation",
                            "units": "meters" if i < 3 else "radians", "range": [-0.05, 0.05] if i < 3 else [-0.25, 0.25]}
                           for i, name in enumerate(dims)]
            + [{"name": "gripper", "index": 6, "type": "binary", "units": "discrete", "values": [0, 1]}],
            "normalization": {"method": "min_max", "range": [-1, 1]},
        },
        "observation_space": {
            "state": {
                "joint_positions": {"dim": 7, "units": "radians"},
                "joint_velocities": {"dim": 7, "units": "rad_per_s"},
                "ee_position": {"dim": 3, "units": "meters", "frame": "robot_base"},
                "ee_orientation": {"dim": 4, "units": "quaternion", "order": "wxyz"},
                "gripper_position": {"dim": 1, "units": "normalized", "range": [0, 1]},
            },
            "images": images,
        },
        "sensors": sensors,
        "frames": {"world": {"type": "fixed", "convention": "z_up"},
                   "robot_base": {"type": "fixed", "parent": "world", "transform": {"translation": [0, 0, 0.75], "rotation": [1, 0, 0, 0]}}},
        "collection": {"operator": "human_teleop", "interface": "spacemouse", "location": "Stanford AI Lab"},
        "statistics": {"total_episodes": len(spec.lengths), "total_steps": int(sum(spec.lengths)),
                       "total_duration_hours": sum(spec.lengths) / spec.fps / 3600},
        "timestamp_reference": "episode_start",
        "sync_tolerance_ms": 33.3,
    }


def _wav(samples: np.ndarray, rate: int) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as handle:
        handle.setnchannels(1)
        handle.setsampwidth(2)
        handle.setframerate(rate)
        handle.writeframes(samples.astype("<i2").tobytes())
    return buffer.getvalue()


def write_dataset(url: str, spec: SyntheticORTF | None = None) -> dict:
    """Write the dataset; return per-episode truth (state components, action, frames, ids...)."""
    spec = spec or SyntheticORTF()
    fs, root = storage.open_root(url)
    rng = np.random.default_rng(spec.seed)

    def put(relative: str, data: bytes) -> None:
        path = storage.join(root, relative)
        fs.makedirs(posixpath.dirname(path), exist_ok=True)
        fs.pipe_file(path, data)

    truth: dict = {"episodes": []}
    chunks: dict[int, list[pa.Table]] = {}
    episode_rows = []
    global_step = 0
    for number, length in enumerate(spec.lengths):
        chunk = number // spec.episodes_per_chunk
        episode_id = f"{number:06d}" if spec.sequential_ids else f"ep-{number:04d}/kitchen#{chunk}"
        state = {name: rng.normal(size=(length, dim)).astype(np.float32) for name, dim in STATE_COMPONENTS.items()}
        action = rng.normal(size=(length, 7)).astype(np.float32)
        failed = number in spec.failed_episodes
        columns = {
            "episode_id": pa.array([episode_id] * length),
            "step_index": pa.array(np.arange(length, dtype=np.int64)),
            "timestamp": pa.array(np.arange(length) / spec.fps + 0.0005 * rng.random(length)),
            "is_first": pa.array(np.arange(length) == 0),
            "is_last": pa.array(np.arange(length) == length - 1),
            "is_terminal": pa.array((np.arange(length) == length - 1) & (not failed)),
            "action": pa.FixedSizeListArray.from_arrays(pa.array(action.reshape(-1)), 7),
        }
        for name, values in state.items():
            columns[f"observation.state.{name}"] = pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values.shape[1])
        record = {"episode_id": episode_id, "length": length, "state": state, "action": action,
                  "timestamp": columns["timestamp"].to_numpy(), "frames": {}, "failed": failed}
        video_files = {}
        for camera_number, camera in enumerate(spec.cameras):
            frames = synthetic_frames(number, camera_number, length, spec.height, spec.width)
            if camera == spec.slow_camera:
                indices = np.arange(length) // 2
                stored = frames[::2]
            else:
                indices = np.arange(length)
                stored = frames
            columns[f"observation.images.{camera}.frame_index"] = pa.array(indices.astype(np.int64))
            relative = f"videos/{camera}/chunk-{chunk:03d}/episode_{number:06d}.mp4"
            buffer = io.BytesIO()
            encode_frames(stored, buffer, fps=spec.fps / 2 if camera == spec.slow_camera else spec.fps,
                          options=EncodeOptions("h264", crf=18, gop=10, min_psnr=0))  # a floor only measures
            put(relative, buffer.getvalue())
            video_files[camera] = relative
            record["frames"][camera] = frames[indices]
        if spec.depth_format:
            depth = (synthetic_frames(number, 7, length, spec.height, spec.width)[..., 0].astype(np.uint16) * 37 + 500).astype(np.uint16)
            columns["observation.images.depth.frame_index"] = pa.array(np.arange(length, dtype=np.int64))
            if spec.depth_format == "mp4":
                relative = f"videos/depth/chunk-{chunk:03d}/episode_{number:06d}.mp4"
                buffer = io.BytesIO()
                encode_frames(depth, buffer, fps=spec.fps, options=EncodeOptions("ffv1", pix_fmt="gray16le"))
                put(relative, buffer.getvalue())
            else:
                relative = f"videos/depth/chunk-{chunk:03d}/episode_{number:06d}.npz"
                buffer = io.BytesIO()
                np.savez_compressed(buffer, depth=depth)
                put(relative, buffer.getvalue())
            video_files["depth"] = relative
            record["depth"] = depth
        audio_file = None
        if spec.audio:
            audio_file = f"audio/chunk-{chunk:03d}/episode_{number:06d}.wav"
            put(audio_file, _wav((np.sin(np.arange(int(16000 * length / spec.fps)) * 0.05 * (number + 1)) * 8000), 16000))
        if spec.annotations:
            objects = {"annotated_at": "2025-12-21T10:30:00Z", "annotated_frame": 0, "annotated_frame_timestamp": 0.0,
                       "objects": [{"label": "Box A", "class": "box", "bounding_box": {"x": 12, "y": 8, "width": 16, "height": 16},
                                    "color": "#ef4444"},
                                   {"label": "Schüssel B", "class": "container", "bounding_box": {"x": 30, "y": 20, "width": 20, "height": 14},
                                    "color": "#3b82f6"}]}
            put(f"annotations/episode_{number:06d}/scene_objects.json", json.dumps(objects, ensure_ascii=False, indent=2).encode())
            put(f"annotations/episode_{number:06d}/first_frame.jpg", encode_image(record["frames"][spec.cameras[0]][0], "jpeg"))
            record["scene_objects"] = objects
        chunks.setdefault(chunk, []).append(pa.table(columns))
        episode_rows.append({
            "episode_id": episode_id,
            "task_id": number % 2,
            "start_step": global_step,
            "end_step": global_step + length,
            "length": length,
            "duration_seconds": float(record["timestamp"][-1] - record["timestamp"][0] + 1 / spec.fps),
            "success": not failed,
            "failure_reason": "gripper slipped, object dropped" if failed else None,
            "operator_notes": NOTES[number % len(NOTES)],
            "chunk_id": chunk,
            "recorded_at": f"2025-12-{10 + number:02d}T09:00:00Z",
            "video_files": video_files,
            "audio_file": audio_file,
        })
        truth["episodes"].append(record)
        global_step += length
    for chunk, tables in chunks.items():
        buffer = io.BytesIO()
        pq.write_table(pa.concat_tables(tables), buffer, row_group_size=16)
        put(f"data/chunk-{chunk:03d}/steps.parquet", buffer.getvalue())
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(episode_rows), buffer)
    put("meta/episodes.parquet", buffer.getvalue())
    tasks = [{"task_id": 0, "type": "box_pick_v0", "instruction": "Pick up the red box (Box A) and place it in the bowl",
              "description": "pick and place"},
             {"task_id": 1, "type": "drawer_open_v0", "instruction": "Öffne die Schublade", "description": "open a drawer"}]
    put("meta/tasks.jsonl", "\n".join(json.dumps(task, ensure_ascii=False) for task in tasks).encode() + b"\n")
    put("meta/stats.json", json.dumps({"action": {"mean": [0.0] * 7, "std": [1.0] * 7}}).encode())
    manifest = _manifest(spec)
    if spec.urdf:
        manifest["robot"]["urdf_path"] = "robot/panda.urdf"
        put("robot/panda.urdf", b'<robot name="panda"><link name="panda_link0"/></robot>\n')
        put("robot/meshes/link0.stl", b"solid link0\nendsolid link0\n")
    put("meta/manifest.json", json.dumps(manifest, indent=2).encode())
    truth["tasks"] = tasks
    truth["episode_rows"] = episode_rows
    return truth


def _small(path: str) -> dict:
    return write_dataset(path, SyntheticORTF(lengths=(6, 5, 7)))


def _bundled(path: str, episodes: int) -> str:
    lengths = tuple(20 + (11 * i) % 17 for i in range(episodes))
    write_dataset(path, SyntheticORTF(lengths=lengths, episodes_per_chunk=5))
    return f"an ortf sample with {episodes} episodes ({sum(lengths)} steps)"


samples.register(samples.Sample("ortf", _small, _bundled))
