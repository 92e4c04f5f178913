"""L5Kit zarr reader (specs/l5kit-dataset-format.md): one Mixtrain row per scene.

Layout: a zarr v2 group with structured 1-D arrays `scenes`, `frames`, `agents` and (format
version 2) `traffic_light_faces`, and root attributes `format_version` and `labels`:

  scenes[s].frame_index_interval                  [start, end) rows of `frames`
  frames[f].agent_index_interval                  [start, end) rows of `agents`
  frames[f].traffic_light_faces_index_interval    [start, end) rows of `traffic_light_faces`

`plan` reads only the root attributes, every array's `.zarray` and the `scenes` array (small:
96 bytes a scene). `load` reads one scene's frames, then the one contiguous slice of agents (and
faces) its frames point into, chunk by chunk (formats/sources/l5kit/zarr_v2.py); never a whole array.

Quirk of the real data: a scene's `start_time`/`end_time` do not match its frames' timestamps,
so time comes from frames (`timestamp` in seconds from the first frame; raw `timestamp_ns`).
"""

from __future__ import annotations

import dataclasses

import fsspec
import numpy as np
import pyarrow as pa

from formats import sources, storage
from formats.errors import ConversionError, FormatError, in_context
from formats.sequence import (
    SCALAR,
    ColumnSpec,
    DatasetMeta,
    Sequence,
    base_columns,
    check_unique_columns,
    column_name,
    episode_field_columns,
    episode_field_values,
    rebased_timestamps,
)
from formats.sources import Source, SourceReader, SourceRef
from formats.sources.l5kit.zarr_v2 import ZarrArray

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
class SceneRef(SourceRef):
    """One scene's address: its frame rows; small and picklable."""

    scene_index: int
    sequence_id: str
    length: int
    frame_start: int
    frame_end: int
    host: str
    start_time: int
    end_time: int
    extras: tuple = ()  # (column, value) of scene fields beyond the format's
    # Average bytes a frame's agents and faces take (not part of the scene's identity: no repr).
    agent_bytes_per_frame: float = dataclasses.field(default=0.0, repr=False)
    # The `frames` chunk the scene starts in (None: not known); where it is, not what it is: no repr.
    frames_chunk: int | None = dataclasses.field(default=None, repr=False)

    @property
    def estimated_steps(self) -> int:
        return self.length

    @property
    def estimated_bytes(self) -> float:
        return self.length * self.agent_bytes_per_frame

    @property
    def read_group(self) -> str | None:
        """Scenes starting in the same `frames` chunk: loaded one after another by one reader,
        they decode that chunk, and the agents and faces chunks their frames point into (agents
        are stored in frame order), once each; the reader's chunk cache keeps the last chunks it
        decoded. A scene running into the next chunk shares it with the next group: that chunk
        is decoded once more only when the two groups go to different readers."""
        return f"frames#{self.frames_chunk}" if self.frames_chunk is not None else None


def _python(value):
    value = np.asarray(value)
    if value.dtype.kind == "U":
        return value.tolist()
    return value.item() if value.ndim == 0 else value.reshape(-1).tolist()


def _check_coverage(scenes: np.ndarray, frame_rows: int, path: str) -> None:
    """Scenes must tile the frames: a frame outside every scene would not reach any row."""
    intervals = np.asarray(scenes["frame_index_interval"], np.int64).reshape(-1, 2)
    order = np.argsort(intervals[:, 0], kind="stable")
    covered = 0
    for index in order:
        start, end = (int(v) for v in intervals[index])
        if start > covered:
            raise FormatError(f"{path}: frames [{covered}, {start}) belong to no scene; they would be dropped")
        if start < covered and end > start:
            raise FormatError(f"{path}: scene_{index:06d} overlaps frames of an earlier scene (from frame {start})")
        covered = max(covered, end)
    if covered < frame_rows:
        raise FormatError(f"{path}: frames [{covered}, {frame_rows}) belong to no scene; they would be dropped")


def detect(fs: fsspec.AbstractFileSystem, root: str) -> bool:
    return fs.exists(storage.join(root, ".zgroup")) and fs.exists(storage.join(root, "scenes", ".zarray"))


# Field shapes the format defines (the rest of a record is carried as found).
_SHAPES = {
    "scenes": {"frame_index_interval": (2,)},
    "frames": {"agent_index_interval": (2,), "traffic_light_faces_index_interval": (2,), "ego_translation": (3,),
               "ego_rotation": (3, 3), "timestamp": ()},
}


# Field kinds the reader interprets (numpy dtype.kind): intervals and clocks are integers (a
# float timestamp would be truncated), poses floats, the host a string.
_INTEGER, _FLOAT, _TEXT = "iu", "f", "U"
_KIND_NAMES = {_INTEGER: "an integer", _FLOAT: "a float", _TEXT: "a string"}
_KINDS = {
    "scenes": {"frame_index_interval": _INTEGER, "start_time": _INTEGER, "end_time": _INTEGER, "host": _TEXT},
    "frames": {"timestamp": _INTEGER, "agent_index_interval": _INTEGER, "traffic_light_faces_index_interval": _INTEGER,
               "ego_translation": _FLOAT, "ego_rotation": _FLOAT},
}


def _array(fs: fsspec.AbstractFileSystem, root: str, name: str, opened: dict) -> ZarrArray:
    """One reader per array, kept in `opened` (a SourceReader's, or one plan's): its chunk cache
    serves scenes sharing chunks."""
    if name not in opened:
        opened[name] = ZarrArray(fs, storage.join(root, name), root=root)
    return opened[name]


def _arrays(fs, root: str, with_faces: bool, opened: dict) -> dict[str, ZarrArray]:
    names = ["scenes", "frames", "agents"] + (["traffic_light_faces"] if with_faces else [])
    arrays = {name: _array(fs, root, name, opened) for name in names}
    for name, array in arrays.items():
        missing = [field for field in _REQUIRED[name] if field not in (array.dtype.names or ())]
        if missing:
            raise FormatError(f"{array.path}/.zarray: dtype lacks field(s) {missing} of the L5Kit {name} format")
        for field, kinds in _KINDS.get(name, {}).items():
            if field in array.dtype.names and array.dtype[field].base.kind not in kinds:
                raise FormatError(f"{array.path}/.zarray: field {field!r} is {array.dtype[field].base}, the L5Kit format defines "
                                  f"{_KIND_NAMES[kinds]}")
        for field, shape in _SHAPES.get(name, {}).items():
            if field in array.dtype.names and array.dtype[field].shape != shape:
                raise FormatError(f"{array.path}/.zarray: field {field!r} has shape {list(array.dtype[field].shape)}, "
                                  f"the L5Kit format defines {list(shape)}")
    return arrays


def _scene_field_type(kind: np.dtype) -> pa.DataType:
    arrow = pa.string() if kind.base.kind == "U" else pa.from_numpy_dtype(kind.base)
    return pa.list_(arrow) if kind.shape else arrow


def _extra_fields(dtype: np.dtype, name: str) -> list[str]:
    """Fields of `scenes`/`frames` beyond the format's: carried into the row, not dropped."""
    known = set(_REQUIRED[name]) | set(_SHAPES.get(name, {}))
    return [field for field in dtype.names if field not in known]


def plan(fs: fsspec.AbstractFileSystem, root: str, options: dict | None = None) -> tuple[DatasetMeta, list[SceneRef]]:
    """Read the attributes, the arrays' metadata and `scenes`; one SceneRef per scene."""
    attrs_path = storage.resolve_inside(root, ".zattrs", what="zarr file", fs=fs)
    attrs = storage.read_json(fs, attrs_path) or {}  # older datasets have no attributes
    version = attrs.get("format_version", 1)
    if version not in SUPPORTED_VERSIONS:
        raise FormatError(f"{attrs_path}: format_version {version!r} is not supported (known: {list(SUPPORTED_VERSIONS)})")
    opened: dict = {}
    frames_array = _array(fs, root, "frames", opened)
    with_faces = "traffic_light_faces_index_interval" in (frames_array.dtype.names or ()) and fs.exists(
        storage.join(root, "traffic_light_faces", ".zarray"))
    arrays = _arrays(fs, root, with_faces, opened)
    labels = attrs.get("labels")
    if labels is not None and not (isinstance(labels, list) and all(isinstance(label, str) for label in labels)):
        raise FormatError(f"{attrs_path}: labels must be a list of strings, found {labels!r}")
    label_count = arrays["agents"].dtype["label_probabilities"].shape[0] if arrays["agents"].dtype["label_probabilities"].shape else 1
    if labels is not None and len(labels) != label_count:
        raise FormatError(f"{attrs_path}: {len(labels)} labels but agents carry {label_count} label_probabilities")

    scenes = arrays["scenes"].read(0, len(arrays["scenes"]))
    refs = []
    frame_rows = len(arrays["frames"])
    agent_bytes = sum(len(a) * a.dtype.itemsize for n, a in arrays.items() if n in ("agents", "traffic_light_faces")) / max(frame_rows, 1)
    for index, scene in enumerate(scenes):
        start, end = (int(v) for v in scene["frame_index_interval"])
        sequence_id = f"scene_{index:06d}"
        if not 0 <= start <= end <= frame_rows:
            raise FormatError(f"{arrays['scenes'].path}: {sequence_id}: frame_index_interval [{start}, {end}) "
                              f"outside frames ({frame_rows} rows)")
        if start == end:
            raise FormatError(f"{arrays['scenes'].path}: {sequence_id}: scene has no frames")
        extras = episode_field_values(scene, _extra_fields(scenes.dtype, "scenes"), _python)
        refs.append(SceneRef(index, sequence_id, end - start, start, end, str(scene["host"]),
                             int(scene["start_time"]), int(scene["end_time"]), extras, agent_bytes,
                             start // arrays["frames"].chunk_length))
    _check_coverage(scenes, frame_rows, arrays["scenes"].path)

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
                              description="derived: atan2(R[1,0], R[0,0]); l5kit's rotation33_as_yaw agrees within 1e-7 rad"),
        _struct_column("agents", arrays["agents"].dtype, {
            "type": "agents", "source": "agents", "labels": labels, "stats_fields": list(AGENT_STATS_FIELDS),
            "units": {"centroid": "m", "extent": "m", "yaw": "rad", "velocity": "m/s"},
            "coordinate_frame": "world",
        }),
    ]
    columns += episode_field_columns({field: _scene_field_type(scenes.dtype[field]) for field in _extra_fields(scenes.dtype, "scenes")},
                                     "scenes.")
    for field in _extra_fields(arrays["frames"].dtype, "frames"):
        kind = arrays["frames"].dtype[field]
        if kind.base.kind == "U":
            columns.append(ColumnSpec.steps(column_name(field), pa.string(), source=f"frames.{field}"))
        elif kind.shape:
            columns.append(ColumnSpec.trajectory(column_name(field), kind.base, int(np.prod(kind.shape)), source=f"frames.{field}",
                                                 **({"shape": list(kind.shape)} if len(kind.shape) > 1 else {})))
        else:
            columns.append(ColumnSpec.steps(column_name(field), pa.from_numpy_dtype(kind), source=f"frames.{field}"))
    if with_faces:
        columns.append(_struct_column("traffic_light_faces", arrays["traffic_light_faces"].dtype, {
            "type": "traffic_light_faces", "source": "traffic_light_faces",
            "status_names": ["ACTIVE", "INACTIVE", "UNKNOWN"],  # l5kit TL_FACE_LABELS
        }))
    check_unique_columns(columns)
    meta = DatasetMeta.planned(
        FORMAT, storage.url_for(fs, root), FRAME_RATE_HZ, columns,
        {
            "format_version": version,
            "labels": labels,
            "frame_rate_hz": FRAME_RATE_HZ,
            "num_scenes": len(scenes),
            "num_frames": frame_rows,
            "num_agents": len(arrays["agents"]),
            "num_traffic_light_faces": len(arrays["traffic_light_faces"]) if with_faces else None,
            "dtypes": {name: str(array.dtype.descr) for name, array in arrays.items()},
        },
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


def _per_frame(array: ZarrArray, intervals: np.ndarray, what: str, first_frame: int) -> tuple[pa.ListArray, np.ndarray]:
    """One list per frame of the rows `intervals` [T, 2] point at, read as one covering slice."""
    starts, ends = intervals[:, 0].astype(np.int64), intervals[:, 1].astype(np.int64)
    counts = ends - starts
    if (counts < 0).any():
        frame = int(np.argmax(counts < 0))
        raise FormatError(f"frame {first_frame + frame}: {what}_index_interval [{starts[frame]}, {ends[frame]}) is reversed")
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
    return Reader(fs, root, meta).load(ref)


class Reader(SourceReader):
    """Opened once per worker: one ZarrArray per array, whose chunk cache serves neighbouring scenes."""

    def __init__(self, fs: fsspec.AbstractFileSystem, root: str, meta: DatasetMeta):
        super().__init__(fs, root, meta)
        self.opened: dict = {}

    def load(self, ref: SceneRef) -> Sequence:
        return _load(self.fs, self.root, ref, self.meta, self.opened)


def _load(fs, root: str, ref: SceneRef, meta: DatasetMeta, opened: dict) -> Sequence:
    path = storage.join(root, "frames")
    try:
        with_faces = any(spec.name == "traffic_light_faces" for spec in meta.columns)
        arrays = _arrays(fs, root, with_faces, opened)
        frames = arrays["frames"].read(ref.frame_start, ref.frame_end)
        if not with_faces and "traffic_light_faces_index_interval" in frames.dtype.names:
            faces = frames["traffic_light_faces_index_interval"]
            if (faces[:, 1] > faces[:, 0]).any():
                raise FormatError("frames point at traffic-light faces but the dataset has no traffic_light_faces array")
        timestamps = frames["timestamp"].astype(np.int64)
        rebased = rebased_timestamps(timestamps, FRAME_RATE_HZ, units_per_second=1e9, name="frames.timestamp")
        sequence = Sequence(ref.sequence_id, ref.length, rebased)
        sequence.scalars.update(scene_index=ref.scene_index, host=ref.host, start_time=ref.start_time,
                                end_time=ref.end_time, length=ref.length, duration_seconds=ref.length / FRAME_RATE_HZ)
        sequence.scalars.update(dict(ref.extras))
        for field in _extra_fields(frames.dtype, "frames"):
            values = frames[field]
            if values.dtype.kind == "U":
                sequence.steps[column_name(field)] = pa.array(values.tolist(), pa.string())
            elif values.ndim > 1:
                sequence.trajectories[column_name(field)] = np.ascontiguousarray(values).reshape(ref.length, -1)
            else:
                sequence.steps[column_name(field)] = np.ascontiguousarray(values)
        rotation = np.ascontiguousarray(frames["ego_rotation"], dtype=np.float64).reshape(ref.length, 9)
        sequence.steps["timestamp_ns"] = timestamps
        sequence.trajectories["ego_translation"] = np.ascontiguousarray(frames["ego_translation"], dtype=np.float64)
        sequence.trajectories["ego_rotation"] = rotation
        sequence.trajectories["ego_yaw"] = np.arctan2(rotation[:, 3], rotation[:, 0])[:, None]
        path = arrays["agents"].path
        sequence.steps["agents"], _ = _per_frame(arrays["agents"], frames["agent_index_interval"], "agent", ref.frame_start)
        if with_faces:
            path = arrays["traffic_light_faces"].path
            sequence.steps["traffic_light_faces"], _ = _per_frame(
                arrays["traffic_light_faces"], frames["traffic_light_faces_index_interval"], "traffic_light_faces", ref.frame_start)
        return sequence
    except ConversionError as error:
        raise in_context(error, file=path, sequence=ref.sequence_id) from error


class L5Kit(Source):
    id = FORMAT
    expects = "L5Kit a zarr group with scenes/.zarray"
    marker = "scenes/.zarray"
    shared_files = ("",)  # scenes share every chunk file: any change in the group reconverts all
    reader = Reader
    detect = staticmethod(detect)
    plan = staticmethod(plan)


SOURCE = sources.register(L5Kit())
