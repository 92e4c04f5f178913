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

Why one module of ~560 lines: it is the ORTF plan alone (the manifest, episode and chunk checks the
spec lists, and the column planning they feed); the worker-side reading is formats/sources/ortf/rows.py.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from formats import sources, storage, video
from formats.errors import ColumnNameError, FormatError, VideoError, in_context
from formats.sequence import (
    FILE,
    SCALAR,
    VIDEO,
    ColumnSpec,
    DatasetMeta,
    Sequence,
    base_columns,
    check_span,
    check_unique_columns,
    column_name,
    episode_field_columns,
    episode_field_values,
    finite_number,
    int64_text,
    is_int,
    path_component,
    quoted,
    safe_sequence_id,
)
from formats.sources import Source
from formats.sources.ortf.rows import Camera, EpisodeRef, Reader

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
# Sizes no real recording has: a corrupt index, refused before anything is allocated for it.
MAX_EPISODE_STEPS = 10**9
MAX_RATE_HZ = 10**6
MAX_STATE_DIM = 10**6
# episodes.parquet column -> (Arrow type test, what the spec says it is); nulls allowed only where noted.
_EPISODE_TYPES = {
    "episode_id": (lambda t: _is_string(t) or pa.types.is_integer(t), "a string or an integer"),
    "start_step": (pa.types.is_integer, "an integer"),
    "end_step": (pa.types.is_integer, "an integer"),
    "length": (pa.types.is_integer, "an integer"),
    "chunk_id": (pa.types.is_integer, "an integer"),
    "task_id": (pa.types.is_integer, "an integer"),
    "duration_seconds": (lambda t: pa.types.is_integer(t) or pa.types.is_floating(t), "a number"),
    "video_files": (lambda t: pa.types.is_struct(t) and all(_is_string(t.field(i).type) or pa.types.is_null(t.field(i).type)
                                                            for i in range(t.num_fields)), "a struct of paths"),
    "audio_file": (lambda t: _is_string(t) or pa.types.is_null(t), "a path"),
}
_NULLABLE = {"task_id", "duration_seconds", "video_files", "audio_file"}


def detect(fs: fsspec.AbstractFileSystem, root: str) -> bool:
    return fs.exists(storage.join(root, MANIFEST))


def _is_string(field_type: pa.DataType) -> bool:
    return pa.types.is_string(field_type) or pa.types.is_large_string(field_type)


def _manifest(fs, root: str) -> dict:
    path = storage.resolve_inside(root, MANIFEST, what="manifest", fs=fs)
    manifest = storage.read_json(fs, path, missing="not found (required by ORTF v0.2)")
    missing = [key for key in REQUIRED_MANIFEST if key not in manifest]
    if missing:
        raise FormatError(f"{path}: required field(s) {missing} missing")
    for key, kind in REQUIRED_MANIFEST.items():
        if not isinstance(manifest[key], kind):
            raise FormatError(f"{path}: {key!r} must be a {kind.__name__}, found {type(manifest[key]).__name__}")
    if manifest["ortf_version"] not in SUPPORTED_VERSIONS:
        raise FormatError(f"{path}: ortf_version {manifest['ortf_version']!r} is not supported (only {', '.join(SUPPORTED_VERSIONS)})")
    _check_manifest_types(manifest, path)
    return manifest


def _check_manifest_types(manifest: dict, path: str) -> None:
    """The manifest fields this reader interprets, checked for their JSON types (a list where the
    spec has an object, a word where it has a number) so a bad manifest is one clear line."""
    def fail(where: str, wanted: str, value) -> None:
        found = type(value).__name__ if wanted in ("an object", "a list", "a string") else quoted(value)
        raise FormatError(f"{path}: {where} must be {wanted}, found {found}")

    def positive_number(value) -> bool:
        return finite_number(value) and value > 0

    space = manifest["observation_space"]
    for key in ("images", "state"):
        if space.get(key) is not None and not isinstance(space[key], dict):
            fail(f"observation_space.{key}", "an object", space[key])
    for camera, sensor in (space.get("images") or {}).items():
        if not isinstance(sensor, str):
            fail(f"observation_space.images.{camera}", "a sensor name", sensor)
    for component, declared in (space.get("state") or {}).items():
        if declared is not None and not isinstance(declared, dict):
            fail(f"observation_space.state.{component}", "an object", declared)
        dim = (declared or {}).get("dim")
        if dim is not None and not (isinstance(dim, int) and not isinstance(dim, bool) and dim > 0):
            fail(f"observation_space.state.{component}.dim", "a positive integer", dim)
        if dim is not None and dim > MAX_STATE_DIM:
            raise FormatError(f"{path}: observation_space.state.{component}.dim {dim} is not plausible (more than {MAX_STATE_DIM:.0e})")
    for number, sensor in enumerate(manifest["sensors"]):
        if not isinstance(sensor, dict):
            fail(f"sensors[{number}]", "an object", sensor)
        if sensor.get("name") is not None and not isinstance(sensor["name"], str):  # a camera names its sensor by it
            fail(f"sensors[{number}].name", "a string", sensor["name"])
        if sensor.get("fps") is not None and not positive_number(sensor["fps"]):
            fail(f"sensors[{number}].fps", "a positive number", sensor["fps"])
        if sensor.get("resolution") is not None and not isinstance(sensor["resolution"], dict):
            fail(f"sensors[{number}].resolution", "an object", sensor["resolution"])
    lists = (("robot.joints", manifest["robot"].get("joints")), ("action_space.dimensions", manifest["action_space"].get("dimensions")))
    for where, entries in lists:
        if entries is None:
            continue
        if not isinstance(entries, list):
            fail(where, "a list", entries)
        for number, entry in enumerate(entries):
            if not isinstance(entry, dict):
                fail(f"{where}[{number}]", "an object", entry)
            if "index" in entry and not (isinstance(entry["index"], int) and not isinstance(entry["index"], bool)):
                fail(f"{where}[{number}].index", "an integer", entry["index"])
    rate = manifest["action_space"].get("control_frequency_hz")
    if rate is not None and not positive_number(rate):
        fail("action_space.control_frequency_hz", "a positive number", rate)
    if rate is not None and rate > MAX_RATE_HZ:
        raise FormatError(f"{path}: action_space.control_frequency_hz {rate!r} is not plausible (more than {MAX_RATE_HZ:.0e} Hz)")


def _check_episode_types(episodes: pa.Table, path: str) -> None:
    """Each column of the episode index the reader interprets has the spec's type; required ones
    hold no nulls; sizes are plausible. A chunk_id stored as text would otherwise be read as a
    number, and a float one truncated to another chunk."""
    for name, (accepts, wanted) in _EPISODE_TYPES.items():
        if name not in episodes.column_names:
            continue
        column = episodes.column(name)
        if not accepts(column.type) and not (name in _NULLABLE and pa.types.is_null(column.type)):
            raise FormatError(f"{path}: column {name!r} is {column.type}, expected {wanted}")
        if name not in _NULLABLE and column.null_count:
            row = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
            raise FormatError(f"{path}: column {name!r} is null in row {row}")
    for name, low in (("chunk_id", 0), ("start_step", 0), ("end_step", 0), ("length", 1)):
        values = episodes.column(name).to_numpy(zero_copy_only=False) if name in episodes.column_names else np.zeros(0)
        bad = np.flatnonzero(values < low)
        if len(bad):
            raise FormatError(f"{path}: {name} {values[bad[0]]} in row {int(bad[0])} is {'negative' if low == 0 else 'not positive'}")
    lengths = episodes.column("length").to_numpy(zero_copy_only=False)
    if len(lengths) and lengths.max() > MAX_EPISODE_STEPS:
        row = int(np.argmax(lengths))
        raise FormatError(f"{path}: length {lengths[row]} in row {row} is not plausible (more than {MAX_EPISODE_STEPS:.0e} steps)")


def _tasks(fs, root: str) -> dict[int, dict]:
    path = storage.resolve_inside(root, "meta/tasks.jsonl", what="task list", fs=fs)
    if not fs.exists(path):
        return {}
    tasks = {}
    for number, raw in storage.text_lines(fs, path):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise FormatError(f"{path}: line {number}: not UTF-8 text: {error}") from error
        if not line.strip():
            continue
        try:
            task = json.loads(line)
            task_id = task["task_id"]
        except (KeyError, TypeError, ValueError, RecursionError) as error:  # ValueError: bad JSON, the int digit limit; nesting
            raise FormatError(f"{path}: line {number} is not a task object with a task_id: {error}") from error
        if isinstance(task_id, float) and task_id.is_integer():  # 3.0: a float column's to_json
            task_id = int(task_id)
        if not is_int(task_id):  # int64 (ORTF v0.2): 2.7 was truncated to another task's id, Infinity overflowed
            raise FormatError(f"{path}: line {number}: task_id must be an integer, found {quoted(task_id)}")
        for key in ("instruction", "type"):  # they become string columns: anything else failed in the writer
            if task.get(key) is not None and not isinstance(task[key], str):
                raise FormatError(f"{path}: line {number}: {key} must be a string, found {quoted(task[key])}")
        tasks[task_id] = task
    return tasks


def _chunk_file(fs, root: str, chunk: int, cache: dict) -> str:
    if chunk not in cache:
        for width in (3, 6):
            relative = f"data/chunk-{chunk:0{width}d}/steps.parquet"
            if fs.exists(storage.resolve_inside(root, relative, what="steps file", fs=fs)):
                cache[chunk] = relative
                break
        else:
            raise FormatError(f"{storage.join(root, f'data/chunk-{chunk:03d}/steps.parquet')}: not found (chunk_id {chunk})")
    return cache[chunk]


def _steps_schema(fs, root: str, chunks: list[int], chunk_files: dict, footers: storage.ParquetFooters) -> pa.Schema:
    """The steps schema, the same in every chunk file (one footer each): drift is an error here,
    not a column silently missing from some episodes."""
    schema = None
    first = None
    for chunk in chunks:
        relative = _chunk_file(fs, root, chunk, chunk_files)
        path = storage.resolve_inside(root, relative, what="steps file", fs=fs)
        try:
            found = footers.schema(path)
        except (OSError, pa.ArrowException) as error:
            raise FormatError(f"{path}: cannot read the steps file: {error}") from error
        if schema is None:
            schema, first = found, relative
            continue
        missing = [n for n in schema.names if n not in found.names]
        extra = [n for n in found.names if n not in schema.names]
        changed = [f"{n} is {found.field(n).type} here, {schema.field(n).type} in {first}" for n in schema.names
                   if n in found.names and found.field(n).type != schema.field(n).type]
        if missing or extra or changed:
            details = "; ".join(filter(None, [missing and f"columns {missing} missing", extra and f"extra columns {extra}", *changed]))
            raise FormatError(f"{storage.join(root, relative)}: steps schema differs from {first}: {details}")
    return schema


def plan(fs: fsspec.AbstractFileSystem, root: str, options: dict | None = None) -> tuple[DatasetMeta, list[EpisodeRef]]:
    manifest = _manifest(fs, root)
    manifest_path = storage.join(root, MANIFEST)
    episodes_path = storage.resolve_inside(root, EPISODES, what="episode index", fs=fs)
    if not fs.exists(episodes_path):
        raise FormatError(f"{episodes_path}: not found (required by ORTF v0.2)")
    try:
        episodes = storage.read_parquet(fs, episodes_path)
    except (OSError, pa.ArrowException) as error:
        raise FormatError(f"{episodes_path}: cannot read the episode index: {error}") from error
    missing = [c for c in REQUIRED_EPISODE_COLUMNS if c not in episodes.column_names]
    if missing:
        raise FormatError(f"{episodes_path}: required column(s) {missing} missing")
    if episodes.num_rows == 0:
        raise FormatError(f"{episodes_path}: no episodes")
    _check_episode_types(episodes, episodes_path)
    tasks = _tasks(fs, root)
    fps = _step_rate(manifest, manifest_path)
    sensors = {sensor.get("name"): sensor for sensor in manifest["sensors"] if isinstance(sensor, dict)}
    images = (manifest["observation_space"].get("images") or {})
    rows = episodes.to_pylist()
    chunk_files: dict[int, str] = {}
    first_file = _chunk_file(fs, root, int(rows[0]["chunk_id"]), chunk_files)
    footers = storage.ParquetFooters(fs)
    schema = _steps_schema(fs, root, sorted({int(row["chunk_id"]) for row in rows}), chunk_files, footers)
    for name, accepts, wanted in (("timestamp", lambda t: pa.types.is_integer(t) or pa.types.is_floating(t), "a number"),
                                  ("step_index", pa.types.is_integer, "an integer")):
        if name in schema.names and not accepts(schema.field(name).type):
            raise FormatError(f"{storage.join(root, first_file)}: step column {name!r} is {schema.field(name).type}, expected {wanted}")

    columns = base_columns() + [ColumnSpec("episode_id", SCALAR, pa.string(), {"source": "episodes.episode_id"})]
    reference = manifest.get("timestamp_reference")
    if reference not in (None, "episode_start") and "timestamp" in schema.names:
        columns.append(ColumnSpec.steps("timestamp_s", pa.float64(), source="timestamp", units="s", reference=reference, stats=False,
                                        description="the source's own clock (timestamp starts at 0 per episode)"))
    if "task_id" in episodes.column_names:
        columns += [ColumnSpec("task", SCALAR, pa.string(), {"source": "tasks.jsonl instruction"}),
                    ColumnSpec("task_type", SCALAR, pa.string(), {"source": "tasks.jsonl type"}),
                    ColumnSpec("task_id", SCALAR, pa.int64(), {"source": "episodes.task_id"})]
    extra = [name for name in episodes.column_names if name not in _EPISODE_LOCATORS and name != "episode_id"]
    columns += episode_field_columns({name: episodes.schema.field(name).type for name in extra}, "episodes.")
    columns += _step_columns(schema, manifest, manifest_path, storage.join(root, first_file),
                             _first_widths(fs, storage.join(root, first_file), schema, footers))
    cameras = _camera_columns(episodes, images, sensors, fps, manifest_path, schema)
    cameras = {key: (_probe_camera(fs, root, spec, rows, key, chunk_files, episodes_path), sensor) for key, (spec, sensor) in cameras.items()}
    columns += [spec for spec, _ in cameras.values()]
    with_audio = "audio_file" in episodes.column_names and pc.any(pc.is_valid(episodes.column("audio_file"))).as_py()
    if with_audio:
        audio = next((s for s in sensors.values() if s.get("type") == "audio"), {})
        columns.append(ColumnSpec("audio", FILE, pa.string(), {"type": "audio", "source": "episodes.audio_file",
                                                               **{k: audio[k] for k in ("sample_rate", "channels", "codec") if k in audio}}))
    annotation_folders = ({p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(storage.join(root, "annotations"), detail=False)}
                          if fs.exists(storage.join(root, "annotations")) else set())
    with_annotations = bool(annotation_folders)
    if with_annotations:
        columns += [ColumnSpec("scene_objects", SCALAR, pa.string(), {"type": "json", "source": "annotations/episode_*/scene_objects.json"}),
                    ColumnSpec("annotation_files", FILE, pa.list_(pa.string()), {"type": "image", "source": "annotations/episode_*/"})]
    check_unique_columns(columns, manifest_path)
    if with_annotations and not any(_annotation_folder(annotation_folders, row, i) for i, row in enumerate(rows)):
        raise FormatError(f"{storage.join(root, 'annotations')}: no folder matches an episode (expected episode_XXXXXX "
                          "by episode number, or episode_<episode_id>)")

    chunk_base: dict[int, int] = {}
    for row in rows:
        chunk_base[int(row["chunk_id"])] = min(chunk_base.get(int(row["chunk_id"]), 1 << 62), int(row["start_step"]))
    refs, seen = [], {}
    for position, row in enumerate(rows):
        episode_id = str(row["episode_id"])
        sequence_id = safe_sequence_id(episode_id)
        if row["episode_id"] is None:
            raise FormatError(f"{episodes_path}: row {position} has no episode_id")
        try:  # made safe character by character above; '', '.', '..' or an overlong id are refused
            path_component(sequence_id, f"episode_id {quoted(episode_id)} as sequence id")
        except FormatError as error:
            raise FormatError(f"{episodes_path}: row {position}: {error}") from None
        if sequence_id in seen:
            raise ColumnNameError(f"{episodes_path}: episode ids {seen[sequence_id]!r} and {episode_id!r} both become "
                                  f"sequence id {sequence_id!r}")
        seen[sequence_id] = episode_id
        length = int(row["length"])
        try:
            check_span(row["start_step"], row["end_step"], length, ("start_step", "end_step"))
        except FormatError as error:
            raise in_context(error, file=episodes_path, sequence=sequence_id) from None
        if length <= 0:
            raise FormatError(f"{episodes_path}: {sequence_id}: episode has no steps")
        scalars: dict[str, Any] = {"episode_id": episode_id, "length": length}
        scalars["duration_seconds"] = float(row["duration_seconds"]) if row.get("duration_seconds") is not None else length / fps
        if "task_id" in row:
            task = tasks.get(int(row["task_id"])) if row["task_id"] is not None else None
            if row["task_id"] is not None and task is None and tasks:
                raise FormatError(f"{episodes_path}: {sequence_id}: task_id {row['task_id']} is not in meta/tasks.jsonl")
            scalars.update(task_id=row["task_id"], task=(task or {}).get("instruction"), task_type=(task or {}).get("type"))
        scalars.update(episode_field_values(row, extra))
        episode_cameras = tuple(_episode_camera(row, key, spec, camera, chunk_files, position, sequence_id, episodes_path)
                                for key, (spec, camera) in cameras.items())
        try:  # every file the episode reads, resolved inside the root before anything opens it
            for relative, what in [(c.path, "video file") for c in episode_cameras if c is not None] + (
                    [(row["audio_file"], "audio file")] if with_audio and row.get("audio_file") else []):
                storage.resolve_inside(root, relative, what=what, fs=fs)
        except FormatError as error:
            raise in_context(error, file=episodes_path, sequence=sequence_id) from error
        refs.append(EpisodeRef(
            position=position, episode_id=episode_id, episode_key=row["episode_id"], sequence_id=sequence_id, length=length,
            steps_file=_chunk_file(fs, root, int(row["chunk_id"]), chunk_files),
            start_step=int(row["start_step"]), end_step=int(row["end_step"]), chunk_base=chunk_base[int(row["chunk_id"])],
            cameras=episode_cameras, audio=row.get("audio_file") if with_audio else None,
            annotations=_annotation_folder(annotation_folders, row, position),
            scalars=tuple(scalars.items()),
        ))
    meta = DatasetMeta(
        format=FORMAT,
        uri=storage.url_for(fs, root),
        fps=fps,
        columns=columns,
        source={"format": FORMAT, "uri": storage.url_for(fs, root), "manifest": manifest, "tasks": list(tasks.values()),
                "stats": storage.read_json(fs, storage.resolve_inside(root, "meta/stats.json", what="statistics file", fs=fs),
                                           want_object=False),
                # Dataset-level files rows do not reference (URDF, meshes): copied to files/_dataset/.
                "assets": sorted(p[len(root) + 1:] for p in fs.find(storage.join(root, "robot"))) if fs.exists(storage.join(root, "robot")) else []},
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


def _first_widths(fs, path: str, schema: pa.Schema, footers: storage.ParquetFooters) -> dict[str, int]:
    """Lengths of the first step's variable-length list columns (only read when there are some)."""
    names = [n for n in schema.names if pa.types.is_list(schema.field(n).type) or pa.types.is_large_list(schema.field(n).type)]
    if not names:
        return {}
    try:
        with storage.open_input(fs, path) as handle:
            first = storage.parquet_file(handle, metadata=footers.footer(path)).read_row_group(0, columns=names).slice(0, 1)
    except (OSError, pa.ArrowException) as error:
        raise FormatError(f"{path}: cannot read the steps file: {error}") from error
    return {n: len(first.column(n)[0]) for n in names if first.num_rows and first.column(n)[0].is_valid}


def _width(field_type: pa.DataType) -> int | None:
    return field_type.list_size if pa.types.is_fixed_size_list(field_type) else None


def _step_columns(schema: pa.Schema, manifest: dict, manifest_path: str, steps_path: str, first_widths: dict) -> list[ColumnSpec]:
    columns = []
    declared_width: dict[str, int] = {}
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
            if declared.get("dim") is not None:
                declared_width[name] = int(declared["dim"])
            meta.update({k: v for k, v in declared.items() if k != "dim"})
            if declared.get("dim") is not None and width is not None and int(declared["dim"]) != width:
                raise FormatError(f"{steps_path}: {name} holds {width} values, observation_space.state.{component}.dim says {declared['dim']}")
            if component.startswith("joint_") and joints:
                if width is not None and width != len(joints):
                    raise FormatError(f"{steps_path}: {name} holds {width} values for the manifest's {len(joints)} robot joints")
                meta["names"] = [j.get("name") for j in joints]
        elif name == "action":
            dims = sorted((d for d in manifest["action_space"].get("dimensions") or [] if isinstance(d, dict)), key=lambda d: d.get("index", 0))
            if dims:
                declared_width[name] = len(dims)
            if dims and width is not None and width != len(dims):
                raise FormatError(f"{steps_path}: action holds {width} values, action_space.dimensions defines {len(dims)}")
            if dims:
                meta.update(names=[d.get("name") for d in dims], units=[d.get("units") for d in dims],
                            ranges=[d.get("range", d.get("values")) for d in dims], kinds=[d.get("type") for d in dims])
            meta["action_space"] = {k: v for k, v in manifest["action_space"].items() if k != "dimensions"}
        if width is None and (pa.types.is_list(field_type) or pa.types.is_large_list(field_type)):
            # list<float> as pandas/pyarrow writers store float32[N]: the width comes from the
            # manifest, or else from the data (every step is checked against it at load).
            width = declared_width.get(name) or first_widths.get(name)
            if not width:
                raise FormatError(f"{steps_path}: step column {name!r} is a variable-length list with no width to check it against")
        if width is None:
            columns.append(ColumnSpec.steps(column_name(name), value_type, **meta))
        else:
            columns.append(ColumnSpec.trajectory(column_name(name), dtype, width, **meta))
    return columns


def _camera_columns(episodes: pa.Table, images: dict, sensors: dict, fps: float, manifest_path: str, schema: pa.Schema) -> dict:
    """camera key -> (ColumnSpec, sensor): every camera the manifest, video_files or a
    frame_index column names (the spec's own example leaves depth out of observation_space)."""
    keys = list(images)
    if "video_files" in episodes.column_names:
        struct = episodes.schema.field("video_files").type
        keys += [struct.field(i).name for i in range(struct.num_fields) if struct.field(i).name not in keys]
    keys += [n[len("observation.images."):-len(".frame_index")] for n in schema.names
             if n.startswith("observation.images.") and n.endswith(".frame_index") and n[len("observation.images."):-len(".frame_index")] not in keys]
    files = episodes.column("video_files").to_pylist() if "video_files" in episodes.column_names else [None] * episodes.num_rows
    cameras = {}
    for key in keys:
        sensor = sensors.get(images.get(key, key)) or {}
        if key in images and not sensor:
            raise FormatError(f"{manifest_path}: observation_space.images.{key} names sensor {images[key]!r}, which is not in sensors")
        paths = [(entry or {}).get(key) for entry in files]
        path = next((p for p in paths if p), "")
        depth = sensor.get("type") == "depth_camera"
        resolution = sensor.get("resolution") or {}
        meta = {"source": f"observation.images.{key}", "sensor": sensor.get("name"), "fps": fps,
                "source_fps": sensor.get("fps"), "resolution": resolution or None, "is_depth_map": depth}
        if sensor.get("fps") and float(sensor["fps"]) != fps:
            meta["retimed"] = True  # frames repeated or dropped to one per step (frame_index)
        if any(p is None for p in paths) and any(paths):
            meta["optional"] = True  # some episodes have no file for this camera: null there
        meta.update({k: sensor[k] for k in ("mount", "mount_link", "intrinsics", "extrinsics", "depth_units", "depth_range", "bit_depth")
                     if k in sensor})
        if path.endswith(".npz"):
            spec = ColumnSpec(column_name(key), FILE, pa.string(), {"type": "depth" if depth else "npz", "format": "npz", **meta})
        else:
            codec = _CODECS.get(str(sensor.get("encoding", "")).lower())
            spec = ColumnSpec(column_name(key, camera=True), VIDEO, pa.string(), {**meta, "codec": codec, "pix_fmt": None})
        cameras[key] = (spec, sensor)
    return cameras


def _probe_camera(fs, root: str, spec: ColumnSpec, rows: list[dict], key: str, chunk_files: dict, episodes_path: str) -> ColumnSpec:
    """The first episode's file says what the camera really is: codec, pixel format (a 12-bit
    depth stays 12-bit), size. The sensor's declarations are kept where the file is silent."""
    if spec.kind != VIDEO:
        return spec
    for position, row in enumerate(rows):
        path = (row.get("video_files") or {}).get(key) or _default_video(row, key, position, chunk_files)
        try:
            full = storage.resolve_inside(root, path, what="video file", fs=fs)
        except FormatError as error:
            raise in_context(error, file=episodes_path, sequence=safe_sequence_id(str(row["episode_id"]))) from error
        if fs.exists(full):
            with storage.open_input(fs, full) as handle:
                try:
                    info = video.stream_info(handle)
                except VideoError as error:
                    raise in_context(error, file=full) from error
            meta = {**spec.meta, "codec": info.codec, "pix_fmt": info.pix_fmt,
                    "resolution": {"width": info.width, "height": info.height}}
            return dataclasses.replace(spec, meta=meta)
    return spec


def _annotation_folder(folders: set, row: dict, position: int) -> str | None:
    """annotations/episode_XXXXXX by the episode's number, or named by its id; None if absent."""
    for name in (f"episode_{_episode_number(row, position):06d}", f"episode_{row['episode_id']}", str(row["episode_id"])):
        if name in folders:
            return f"annotations/{name}"
    return None


def _default_video(row: dict, key: str, position: int, chunk_files: dict) -> str:
    """Where the spec puts a camera's file when video_files does not say: the chunk folder as the
    data uses it (3 or 6 digits), the episode's number (its id when numeric, else its row)."""
    chunk = int(row["chunk_id"])
    width = 6 if "chunk-" + f"{chunk:06d}" in chunk_files.get(chunk, "") else 3
    return f"videos/{key}/chunk-{chunk:0{width}d}/episode_{_episode_number(row, position):06d}.mp4"


def _episode_number(row: dict, position: int) -> int:
    number = int64_text(str(row["episode_id"]))
    return position if number is None else number


def _episode_camera(row: dict, key: str, spec: ColumnSpec, sensor: dict, chunk_files: dict, position: int,
                    sequence_id: str, episodes_path: str) -> Camera | None:
    path = (row.get("video_files") or {}).get(key)
    if not path and "video_files" in row and spec.meta.get("optional"):
        return None  # video_files has no entry for this camera in this episode
    if not path:
        path = _default_video(row, key, position, chunk_files)
    npz = spec.kind == FILE
    if path.endswith(".npz") != npz:
        raise FormatError(f"{episodes_path}: {sequence_id}: camera {key!r} is {path!r}, other episodes store it as "
                          f"{'NPZ' if npz else 'MP4'}")
    return Camera(spec.name, key, path, float(sensor.get("fps") or 0.0), npz)


def load(fs: fsspec.AbstractFileSystem, root: str, ref: EpisodeRef, meta: DatasetMeta) -> Sequence:
    return Reader(fs, root, meta).load(ref)


class ORTF(Source):
    id = FORMAT
    expects = "ORTF meta/manifest.json"
    marker = "meta/manifest.json"
    shared_files = (MANIFEST, "meta/tasks.jsonl")
    reader = Reader
    detect = staticmethod(detect)
    plan = staticmethod(plan)

    def incremental_units(self, refs: list[EpisodeRef]) -> tuple[list, list[str]]:
        """One unit per episode; the row position is not part of the episode: deleting another
        episode must not change its fingerprint."""
        units, shared = super().incremental_units(refs)
        return [(unit, dataclasses.replace(ref, position=-1)) for unit, ref in units], shared


SOURCE = sources.register(ORTF())
