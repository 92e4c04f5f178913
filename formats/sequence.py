"""The Sequence record every reader produces and the writer consumes, and the column naming rules.

A Sequence is one Mixtrain row before it becomes Arrow: one robot episode, driving scene or clip.
Its columns are declared once per dataset by `ColumnSpec`s (built at plan time from metadata
only), so every worker produces rows of the same schema without seeing the others.

Column kinds (`ColumnSpec.kind`):
  scalar      one value per sequence, any Arrow type (`length`, `task`, `episode_index`)
  timestamps  list<float64> seconds from the sequence's first step (the `timestamp` column)
  trajectory  list<fixed_size_list<dtype, D>>: a numpy [T, D] array per sequence
  steps       list<type>: one value per step, a numpy [T] array or an Arrow array of length T
  video       string path relative to the output root, one file per sequence and camera
  file        other files copied with the row (audio, depth NPZ, annotation images): a string
              path, or list<string> for several, relative to the output root
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from typing import Any

import numpy as np
import pyarrow as pa

from formats.errors import ColumnNameError, FormatError

__all__ = [
    "written_files",
    "ColumnSpec",
    "DatasetMeta",
    "base_columns",
    "Sequence",
    "VideoSegment",
    "ImageFrames",
    "FileRef",
    "column_name",
    "check_unique_columns",
    "safe_sequence_id",
    "path_component",
    "quoted",
    "rebased_timestamps",
    "episode_field_columns",
    "episode_field_values",
    "check_span",
    "RESERVED_COLUMNS",
]

SCALAR = "scalar"
TIMESTAMPS = "timestamps"
TRAJECTORY = "trajectory"
STEPS = "steps"
VIDEO = "video"
FILE = "file"
KINDS = (SCALAR, TIMESTAMPS, TRAJECTORY, STEPS, VIDEO, FILE)
# column_types `encoded_from` of a video column whose source stores one image per step.
FROM_IMAGES = "images"

# Columns the product itself defines; a source feature mapping onto one of these is a collision.
RESERVED_COLUMNS = ("sequence_id", "length", "duration_seconds", "timestamp", "task", "tasks", "split")


@dataclasses.dataclass(frozen=True)
class ColumnSpec:
    """One output column: its name, kind, Arrow type of the cell and its mixtrain.json entry.

    `arrow_type` is the type of the whole cell (for a trajectory `list<fixed_size_list<..>>`).
    `meta` is what `column_types[name]` holds besides `type` (dim, dtype, names, source, fps ...);
    scalars carry meta only when they come from a source feature (then `source` is recorded).
    """

    name: str
    kind: str
    arrow_type: pa.DataType
    meta: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown column kind {self.kind!r}")

    @staticmethod
    def trajectory(name: str, dtype: np.dtype, dim: int, **meta: Any) -> ColumnSpec:
        value_type = pa.from_numpy_dtype(np.dtype(dtype))
        return ColumnSpec(
            name,
            TRAJECTORY,
            pa.list_(pa.list_(value_type, dim)),
            {"dim": dim, "dtype": np.dtype(dtype).name, **meta},
        )

    @staticmethod
    def steps(name: str, value_type: pa.DataType, **meta: Any) -> ColumnSpec:
        return ColumnSpec(name, STEPS, pa.list_(value_type), dict(meta))


@dataclasses.dataclass(frozen=True, slots=True)  # slots: a ref per episode holds one; a million of them are planned at once
class VideoSegment:
    """Where a camera's frames for one sequence live in the source.

    `path` is relative to the source root (or an absolute URL). `start`/`end` are seconds in
    that file's presentation time, half-open [start, end); None means the whole file.
    `frames` is the number of frames the segment must hold (the sequence length).
    `frame_indices`, when given, says which frame of the file each step shows (a camera slower
    than the steps repeats frames): the frames are then picked and re-timed, not cut.
    """

    path: str
    frames: int
    start: float | None = None
    end: float | None = None
    frame_indices: tuple[int, ...] | None = None


@dataclasses.dataclass(frozen=True)
class FileRef:
    """A source file copied as is into files/<column>/: `path` relative to the source root."""

    path: str
    name: str | None = None  # its name under files/<column>/<id>/ when a row has several (default: the basename)


@dataclasses.dataclass
class ImageFrames:
    """A camera stored as one image per step: encoded JPEG/PNG bytes or uint8/uint16 arrays
    ([T, H, W, C] or a list). The video step encodes them into the camera's video file."""

    frames: Any
    source: str | None = None  # the file they were read from, named in errors

    def __len__(self) -> int:
        return len(self.frames)


@dataclasses.dataclass
class Sequence:
    """One Mixtrain row as numpy/Arrow values.

    Attributes:
      sequence_id: unique, deterministic id (the TFDS key contract: duplicates are an error).
      length: T, the number of timesteps.
      timestamp: [T] float64 seconds from the first step.
      scalars: column -> Python/numpy scalar or list (Arrow type from its ColumnSpec).
      trajectories: column -> [T, D] numpy array in the source dtype.
      steps: column -> [T] numpy array or a length-T Arrow array.
      videos: column -> VideoSegment or ImageFrames (before the video step), relative output
        path (after).
      files: column -> FileRef or list of FileRefs (before the copy step), relative output path(s)
        or None (after).
      extra_stats: stats.json key -> ColumnStats the reader or the video step computed itself
        (per-channel image statistics, L5Kit agent fields), merged per shard like column stats.
      video_notes: video column -> how its file was written when that is not what the column
        says (copy mode: a lossless encode of a cut whose packets could not be copied).
      source_facts: what the source said that the row does not keep, for the quality checks
        (formats/mixtrain/quality.py): `clock_start`, the source clock's first value in seconds.
    """

    sequence_id: str
    length: int
    timestamp: np.ndarray
    scalars: dict[str, Any] = dataclasses.field(default_factory=dict)
    trajectories: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    steps: dict[str, Any] = dataclasses.field(default_factory=dict)
    videos: dict[str, Any] = dataclasses.field(default_factory=dict)
    extra_stats: dict[str, Any] = dataclasses.field(default_factory=dict)
    files: dict[str, Any] = dataclasses.field(default_factory=dict)
    video_notes: dict[str, dict] = dataclasses.field(default_factory=dict)
    source_facts: dict[str, Any] = dataclasses.field(default_factory=dict)


def written_files(sequence: Sequence) -> list[str]:
    """The relative paths of the files a written row names (its videos and copied files, after
    the video step), sorted: what a reused row's files are linked from, what a resumption checks."""
    found = []
    for value in [*sequence.videos.values(), *sequence.files.values()]:
        for path in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(path, str) and "://" not in path:
                found.append(path)
    return sorted(found)


_OBSERVATION_PREFIXES = ("observation.", "observation/")
_CAMERA_PREFIXES = ("observation.images.", "observation/images/", "observation.image.")
_NON_NAME = re.compile(r"[^a-z0-9_]+")


def _snake(text: str) -> str:
    text = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", text).lower()
    text = _NON_NAME.sub("_", text.replace(".", "_").replace("/", "_"))
    return re.sub(r"_+", "_", text).strip("_")


@functools.lru_cache(maxsize=4096)  # called per episode for its fields while planning: one string per name, made once
def column_name(source_key: str, *, camera: bool = False) -> str:
    """Map a source feature key to its Mixtrain column name.

    Rules (docs/format.md), in order:
      camera/image feature             -> video_<X>   (X: key without its observation(.images) prefix)
      observation.state.X (ORTF)       -> obs_X
      observation.X / observation/X    -> obs_X
      episode_metadata/X (RLDS)        -> X
      anything else                    -> `.` and `/` become `_`, then snake_case [a-z0-9_]
    """
    key = source_key
    if key.startswith("steps/"):
        key = key[len("steps/"):]
    if camera:
        for prefix in _CAMERA_PREFIXES + _OBSERVATION_PREFIXES:
            if key.startswith(prefix):
                key = key[len(prefix):]
                break
        return "video_" + _snake(key)
    if key.startswith("observation.state."):
        return "obs_" + _snake(key[len("observation.state."):])
    for prefix in _OBSERVATION_PREFIXES:
        if key.startswith(prefix):
            return "obs_" + _snake(key[len(prefix):])
    if key.startswith("episode_metadata/"):
        return _snake(key[len("episode_metadata/"):])
    return _snake(key)


def check_unique_columns(columns: list[ColumnSpec], where: str | None = None) -> None:
    """Raise ColumnNameError naming both sources (and `where`, the metadata file that declares
    them) when two columns share a name: they would share one cell, and files/<column>/ folder."""
    seen: dict[str, str] = {}
    for spec in columns:
        origin = spec.meta.get("source", spec.name)
        if spec.name in seen:
            raise ColumnNameError(
                f"{where + ': ' if where else ''}source features {seen[spec.name]!r} and {origin!r} both map to column "
                f"{spec.name!r}; rename one in the source"
            )
        seen[spec.name] = origin


_ID_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def safe_sequence_id(raw: str) -> str:
    """Replace characters outside [A-Za-z0-9._-] with `_` (ids become file names)."""
    return _ID_UNSAFE.sub("_", raw)


# A name from the data that becomes one output path component (files/<column>/<sequence_id>.mp4)
# may hold none of these: separators, NUL, C0/C1 control characters and DEL.
_COMPONENT_UNSAFE = re.compile(r"[/\\\x00-\x1f\x7f-\x9f]")
# Longest such name in UTF-8 bytes: file systems allow 255 a component, and an extension or a
# temporary suffix is added to it.
MAX_COMPONENT_BYTES = 200


def path_component(name: str, what: str) -> str:
    """`name` unchanged when it can be one component of an output path, else a FormatError saying
    why: a split, camera, feature or episode id read from the data must never make a file land
    outside its folder (`../`), in another (`a/b`), or two names share one path.

    Refused: a non-string or empty name, `.` and `..`, `/` and `\\`, NUL and other control
    characters, more than MAX_COMPONENT_BYTES bytes of UTF-8. Callers add the file and the key."""
    if not isinstance(name, str):
        reason = f"is a {type(name).__name__}, not a string"
    elif not name:
        reason = "is empty"
    elif name in (".", ".."):
        reason = "is a relative folder name"
    elif (bad := _COMPONENT_UNSAFE.search(name)) is not None:
        reason = "holds a path separator" if bad.group() in "/\\" else f"holds the control character {bad.group()!r}"
    elif len(name) * 4 > MAX_COMPONENT_BYTES and len(name.encode("utf-8", "surrogatepass")) > MAX_COMPONENT_BYTES:
        reason = f"is longer than {MAX_COMPONENT_BYTES} bytes"
    else:
        return name
    raise FormatError(f"{what} {quoted(name)} cannot name an output file: it {reason}")


def quoted(value: object, limit: int = 60) -> str:
    """repr() of a value from the data for a message: control characters escaped, and a long one
    cut (a 200,000-character list or a 10**4000 made a message of that size)."""
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value)} characters)"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


# How far the median step may stray from 1 / fps before the declared rate counts as contradicted.
FPS_TOLERANCE = 0.10


def rebased_timestamps(raw: np.ndarray, fps: float | None, *, units_per_second: float = 1.0,
                       name: str = "timestamp") -> np.ndarray:
    """A sequence's source clock as the `timestamp` column: float64 seconds from its first step.

    Returns `(raw - raw[0]) / units_per_second` ([T] float64; the subtraction happens in the
    source dtype, so int64 nanoseconds stay exact). A clock that cannot be rebased faithfully is
    refused instead: one bad first value would shift every step, and a step backwards would be
    written as if time ran that way. The rule, checked in this order:
      1. every value is finite (no NaN/inf)           -> "non-finite value nan at step i"
      2. strictly increasing (no repeat, no step back) -> "not strictly increasing at step i (value a then b)"
      3. with T >= 2 and `fps` given: the median step s is within 10 % of 1 / fps
         (|s * fps - 1| <= 0.1)                          -> "median step s s contradicts the declared f fps ..."
    Forward gaps (dropped frames) are allowed: only the median has to match the rate.

    Args:
      raw: [T] source timestamps, any int or float dtype (T >= 1).
      fps: the rate the dataset declares (Hz), or None when it declares none.
      units_per_second: raw units in a second (1 for seconds, 1e9 for nanoseconds).
      name: the source field, first word of the message (callers add file and sequence).

    Raises:
      FormatError: the clock breaks the rule above.
    """
    raw = np.asarray(raw).reshape(-1)
    if raw.dtype.kind == "f":
        bad = np.flatnonzero(~np.isfinite(raw))
        if len(bad):
            raise FormatError(f"{name}: non-finite value {raw[bad[0]]} at step {int(bad[0])}")
    elif raw.dtype.kind not in "iu":
        raise FormatError(f"{name}: values of type {raw.dtype} are not a clock")
    if len(raw) > 1:
        back = np.flatnonzero(raw[1:] <= raw[:-1])
        if len(back):
            step = int(back[0]) + 1
            raise FormatError(f"{name}: not strictly increasing at step {step} (value {raw[step - 1]} then {raw[step]})")
    rebased = (raw - raw[0]) / units_per_second if len(raw) else raw.astype(np.float64)
    rebased = np.asarray(rebased, dtype=np.float64)
    steps = np.diff(rebased) if fps and len(raw) > 1 else None
    # Every step within the tolerance puts the median there too (np.median cost 0.1 ms a sequence).
    if steps is not None and not (abs(float(steps.min()) * fps - 1.0) <= FPS_TOLERANCE
                                  and abs(float(steps.max()) * fps - 1.0) <= FPS_TOLERANCE):
        median = float(np.median(steps))
        if abs(median * fps - 1.0) > FPS_TOLERANCE:
            raise FormatError(f"{name}: median step {median:.6g} s contradicts the declared {fps:g} fps "
                              f"({1 / fps:.6g} s a step) by more than {FPS_TOLERANCE:.0%}")
    return rebased


def episode_field_columns(types: dict[str, pa.DataType], source_prefix: str = "") -> list[ColumnSpec]:
    """One scalar column per episode-level field a format does not interpret itself (name -> Arrow
    type, in order): every source carries them into the row rather than dropping them."""
    return [ColumnSpec(column_name(name), SCALAR, kind, {"source": f"{source_prefix}{name}"}) for name, kind in types.items()]


def episode_field_values(row: Any, names: list[str], convert: Any = None) -> tuple[tuple[str, Any], ...]:
    """(column, value) of those fields for one episode's row (`convert`: e.g. numpy -> Python)."""
    return tuple((column_name(name), convert(row[name]) if convert else row[name]) for name in names)


def is_int(value: Any) -> bool:
    """A JSON integer (bool is an int to Python, not to JSON)."""
    return isinstance(value, int) and not isinstance(value, bool)


def int64_text(text: str) -> int | None:
    """The int64 a decimal text spells, or None: only ASCII digits ("²" is a digit to str.isdigit,
    and int() refuses it), at most 19 of them (int() refuses 5,000), below 2**63."""
    if not (text.isascii() and text.isdigit() and len(text) <= 19):
        return None
    value = int(text)
    return value if value < 1 << 63 else None


def finite_number(value: Any) -> bool:
    """A JSON number (not a bool) that is finite as a float. JSON integers have no size: 10**400
    makes float() and math.isfinite raise OverflowError rather than answer."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def check_span(start: int, end: int, length: int, names: tuple[str, str]) -> None:
    """An episode's [start, end) address in its file must span exactly its declared length: one
    wrong offset would read another episode's rows. Callers add file and sequence to the error."""
    if int(end) - int(start) != length:
        raise FormatError(f"{names[0]} {start} / {names[1]} {end} do not span its length {length}")


@dataclasses.dataclass
class DatasetMeta:
    """What `plan` learns from a source's metadata: the output schema and source metadata.

    `columns` is ordered as the Parquet schema will be (sequence_id first). `source` becomes
    mixtrain.json's "source" object (format, uri and format-specific metadata); `private` is
    what the source's reader needs and nobody else reads.
    """

    format: str
    uri: str
    fps: float | None
    columns: list[ColumnSpec]
    source: dict = dataclasses.field(default_factory=dict)
    # The source's planning data for its own reader (formats/sources/__init__.py): pickled to the workers
    # with the plan, never written to mixtrain.json (that is `source`).
    private: dict = dataclasses.field(default_factory=dict)

    @classmethod
    def planned(cls, format: str, uri: str, fps: float | None, columns: list[ColumnSpec], described: dict,
                private: dict | None = None) -> DatasetMeta:
        """What a source's `plan` returns: mixtrain.json's "source" object is the format id and the
        input's URL, then what the format itself describes (`described`, in its order)."""
        return cls(format=format, uri=uri, fps=fps, columns=columns, source={"format": format, "uri": uri, **described},
                   private=private if private is not None else {})

    def column(self, name: str) -> ColumnSpec:
        for spec in self.columns:
            if spec.name == name:
                return spec
        raise KeyError(name)


def base_columns() -> list[ColumnSpec]:
    """The columns every source writes, in schema order."""
    return [
        ColumnSpec("sequence_id", SCALAR, pa.string()),
        ColumnSpec("length", SCALAR, pa.int64()),
        ColumnSpec("duration_seconds", SCALAR, pa.float64()),
        ColumnSpec("timestamp", TIMESTAMPS, pa.list_(pa.float64()), {"units": "s"}),
    ]
