"""ORTF v0.2 reader (specs/ortf-v0.2.md): one Mixtrain row per episode.

Layout:
  meta/manifest.json          required: ortf_version, dataset_id, robot, action_space,
                              observation_space, sensors, frames (kept whole as source metadata)
  meta/episodes.parquet       the episode index: episode_id, start_step/end_step, length, chunk_id,
                              video_files (struct per camera), success, failure_reason,
                              operator_notes, recorded_at, task_id, audio_file
  meta/tasks.jsonl            task_id -> instruction (-> `task`), type, description
  meta/stats.json             kept as source metadata
  data/chunk-XXX/steps.parquet  steps of the chunk's episodes (XXX: 3 digits, 6 past 999 chunks)
  videos/<cam>/chunk-XXX/episode_XXXXXX.mp4 (or the video_files paths); depth as 16-bit MP4 or NPZ
  annotations/episode_XXXXXX/  scene_objects.json and images

Steps of an episode are found by episode_id in its chunk's file (only the row groups whose
statistics can hold it are read); start_step/end_step are checked against where they are, read
either as global step indices or as row positions inside the chunk file. A camera's
`observation.images.<cam>.frame_index` aligns video to steps: 0..T-1 against a file of exactly T
frames is a byte copy; a contiguous range at the step rate is a packet cut; anything else (a
slower camera repeating frames) is re-timed frame by frame.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import posixpath
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from formats import storage
from formats.errors import ColumnNameError, ConversionError, FormatError, in_context
from formats.sequence import (
    FILE,
    SCALAR,
    VIDEO,
    ColumnSpec,
    DatasetMeta,
    FileRef,
    Sequence,
    VideoSegment,
    base_columns,
    check_unique_columns,
    column_name,
    safe_sequence_id,
)

__all__ = ["FORMAT", "EpisodeRef", "detect", "plan", "load"]

FORMAT = "ortf"
SUPPORTED_VERSIONS = ("0.2",)
MANIFEST = "meta/manifest.json"
EPISODES = "meta/episodes.parquet"
REQUIRED_MANIFEST = {"ortf_version": str, "dataset_id": str, "robot": dict, "action_space": dict,
                     "observation_space": dict, "sensors": list, "frames": dict}
REQUIRED_EPISODE_COLUMNS = ("episode_id", "start_step", "end_step", "length", "chunk_id")
# Episode columns with a defined place in the row; any other column is kept under its own name.
_EPISODE_LOCATORS = {"start_step", "end_step", "chunk_id", "video_files", "audio_file", "length", "duration_seconds", "task_id"}
_STEP_BOOKKEEPING = {"episode_id", "step_index", "timestamp"}
_FLAGS = ("is_first", "is_last", "is_terminal")
_CODECS = {"h264": "h264", "avc": "h264", "h265": "hevc", "hevc": "hevc", "av1": "av1"}


@dataclasses.dataclass(frozen=True)
class Camera:
    column: str
    key: str  # the camera key in observation_space.images / video_files
    path: str
    fps: float
    npz: bool


@dataclasses.dataclass(frozen=True)
class EpisodeRef:
    position: int  # row of meta/episodes.parquet
    episode_id: str
    sequence_id: str
    length: int
    steps_file: str
    start_step: int
    end_step: int
    chunk_base: int  # smallest start_step of the chunk's episodes (global numbering)
    cameras: tuple[Camera, ...]
    audio: str | None
    annotations: str | None  # annotations/episode_XXXXXX when the dataset has annotations
    scalars: tuple[tuple[str, Any], ...]


def detect(fs: fsspec.AbstractFileSystem, root: str) -> bool:
    return fs.exists(storage.join(root, MANIFEST))


def _json(fs, path: str, *, required: bool = True) -> Any:
    if not fs.exists(path):
        if required:
            raise FormatError(f"{path}: not found (required by ORTF v0.2)")
        return None
    try:
        return json.loads(fs.cat_file(path))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise FormatError(f"{path}: malformed JSON: {error}") from error


def _manifest(fs, root: str) -> dict:
    path = storage.join(root, MANIFEST)
    manifest = _json(fs, path)
    if not isinstance(manifest, dict):
        raise FormatError(f"{path}: expected a JSON object")
    missing = [key for key in REQUIRED_MANIFEST if key not in manifest]
    if missing:
        raise FormatError(f"{path}: required field(s) {missing} missing")
    for key, kind in REQUIRED_MANIFEST.items():
        if not isinstance(manifest[key], kind):
            raise FormatError(f"{path}: {key!r} must be a {kind.__name__}, found {type(manifest[key]).__name__}")
    if manifest["ortf_version"] not in SUPPORTED_VERSIONS:
        raise FormatError(f"{path}: ortf_version {manifest['ortf_version']!r} is not supported (only {', '.join(SUPPORTED_VERSIONS)})")
    return manifest


def _tasks(fs, root: str) -> dict[int, dict]:
    path = storage.join(root, "meta/tasks.jsonl")
    if not fs.exists(path):
        return {}
    tasks = {}
    for number, line in enumerate(fs.cat_file(path).decode("utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            task = json.loads(line)
            tasks[int(task["task_id"])] = task
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
            raise FormatError(f"{path}: line {number} is not a task object with a task_id: {error}") from error
    return tasks


@functools.lru_cache(maxsize=64)
def _footer(fs, path: str, plan_id: str) -> pq.FileMetaData:
    with fs.open(path, "rb") as handle:
        return pq.ParquetFile(handle).metadata


def _chunk_file(fs, root: str, chunk: int, cache: dict) -> str:
    if chunk not in cache:
        for width in (3, 6):
            relative = f"data/chunk-{chunk:0{width}d}/steps.parquet"
            if fs.exists(storage.join(root, relative)):
                cache[chunk] = relative
                break
        else:
            raise FormatError(f"{storage.join(root, f'data/chunk-{chunk:03d}/steps.parquet')}: not found (chunk_id {chunk})")
    return cache[chunk]


def plan(fs: fsspec.AbstractFileSystem, root: str, options: dict | None = None) -> tuple[DatasetMeta, list[EpisodeRef]]:
    manifest = _manifest(fs, root)
    manifest_path = storage.join(root, MANIFEST)
    episodes_path = storage.join(root, EPISODES)
    if not fs.exists(episodes_path):
        raise FormatError(f"{episodes_path}: not found (required by ORTF v0.2)")
    with fs.open(episodes_path, "rb") as handle:
        episodes = pq.read_table(handle)
    missing = [c for c in REQUIRED_EPISODE_COLUMNS if c not in episodes.column_names]
    if missing:
        raise FormatError(f"{episodes_path}: required column(s) {missing} missing")
    if episodes.num_rows == 0:
        raise FormatError(f"{episodes_path}: no episodes")
    tasks = _tasks(fs, root)
    fps = _step_rate(manifest, manifest_path)
    sensors = {sensor.get("name"): sensor for sensor in manifest["sensors"] if isinstance(sensor, dict)}
    images = (manifest["observation_space"].get("images") or {})
    rows = episodes.to_pylist()
    chunk_files: dict[int, str] = {}
    first_file = _chunk_file(fs, root, int(rows[0]["chunk_id"]), chunk_files)
    plan_id = DatasetMeta.__dataclass_fields__["plan_id"].default_factory()
    schema = _footer(fs, storage.join(root, first_file), plan_id).schema.to_arrow_schema()

    columns = base_columns() + [ColumnSpec("episode_id", SCALAR, pa.string(), {"source": "episodes.episode_id"})]
    if "task_id" in episodes.column_names:
        columns += [ColumnSpec("task", SCALAR, pa.string(), {"source": "tasks.jsonl instruction"}),
                    ColumnSpec("task_type", SCALAR, pa.string(), {"source": "tasks.jsonl type"}),
                    ColumnSpec("task_id", SCALAR, pa.int64(), {"source": "episodes.task_id"})]
    extra = [name for name in episodes.column_names if name not in _EPISODE_LOCATORS and name != "episode_id"]
    for name in extra:
        columns.append(ColumnSpec(column_name(name), SCALAR, episodes.schema.field(name).type, {"source": f"episodes.{name}"}))
    columns += _step_columns(schema, manifest, manifest_path, storage.join(root, first_file))
    cameras = _camera_columns(episodes, images, sensors, fps, manifest_path)
    columns += [spec for spec, _ in cameras.values()]
    with_audio = "audio_file" in episodes.column_names and pc.any(pc.is_valid(episodes.column("audio_file"))).as_py()
    if with_audio:
        audio = next((s for s in sensors.values() if s.get("type") == "audio"), {})
        columns.append(ColumnSpec("audio", FILE, pa.string(), {"type": "audio", "source": "episodes.audio_file",
                                                               **{k: audio[k] for k in ("sample_rate", "channels", "codec") if k in audio}}))
    with_annotations = fs.exists(storage.join(root, "annotations"))
    if with_annotations:
        columns += [ColumnSpec("scene_objects", SCALAR, pa.string(), {"type": "json", "source": "annotations/episode_*/scene_objects.json"}),
                    ColumnSpec("annotation_files", FILE, pa.list_(pa.string()), {"type": "image", "source": "annotations/episode_*/"})]
    check_unique_columns(columns)

    chunk_base: dict[int, int] = {}
    for row in rows:
        chunk_base[int(row["chunk_id"])] = min(chunk_base.get(int(row["chunk_id"]), 1 << 62), int(row["start_step"]))
    refs, seen = [], {}
    for position, row in enumerate(rows):
        episode_id = str(row["episode_id"])
        sequence_id = safe_sequence_id(episode_id)
        if sequence_id in seen:
            raise ColumnNameError(f"{episodes_path}: episode ids {seen[sequence_id]!r} and {episode_id!r} both become "
                                  f"sequence id {sequence_id!r}")
        seen[sequence_id] = episode_id
        length = int(row["length"])
        if int(row["end_step"]) - int(row["start_step"]) != length:
            raise FormatError(f"{episodes_path}: {sequence_id}: start_step {row['start_step']} / end_step {row['end_step']} "
                              f"do not span its length {length}")
        if length <= 0:
            raise FormatError(f"{episodes_path}: {sequence_id}: episode has no steps")
        scalars: dict[str, Any] = {"episode_id": episode_id, "length": length}
        scalars["duration_seconds"] = float(row["duration_seconds"]) if row.get("duration_seconds") is not None else length / fps
        if "task_id" in row:
            task = tasks.get(int(row["task_id"])) if row["task_id"] is not None else None
            if row["task_id"] is not None and task is None and tasks:
                raise FormatError(f"{episodes_path}: {sequence_id}: task_id {row['task_id']} is not in meta/tasks.jsonl")
            scalars.update(task_id=row["task_id"], task=(task or {}).get("instruction"), task_type=(task or {}).get("type"))
        for name in extra:
            scalars[column_name(name)] = row[name]
        episode_cameras = tuple(_episode_camera(row, key, spec, camera, chunk_files, position, sequence_id, episodes_path)
                                for key, (spec, camera) in cameras.items())
        refs.append(EpisodeRef(
            position=position, episode_id=episode_id, sequence_id=sequence_id, length=length,
            steps_file=_chunk_file(fs, root, int(row["chunk_id"]), chunk_files),
            start_step=int(row["start_step"]), end_step=int(row["end_step"]), chunk_base=chunk_base[int(row["chunk_id"])],
            cameras=episode_cameras, audio=row.get("audio_file") if with_audio else None,
            annotations=f"annotations/episode_{position:06d}" if with_annotations else None,
            scalars=tuple(scalars.items()),
        ))
    meta = DatasetMeta(
        format=FORMAT,
        uri=storage.url_for(fs, root),
        fps=fps,
        columns=columns,
        source={"format": FORMAT, "uri": storage.url_for(fs, root), "manifest": manifest, "tasks": list(tasks.values()),
                "stats": _json(fs, storage.join(root, "meta/stats.json"), required=False)},
        plan_id=plan_id,
    )
    return meta, refs


def _step_rate(manifest: dict, path: str) -> float:
    rate = manifest["action_space"].get("control_frequency_hz")
    if rate is None:
        rates = [s.get("fps") for s in manifest["sensors"] if isinstance(s, dict) and s.get("type") == "camera" and s.get("fps")]
        rate = max(rates) if rates else None
    if not isinstance(rate, (int, float)) or rate <= 0:
        raise FormatError(f"{path}: no step rate: action_space.control_frequency_hz (or a camera's fps) is needed")
    return float(rate)


def _width(field_type: pa.DataType) -> int | None:
    return field_type.list_size if pa.types.is_fixed_size_list(field_type) else None


def _step_columns(schema: pa.Schema, manifest: dict, manifest_path: str, steps_path: str) -> list[ColumnSpec]:
    columns = []
    state_space = manifest["observation_space"].get("state") or {}
    joints = sorted((j for j in manifest["robot"].get("joints") or [] if isinstance(j, dict)), key=lambda j: j.get("index", 0))
    for component in state_space:
        if f"observation.state.{component}" not in schema.names:
            raise FormatError(f"{steps_path}: observation_space.state.{component} is declared in the manifest but missing from the steps")
    for name in schema.names:
        field_type = schema.field(name).type
        if name in _STEP_BOOKKEEPING or (name.startswith("observation.images.") and name.endswith(".frame_index")):
            continue
        if name in _FLAGS:
            columns.append(ColumnSpec.steps(name, pa.bool_(), source=name))
            continue
        value_type = field_type.value_type if pa.types.is_list(field_type) or pa.types.is_fixed_size_list(field_type) else field_type
        if pa.types.is_string(value_type) or pa.types.is_large_string(value_type):
            columns.append(ColumnSpec.steps(column_name(name), pa.string(), source=name))
            continue
        if not (pa.types.is_integer(value_type) or pa.types.is_floating(value_type) or pa.types.is_boolean(value_type)):
            raise FormatError(f"{steps_path}: step column {name!r} of type {field_type} is not convertible")
        dtype = pa.array([], value_type).to_numpy(zero_copy_only=False).dtype
        width = _width(field_type)
        meta: dict[str, Any] = {"source": name}
        if name.startswith("observation.state."):
            component = name[len("observation.state."):]
            declared = state_space.get(component) or {}
            meta.update({k: v for k, v in declared.items() if k != "dim"})
            if declared.get("dim") is not None and width is not None and int(declared["dim"]) != width:
                raise FormatError(f"{steps_path}: {name} holds {width} values, observation_space.state.{component}.dim says {declared['dim']}")
            if component.startswith("joint_") and joints:
                if width is not None and width != len(joints):
                    raise FormatError(f"{steps_path}: {name} holds {width} values for the manifest's {len(joints)} robot joints")
                meta["names"] = [j.get("name") for j in joints]
        elif name == "action":
            dims = sorted((d for d in manifest["action_space"].get("dimensions") or [] if isinstance(d, dict)), key=lambda d: d.get("index", 0))
            if dims and width is not None and width != len(dims):
                raise FormatError(f"{steps_path}: action holds {width} values, action_space.dimensions defines {len(dims)}")
            if dims:
                meta.update(names=[d.get("name") for d in dims], units=[d.get("units") for d in dims],
                            ranges=[d.get("range", d.get("values")) for d in dims], kinds=[d.get("type") for d in dims])
            meta["action_space"] = {k: v for k, v in manifest["action_space"].items() if k != "dimensions"}
        if width is None and (pa.types.is_list(field_type) or pa.types.is_large_list(field_type)):
            raise FormatError(f"{steps_path}: step column {name!r} is a variable-length list; fixed-size vectors are expected")
        if width is None:
            columns.append(ColumnSpec.steps(column_name(name), value_type, **meta))
        else:
            columns.append(ColumnSpec.trajectory(column_name(name), dtype, width, **meta))
    return columns


def _camera_columns(episodes: pa.Table, images: dict, sensors: dict, fps: float, manifest_path: str) -> dict:
    """camera key -> (ColumnSpec, sensor); the union of observation_space.images and video_files."""
    keys = list(images)
    if "video_files" in episodes.column_names:
        struct = episodes.schema.field("video_files").type
        keys += [struct.field(i).name for i in range(struct.num_fields) if struct.field(i).name not in keys]
    first = episodes.slice(0, 1).to_pylist()[0]
    cameras = {}
    for key in keys:
        sensor = sensors.get(images.get(key, key)) or {}
        if key in images and not sensor:
            raise FormatError(f"{manifest_path}: observation_space.images.{key} names sensor {images[key]!r}, which is not in sensors")
        path = ((first.get("video_files") or {}).get(key)) or ""
        depth = sensor.get("type") == "depth_camera"
        resolution = sensor.get("resolution") or {}
        meta = {"source": f"observation.images.{key}", "sensor": sensor.get("name"), "fps": fps,
                "source_fps": sensor.get("fps"), "resolution": resolution or None, "is_depth_map": depth}
        if sensor.get("fps") and float(sensor["fps"]) != fps:
            meta["retimed"] = True  # frames repeated or dropped to one per step (frame_index)
        meta.update({k: sensor[k] for k in ("mount", "mount_link", "intrinsics", "extrinsics", "depth_units", "depth_range", "bit_depth")
                     if k in sensor})
        if path.endswith(".npz"):
            spec = ColumnSpec(column_name(key), FILE, pa.string(), {"type": "depth" if depth else "npz", "format": "npz", **meta})
        else:
            codec = _CODECS.get(str(sensor.get("encoding", "")).lower())
            pix_fmt = "gray16le" if depth and int(sensor.get("bit_depth") or 16) > 8 else None
            spec = ColumnSpec(column_name(key, camera=True), VIDEO, pa.string(), {**meta, "codec": codec, "pix_fmt": pix_fmt})
        cameras[key] = (spec, sensor)
    return cameras


def _episode_camera(row: dict, key: str, spec: ColumnSpec, sensor: dict, chunk_files: dict, position: int,
                    sequence_id: str, episodes_path: str) -> Camera:
    path = (row.get("video_files") or {}).get(key)
    if not path:
        path = f"videos/{key}/chunk-{int(row['chunk_id']):03d}/episode_{position:06d}.mp4"
    npz = spec.kind == FILE
    if path.endswith(".npz") != npz:
        raise FormatError(f"{episodes_path}: {sequence_id}: camera {key!r} is {path!r}, other episodes store it as "
                          f"{'NPZ' if npz else 'MP4'}")
    return Camera(spec.name, key, path, float(sensor.get("fps") or 0.0), npz)


def load(fs: fsspec.AbstractFileSystem, root: str, ref: EpisodeRef, meta: DatasetMeta) -> Sequence:
    path = storage.resolve_inside(root, ref.steps_file, what="steps file", fs=fs)
    try:
        table = _episode_rows(fs, path, ref, meta)
        return _to_sequence(fs, root, table, ref, meta)
    except ConversionError as error:
        raise in_context(error, file=path, sequence=ref.sequence_id) from error
    except (OSError, pa.ArrowException) as error:
        raise FormatError(f"{path}: {ref.sequence_id}: cannot read steps: {error}") from error


def _episode_rows(fs, path: str, ref: EpisodeRef, meta: DatasetMeta) -> pa.Table:
    metadata = _footer(fs, path, meta.plan_id)
    position = next((i for i in range(metadata.num_columns) if metadata.schema.column(i).path == "episode_id"), None)
    if position is None:
        raise FormatError("steps have no episode_id column")
    groups, offsets, offset = [], [], 0
    for group in range(metadata.num_row_groups):
        stats = metadata.row_group(group).column(position).statistics
        if stats is None or not stats.has_min_max or stats.min <= ref.episode_id <= stats.max:
            groups.append(group)
            offsets.append(offset)
        offset += metadata.row_group(group).num_rows
    with fs.open(path, "rb") as handle:
        parquet = pq.ParquetFile(handle, metadata=metadata)
        parts = []
        for group, group_offset in zip(groups, offsets):
            part = parquet.read_row_group(group)
            mask = pc.equal(part.column("episode_id"), ref.episode_id)
            rows = np.flatnonzero(mask.to_numpy(zero_copy_only=False))
            if len(rows):
                parts.append((group_offset + int(rows[0]), part.filter(mask)))
    if not parts:
        raise FormatError(f"episode {ref.episode_id!r} has no steps in this file (its chunk_id points here)")
    table = pa.concat_tables([part for _, part in parts])
    if table.num_rows != ref.length:
        raise FormatError(f"episodes.parquet says {ref.length} steps, the steps file holds {table.num_rows} for this episode")
    first_row = parts[0][0]
    if ref.start_step not in (first_row, ref.chunk_base + first_row):
        raise FormatError(f"start_step {ref.start_step} does not match the episode's rows (row {first_row} of the file)")
    return table


def _to_sequence(fs, root: str, table: pa.Table, ref: EpisodeRef, meta: DatasetMeta) -> Sequence:
    length = ref.length
    if "step_index" in table.column_names:
        steps = table.column("step_index").to_numpy()
        if not np.array_equal(steps, np.arange(length)):
            order = np.argsort(steps, kind="stable")
            if not np.array_equal(steps[order], np.arange(length)):
                raise FormatError(f"step_index is not 0..{length - 1}")
            table = table.take(pa.array(order))
    if "timestamp" in table.column_names:
        raw = table.column("timestamp").to_numpy().astype(np.float64)
        timestamp = raw - raw[0]
    else:
        timestamp = np.arange(length, dtype=np.float64) / meta.fps
    sequence = Sequence(ref.sequence_id, length, timestamp)
    sequence.scalars.update(dict(ref.scalars))
    for spec in meta.columns:
        source = spec.meta.get("source")
        if spec.kind == "trajectory":
            column = table.column(source).combine_chunks()
            values = column.flatten().to_numpy(zero_copy_only=False)
            if values.size != length * spec.meta["dim"]:
                raise FormatError(f"{source}: {values.size} values for {length} steps x {spec.meta['dim']}")
            sequence.trajectories[spec.name] = values.astype(spec.meta["dtype"], copy=False).reshape(length, spec.meta["dim"])
        elif spec.kind == "steps":
            column = table.column(source).combine_chunks()
            if column.type != spec.arrow_type.value_type:
                column = column.cast(spec.arrow_type.value_type)
            sequence.steps[spec.name] = column
    for camera in ref.cameras:
        sequence_item = _camera(table, camera, length, meta.fps)
        if camera.npz:
            sequence.files[camera.column] = sequence_item
        else:
            sequence.videos[camera.column] = sequence_item
    if ref.audio:
        sequence.files["audio"] = FileRef(ref.audio)
    if ref.annotations:
        _annotations(fs, root, ref, sequence)
    return sequence


def _camera(table: pa.Table, camera: Camera, length: int, fps: float):
    if camera.npz:
        return FileRef(camera.path)
    key = f"observation.images.{camera.key}.frame_index"
    if key not in table.column_names:
        return VideoSegment(camera.path, length)
    indices = table.column(key).to_numpy()
    if (indices < 0).any():
        raise FormatError(f"{key} has negative values")
    if np.array_equal(indices, np.arange(length)):
        return VideoSegment(camera.path, length)  # the file is the episode: a byte copy (frame count checked)
    first = int(indices[0])
    if np.array_equal(indices, np.arange(first, first + length)) and camera.fps in (0.0, fps):
        return VideoSegment(camera.path, length, start=first / fps, end=(first + length) / fps)
    return VideoSegment(camera.path, length, frame_indices=tuple(int(i) for i in indices))


def _annotations(fs, root: str, ref: EpisodeRef, sequence: Sequence) -> None:
    folder = storage.resolve_inside(root, ref.annotations, what="annotations folder", fs=fs)
    names = sorted(posixpath.basename(p) for p in fs.ls(folder, detail=False)) if fs.exists(folder) else []
    sequence.scalars["scene_objects"] = None
    if "scene_objects.json" in names:
        text = fs.cat_file(storage.join(folder, "scene_objects.json")).decode("utf-8")
        try:
            json.loads(text)
        except json.JSONDecodeError as error:
            raise FormatError(f"{folder}/scene_objects.json: malformed JSON: {error}") from error
        sequence.scalars["scene_objects"] = text
    others = [name for name in names if name != "scene_objects.json"]
    sequence.files["annotation_files"] = [FileRef(f"{ref.annotations}/{name}") for name in others] if others else None
