"""L5Kit zarr reader (specs/l5kit-dataset-format.md): one Mixtrain row per scene.

Layout: a zarr v2 group with structured 1-D arrays `scenes`, `frames`, `agents` and (format
version 2) `traffic_light_faces`, and root attributes `format_version` and `labels`:

  scenes[s].frame_index_interval                  [start, end) rows of `frames`
  frames[f].agent_index_interval                  [start, end) rows of `agents`
  frames[f].traffic_light_faces_index_interval    [start, end) rows of `traffic_light_faces`

`plan` reads only the root attributes, every array's `.zarray` and the `scenes` array (small:
96 bytes a scene). `load` reads one scene's frames, then the one contiguous slice of agents (and
faces) its frames point into, chunk by chunk (formats/zarr_v2.py); never a whole array.

Quirk of the real data: a scene's `start_time`/`end_time` do not match its frames' timestamps,
so time comes from frames (`timestamp` in seconds from the first frame; raw `timestamp_ns`).
"""

from __future__ import annotations

import dataclasses
import functools
import json

import fsspec
import numpy as np
import pyarrow as pa

from formats import storage
from formats.errors import ConversionError, FormatError, in_context
from formats.sequence import SCALAR, ColumnSpec, DatasetMeta, Sequence, base_columns
from formats.stats import ColumnStats, sketch_level_for
from formats.zarr_v2 import ZarrArray

__all__ = ["FORMAT", "SceneRef", "detect", "plan", "load", "FRAME_RATE_HZ"]

FORMAT = "l5kit"
# The Lyft Level 5 logs are sampled at 10 Hz (l5kit docs: "frames ... at 10 Hz").
FRAME_RATE_HZ = 10.0
SUPPORTED_VERSIONS = (1, 2)
AGENT_STATS_FIELDS = ("centroid", "velocity", "extent")
_REQUIRED = {
    "scenes": ("frame_index_interval", "host", "start_time", "end_time"),
    "frames": ("timestamp", "agent_index_interval", "ego_translation", "ego_rotation"),
    "agents": ("centroid", "extent", "yaw", "velocity", "track_id", "label_probabilities"),
    "traffic_light_faces": ("face_id", "traffic_light_id", "traffic_light_face_status"),
}


@dataclasses.dataclass(frozen=True)
class SceneRef:
    """One scene's address: its frame rows; small and picklable."""

    scene_index: int
    sequence_id: str
    length: int
    frame_start: int
    frame_end: int
    host: str
    start_time: int
    end_time: int


def detect(fs: fsspec.AbstractFileSystem, root: str) -> bool:
    return fs.exists(storage.join(root, ".zgroup")) and fs.exists(storage.join(root, "scenes", ".zarray"))


@functools.lru_cache(maxsize=16)
def _array(fs: fsspec.AbstractFileSystem, path: str) -> ZarrArray:
    """One reader per array and worker: its chunk cache serves consecutive scenes."""
    return ZarrArray(fs, path)


def _arrays(fs, root: str, with_faces: bool) -> dict[str, ZarrArray]:
    names = ["scenes", "frames", "agents"] + (["traffic_light_faces"] if with_faces else [])
    arrays = {name: _array(fs, storage.join(root, name)) for name in names}
    for name, array in arrays.items():
        missing = [field for field in _REQUIRED[name] if field not in (array.dtype.names or ())]
        if missing:
            raise FormatError(f"{array.path}/.zarray: dtype lacks field(s) {missing} of the L5Kit {name} format")
    return arrays


def plan(fs: fsspec.AbstractFileSystem, root: str, options: dict | None = None) -> tuple[DatasetMeta, list[SceneRef]]:
    """Read the attributes, the arrays' metadata and `scenes`; one SceneRef per scene."""
    attrs_path = storage.join(root, ".zattrs")
    attrs = {}
    if fs.exists(attrs_path):
        try:
            attrs = json.loads(fs.cat_file(attrs_path))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise FormatError(f"{attrs_path}: malformed JSON: {error}") from error
        if not isinstance(attrs, dict):
            raise FormatError(f"{attrs_path}: expected a JSON object")
    version = attrs.get("format_version", 1)
    if version not in SUPPORTED_VERSIONS:
        raise FormatError(f"{attrs_path}: format_version {version!r} is not supported (known: {list(SUPPORTED_VERSIONS)})")
    frames_array = _array(fs, storage.join(root, "frames"))
    with_faces = "traffic_light_faces_index_interval" in (frames_array.dtype.names or ()) and fs.exists(
        storage.join(root, "traffic_light_faces", ".zarray"))
    arrays = _arrays(fs, root, with_faces)
    labels = attrs.get("labels")
    label_count = arrays["agents"].dtype["label_probabilities"].shape[0] if arrays["agents"].dtype["label_probabilities"].shape else 1
    if labels is not None and len(labels) != label_count:
        raise FormatError(f"{attrs_path}: {len(labels)} labels but agents carry {label_count} label_probabilities")

    scenes = arrays["scenes"].read(0, len(arrays["scenes"]))
    refs = []
    frame_rows = len(arrays["frames"])
    for index, scene in enumerate(scenes):
        start, end = (int(v) for v in scene["frame_index_interval"])
        sequence_id = f"scene_{index:06d}"
        if not 0 <= start <= end <= frame_rows:
            raise FormatError(f"{arrays['scenes'].path}: {sequence_id}: frame_index_interval [{start}, {end}) "
                              f"outside frames ({frame_rows} rows)")
        if start == end:
            raise FormatError(f"{arrays['scenes'].path}: {sequence_id}: scene has no frames")
        refs.append(SceneRef(index, sequence_id, end - start, start, end, str(scene["host"]),
                             int(scene["start_time"]), int(scene["end_time"])))

    columns = base_columns() + [
        ColumnSpec("scene_index", SCALAR, pa.int64(), {"source": "scenes index"}),
        ColumnSpec("host", SCALAR, pa.string(), {"source": "scenes.host"}),
        ColumnSpec("start_time", SCALAR, pa.int64(), {"source": "scenes.start_time", "units": "ns"}),
        ColumnSpec("end_time", SCALAR, pa.int64(), {"source": "scenes.end_time", "units": "ns"}),
        ColumnSpec.steps("timestamp_ns", pa.int64(), source="frames.timestamp", units="ns", stats=False),
        ColumnSpec.trajectory("ego_translation", np.float64, 3, source="frames.ego_translation", names=["x", "y", "z"], units="m",
                              coordinate_frame="world"),
        ColumnSpec.trajectory("ego_rotation", np.float64, 9, source="frames.ego_rotation", shape=[3, 3],
                              description="row-major 3x3 rotation, world from ego", coordinate_frame="world"),
        ColumnSpec.trajectory("ego_yaw", np.float64, 1, source="frames.ego_rotation", units="rad",
                              description="derived: atan2(R[1,0], R[0,0]), l5kit's rotation33_as_yaw"),
        _struct_column("agents", arrays["agents"].dtype, {
            "type": "agents", "source": "agents", "labels": labels,
            "units": {"centroid": "m", "extent": "m", "yaw": "rad", "velocity": "m/s"},
            "coordinate_frame": "world",
        }),
    ]
    if with_faces:
        columns.append(_struct_column("traffic_light_faces", arrays["traffic_light_faces"].dtype, {
            "type": "traffic_light_faces", "source": "traffic_light_faces",
            "status_names": ["ACTIVE", "INACTIVE", "UNKNOWN"],  # l5kit TL_FACE_LABELS
        }))
    meta = DatasetMeta(
        format=FORMAT,
        uri=storage.url_for(fs, root),
        fps=FRAME_RATE_HZ,
        columns=columns,
        source={
            "format": FORMAT,
            "uri": storage.url_for(fs, root),
            "format_version": version,
            "labels": labels,
            "frame_rate_hz": FRAME_RATE_HZ,
            "num_scenes": len(scenes),
            "num_frames": frame_rows,
            "num_agents": len(arrays["agents"]),
            "num_traffic_light_faces": len(arrays["traffic_light_faces"]) if with_faces else None,
            "dtypes": {name: str(array.dtype.descr) for name, array in arrays.items()},
        },
        extra_bytes_per_step=sum(len(a) * a.dtype.itemsize for n, a in arrays.items() if n in ("agents", "traffic_light_faces"))
        / max(frame_rows, 1),
    )
    return meta, refs


def _arrow_field_type(dtype: np.dtype) -> pa.DataType:
    if dtype.subdtype is not None:
        base, shape = dtype.subdtype
        return pa.list_(_arrow_field_type(base), int(np.prod(shape)))
    if dtype.kind == "U":
        return pa.string()
    return pa.from_numpy_dtype(dtype)


def _struct_type(dtype: np.dtype) -> pa.StructType:
    """The source's record as an Arrow struct: field order, names and dtypes kept; subarrays
    become fixed-size lists (row-major)."""
    return pa.struct([pa.field(name, _arrow_field_type(dtype.fields[name][0])) for name in dtype.names])


def _struct_column(name: str, dtype: np.dtype, meta: dict) -> ColumnSpec:
    fields = {}
    for field in dtype.names:
        kind = dtype.fields[field][0]
        base, shape = kind.subdtype if kind.subdtype is not None else (kind, ())
        fields[field] = {"dtype": base.name if base.kind != "U" else "string", "shape": list(shape)}
    return ColumnSpec.steps(name, pa.list_(_struct_type(dtype)), fields=fields, **meta)


def _struct_array(records: np.ndarray) -> pa.StructArray:
    """Structured records -> a StructArray, one contiguous numpy copy per field."""
    arrays = []
    for name in records.dtype.names:
        values = np.ascontiguousarray(records[name])
        if values.dtype.kind == "U":
            arrays.append(pa.array(values, pa.string()))
        elif values.ndim > 1:
            width = int(np.prod(values.shape[1:]))
            arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), width))
        else:
            arrays.append(pa.array(values))
    return pa.StructArray.from_arrays(arrays, names=list(records.dtype.names))


def _per_frame(array: ZarrArray, intervals: np.ndarray, what: str) -> tuple[pa.ListArray, np.ndarray]:
    """One list per frame of the rows `intervals` [T, 2] point at, read as one covering slice."""
    starts, ends = intervals[:, 0].astype(np.int64), intervals[:, 1].astype(np.int64)
    counts = ends - starts
    if (counts < 0).any():
        frame = int(np.argmax(counts < 0))
        raise FormatError(f"frame {frame}: {what}_index_interval [{starts[frame]}, {ends[frame]}) is reversed")
    low, high = int(starts.min()), int(ends.max())
    if low < 0 or high > len(array):
        raise FormatError(f"{what}_index_interval reaches [{low}, {high}), outside {array.path} ({len(array)} rows)")
    covering = array.read(low, high) if counts.sum() else array.read(0, 0)
    contiguous = bool((starts[1:] == ends[:-1]).all()) and starts[0] == low and ends[-1] == high
    if contiguous:
        records = covering
    else:  # not what l5kit writes, but the spec only promises intervals: gather them
        take = np.concatenate([np.arange(s, e) for s, e in zip(starts, ends)]) - low if counts.sum() else np.zeros(0, np.int64)
        records = covering[take]
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), _struct_array(records)), records


def load(fs: fsspec.AbstractFileSystem, root: str, ref: SceneRef, meta: DatasetMeta) -> Sequence:
    """Read one scene: its frames, then the agents (and faces) its frames point into."""
    path = storage.join(root, "frames")
    try:
        with_faces = any(spec.name == "traffic_light_faces" for spec in meta.columns)
        arrays = _arrays(fs, root, with_faces)
        frames = arrays["frames"].read(ref.frame_start, ref.frame_end)
        timestamps = frames["timestamp"].astype(np.int64)
        sequence = Sequence(ref.sequence_id, ref.length, (timestamps - timestamps[0]) / 1e9)
        sequence.scalars.update(scene_index=ref.scene_index, host=ref.host, start_time=ref.start_time,
                                end_time=ref.end_time, length=ref.length, duration_seconds=ref.length / FRAME_RATE_HZ)
        rotation = np.ascontiguousarray(frames["ego_rotation"], dtype=np.float64).reshape(ref.length, 9)
        sequence.steps["timestamp_ns"] = timestamps
        sequence.trajectories["ego_translation"] = np.ascontiguousarray(frames["ego_translation"], dtype=np.float64)
        sequence.trajectories["ego_rotation"] = rotation
        sequence.trajectories["ego_yaw"] = np.arctan2(rotation[:, 3], rotation[:, 0])[:, None]
        path = arrays["agents"].path
        sequence.steps["agents"], agents = _per_frame(arrays["agents"], frames["agent_index_interval"], "agent")
        for field in AGENT_STATS_FIELDS:
            if len(agents):
                values = np.asarray(agents[field], dtype=np.float64).reshape(len(agents), -1)
                sequence.extra_stats[f"agents.{field}"] = ColumnStats.of(values, sketch_level=sketch_level_for(len(values)))
        if with_faces:
            path = arrays["traffic_light_faces"].path
            sequence.steps["traffic_light_faces"], _ = _per_frame(
                arrays["traffic_light_faces"], frames["traffic_light_faces_index_interval"], "traffic_light_faces")
        return sequence
    except ConversionError as error:
        raise in_context(error, file=path, sequence=ref.sequence_id) from error
