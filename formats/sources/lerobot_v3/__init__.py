"""LeRobot dataset v3.0 reader (specs/lerobot-dataset-v3-zh.md).

Layout, all located through metadata, never by guessing file names:
  meta/info.json                       features, fps, `data_path` / `video_path` templates
  meta/episodes/chunk-*/file-*.parquet one row per episode: data file, [from, to) global frame
                                       index, per camera the MP4 and its [from, to) seconds
  meta/tasks.parquet                   task_index -> text
  data/...parquet, videos/...mp4       many episodes per file, many files per chunk folder

Quirks real writers produce (lerobot 0.4.4 wrote ../shared/fixtures/lerobot_v3/so100_tiny):
  - tasks.parquet keeps the text in the pandas index column `__index_level_0__`, not `task`;
  - data `timestamp` is float32; video from/to timestamps may be float32 or float64;
  - an episode's `from_timestamp` equals the previous episode's `to_timestamp` in the same MP4;
  - the episodes table carries `stats/<feature>/<stat>` columns (dropped: we recompute stats).
lerobot 0.6.1 (../shared/fixtures/lerobot_v3/*_lerobot061) and its tools add:
  - a real `task` column in tasks.parquet; `info.is_depth_map` beside 0.4.4's `video.is_depth_map`;
  - depth video as HEVC gray12le with log-quantised codes (`video.depth_min/depth_max/shift/use_log`),
    depth images as 16-bit TIFF; annotation columns (dtype `language`) and info.json `tools`;
  - modify_tasks / merge_datasets rewrite data files through pandas (`list<float>` vectors beside
    `fixed_size_list` in later files), and pyarrow infers `list<null>` for an empty annotation
    column: one type per feature over all files decides (`_data_types`).

Episodes are read on the workers by formats/sources/lerobot_v3/rows.py (by `index` range: only the row
groups whose statistics overlap it); this module plans.

Why ~580 lines: it is the LeRobot plan alone (info.json, the episode index and the checks of every
quirk above); the worker-side reading is formats/sources/lerobot_v3/rows.py.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from formats import sources, storage, video
from formats.arrow_types import is_empty_type, is_list, merge_types
from formats.errors import ConversionError, FormatError, in_context
from formats.sequence import (
    FROM_IMAGES,
    SCALAR,
    VIDEO,
    ColumnSpec,
    DatasetMeta,
    Sequence,
    VideoSegment,
    base_columns,
    check_span,
    check_unique_columns,
    column_name,
    episode_field_columns,
    episode_field_values,
    finite_number,
    quoted,
)
from formats.sources import Source
from formats.sources.lerobot_v3.rows import EpisodeRef, Reader, episode_images

__all__ = ["FORMAT", "EpisodeRef", "Layout", "detect", "is_v2", "plan", "plan_episodes", "load", "require"]

FORMAT = "lerobot_v3"
INFO_PATH = "meta/info.json"
TASKS_PATH = "meta/tasks.parquet"
STATS_PATH = "meta/stats.json"
EPISODES_DIR = "meta/episodes"
SUPPORTED_VERSION = "v3.0"

# Per-frame columns every LeRobot dataset has; derivable, so not repeated per step.
BOOKKEEPING = ("timestamp", "frame_index", "episode_index", "index", "task_index")
# Episodes-table columns that only locate data, or hold per-episode stats we recompute.
_LOCATOR_COLUMNS = {"episode_index", "tasks", "length", "dataset_from_index", "dataset_to_index"}
_LOCATOR_PREFIXES = ("data/", "videos/", "meta/", "stats/")
# A larger declared length is a corrupt index, refused before anything is sized from it.
MAX_EPISODE_FRAMES = 10**9


@dataclasses.dataclass(frozen=True)
class _Feature:
    key: str
    column: str
    kind: str  # "trajectory" | "steps" | "video"
    dtype: str
    shape: tuple[int, ...]


def detect(fs: fsspec.AbstractFileSystem, root: str) -> bool:
    """A LeRobot dataset of any version but v2.x (formats/sources/lerobot_v2 reads those): meta/info.json
    with a codebase_version (a v1 one is refused by plan with the versions that are read)."""
    path = storage.join(root, INFO_PATH)
    if not fs.exists(path):
        return False
    try:
        info = storage.read_json(fs, path)
    except FormatError:
        return True  # malformed, but plainly meant as LeRobot: let plan() say what is wrong
    return "codebase_version" in info and not is_v2(info["codebase_version"])


def is_v2(version) -> bool:
    """Whether an info.json codebase_version is a v2.x one (per-episode files, jsonl metadata)."""
    return isinstance(version, str) and version.startswith("v2.")


def plan(fs: fsspec.AbstractFileSystem, root: str, options: dict | None = None) -> tuple[DatasetMeta, list[EpisodeRef]]:
    """Read metadata only and return the output schema and one EpisodeRef per episode."""
    info_path = storage.resolve_inside(root, INFO_PATH, what="info.json", fs=fs)
    info = storage.read_json(fs, info_path, missing="not found; a LeRobot v3 dataset needs meta/info.json")
    version = info.get("codebase_version")
    if version != SUPPORTED_VERSION:
        raise FormatError(f"{info_path}: codebase_version {version!r} is not supported "
                          f"(the lerobot_v3 source reads {SUPPORTED_VERSION}, lerobot_v2 reads v2.0 and v2.1)")
    layout = Layout(require(info, "data_path", str, info_path), info.get("video_path"), info_path)
    return plan_episodes(fs, root, info, layout, _read_episodes(fs, root), _read_tasks(fs, root), FORMAT, "meta/episodes")


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where an episode's files are, from its episode-index row: v3.0 fills `data_path` and
    `video_path` with the row's chunk and file indices, and finds a camera's frames at the row's
    [from, to) seconds of a shared MP4. formats/sources/lerobot_v2 subclasses it (one file per episode)."""

    data_template: str
    video_template: str | None
    info_path: str
    shared_data_files: ClassVar[bool] = True  # many episodes per data file (v3.0); v2.x has one per episode

    def data_file(self, row: dict, shared: dict) -> str:
        return self.fill(shared, "data_path", chunk_index=row["data/chunk_index"], file_index=row["data/file_index"])

    def video(self, row: dict, key: str, length: int, fps: float, shared: dict) -> VideoSegment:
        prefix = f"videos/{key}/"
        missing = [k for k in ("chunk_index", "file_index", "from_timestamp", "to_timestamp") if prefix + k not in row]
        if missing or self.video_template is None:
            raise FormatError(f"{self.info_path}: episode_{int(row['episode_index']):06d}: camera {key!r} has no video location in the episode index")
        path = self.fill(shared, "video_path", video_key=key, chunk_index=row[prefix + "chunk_index"], file_index=row[prefix + "file_index"])
        return VideoSegment(path, length, float(row[prefix + "from_timestamp"]), float(row[prefix + "to_timestamp"]))

    def fill(self, shared: dict, key: str, **values) -> str:
        """info.json's `key` template ("data_path" or "video_path") filled with `values` (a bad
        template is one line naming it), the string shared by every ref that holds it."""
        template = self.data_template if key == "data_path" else self.video_template
        return _filled(shared, template, self.info_path, key, **values)


def plan_episodes(fs: fsspec.AbstractFileSystem, root: str, info: dict, layout: Layout, episodes: pa.Table,
                  task_texts: dict[int, str], format_id: str, index_name: str) -> tuple[DatasetMeta, list[EpisodeRef]]:
    """The plan of a LeRobot dataset of any layout, from its info.json, its episode index as one
    table (one row per episode: `episode_index`, `tasks`, `length`, `dataset_from_index`,
    `dataset_to_index`, what `layout` reads, and the episode-level fields to keep) and its tasks.
    `index_name` is the episode index's path under the root, for messages."""
    info_path = layout.info_path
    footers = storage.ParquetFooters(fs)
    version = info.get("codebase_version")
    fps = require(info, "fps", (int, float), info_path)
    if not finite_number(fps) or fps <= 0:
        raise FormatError(f"{info_path}: 'fps' must be a positive number of frames per second, found {fps!r}")
    features = require(info, "features", dict, info_path)
    parsed = _parse_features(features, info_path)

    declared = info.get("total_episodes")
    if isinstance(declared, int) and not isinstance(declared, bool) and declared != len(episodes):
        raise FormatError(f"{info_path}: total_episodes is {declared} but {index_name} lists {len(episodes)} episodes "
                          "(an episode index file missing, unreadable, or left over)")
    multi_task = _any_multi_task(episodes.column("tasks")) if "tasks" in episodes.column_names else False
    splits = _parse_splits(info.get("splits"), info_path)

    columns = base_columns()
    columns.append(ColumnSpec("episode_index", SCALAR, pa.int64(), {"source": "episode_index"}))
    columns.append(ColumnSpec("task", SCALAR, pa.string(), {"source": "tasks"}))
    columns.append(ColumnSpec("tasks", SCALAR, pa.list_(pa.string()), {"source": "tasks"}))
    if splits:
        columns.append(ColumnSpec("split", SCALAR, pa.string(), {"source": "info.json splits"}))
    extra_scalars = [
        name for name in episodes.column_names
        if name not in _LOCATOR_COLUMNS and not name.startswith(_LOCATOR_PREFIXES)
    ]
    columns += episode_field_columns({name: episodes.schema.field(name).type for name in extra_scalars})
    check_unique_columns(columns, storage.join(root, index_name))  # an episode field named like a column of ours
    # The episode index first: an implausible row is refused before any data file is opened.
    refs = _episode_refs(episodes, parsed, layout, float(fps), splits, extra_scalars)
    del episodes  # what is read below comes from the refs: the table freed
    data_types = _data_types(fs, root, refs, [f.key for f in parsed if f.dtype != "video"], footers)
    for feature in parsed:
        _check_declared_dtype(feature, data_types, info_path)
        try:
            columns.append(_column_for(feature, features[feature.key], data_types, fps))
        except FormatError as error:
            raise in_context(error, file=info_path) from None
    _probe_images(fs, root, refs, columns, footers)
    if multi_task:
        columns.append(ColumnSpec.steps("task_index", pa.int32(), source="task_index",
                                        description="per-step index into this row's tasks"))
    check_unique_columns(columns, info_path)

    meta = DatasetMeta.planned(
        format_id, storage.url_for(fs, root), float(fps), columns,
        {
            "codebase_version": version,
            "robot_type": info.get("robot_type"),
            "fps": fps,
            "features": features,
            "splits": info.get("splits"),
            "total_episodes": info.get("total_episodes"),
            "total_frames": info.get("total_frames"),
            "tasks": task_texts,
            **({"tools": info["tools"]} if info.get("tools") is not None else {}),
        },
        # For the reader, never published: every data file's footer read here. Not for a file per
        # episode (v2.x): the metadata travels in the job graph, which would grow with the episodes.
        private={"footers": dict(footers.signatures)} if layout.shared_data_files else {},
    )
    return meta, refs


def load(fs: fsspec.AbstractFileSystem, root: str, ref: EpisodeRef, meta: DatasetMeta) -> Sequence:
    """Read exactly one episode's rows and return its Sequence (videos still as segments)."""
    return Reader(fs, root, meta).load(ref)


# --- metadata -----------------------------------------------------------------------------------


def require(info: dict, key: str, types, path: str):
    """info[key], refused in one line when it is missing or of another type (bool is not an int)."""
    if key not in info:
        raise FormatError(f"{path}: required key {key!r} is missing")
    value = info[key]
    if not isinstance(value, types) or isinstance(value, bool):
        names = "/".join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))
        raise FormatError(f"{path}: {key!r} must be {names}, found {value!r}")
    return value


def _parse_features(features: dict, path: str) -> list[_Feature]:
    parsed = []
    for key, spec in features.items():
        if key in BOOKKEEPING:
            continue
        if not isinstance(spec, dict) or "dtype" not in spec:
            raise FormatError(f"{path}: feature {key!r} has no dtype")
        dtype = spec["dtype"]
        shape = _shape(spec.get("shape"), key, path)
        _check_video_info(spec, key, path)
        if dtype in ("video", "image"):
            parsed.append(_Feature(key, column_name(key, camera=True), VIDEO, dtype, shape))
        elif dtype in ("string", "language") or shape == (1,):
            parsed.append(_Feature(key, column_name(key), "steps", dtype, shape))
        else:
            try:
                pa.from_numpy_dtype(np.dtype(dtype))  # numpy's, and one Arrow holds ("V8": numpy's, not Arrow's)
            except (TypeError, ValueError, pa.ArrowException) as error:  # ValueError: "\ud800" cannot be encoded
                raise FormatError(f"{path}: feature {key!r} has unknown dtype {quoted(dtype)}") from error
            parsed.append(_Feature(key, column_name(key), "trajectory", dtype, shape))
    return parsed


def _check_video_info(spec: dict, key: str, path: str) -> None:
    """A feature's `info` (`video_info` from lerobot's v1 -> v2.0 converter), when there is one: an
    object, whose depth flags are true or false (bool("false") is True). The values a camera column
    takes from it are checked with the whole plan, as mixtrain.json will hold them (pipelines/plan.py)."""
    for name in ("info", "video_info"):
        info = spec.get(name)
        if info is None:
            continue
        if not isinstance(info, dict):
            raise FormatError(f"{path}: feature {key!r} has {name} {quoted(info)}; expected an object")
        for field in ("is_depth_map", "video.is_depth_map"):
            if info.get(field) is not None and not isinstance(info[field], bool):
                raise FormatError(f"{path}: feature {key!r} has {name}.{field} {quoted(info[field])}; expected true or false")


def _names_list(names: Any) -> list[str] | None:
    """A feature's per-value `names` as a list of strings: lerobot writes a list, or (v2.x, and
    datasets converted from it) an object of one list, {"motors": [...]}. None for another shape,
    which is kept as it is under `source_names`."""
    if isinstance(names, dict) and len(names) == 1:
        names = next(iter(names.values()))
    return names if isinstance(names, list) and all(isinstance(name, str) for name in names) else None


# Values per step of one feature beyond which a declared shape is a corrupt info.json, refused
# before anything is sized from it (the largest real features, images, are ~10^7).
MAX_FEATURE_VALUES = 10**9


def _shape(shape, key: str, path: str) -> tuple[int, ...]:
    """A feature's `shape` as positive ints; a string, a float or an absurd size is one line."""
    if shape is None or shape == []:
        return (1,)
    if not isinstance(shape, list) or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in shape):
        raise FormatError(f"{path}: feature {key!r} has shape {shape!r}; expected a list of positive integers like [6]")
    if math.prod(shape) > MAX_FEATURE_VALUES:
        raise FormatError(f"{path}: feature {key!r} has shape {quoted(shape)}: more than {MAX_FEATURE_VALUES:.0e} values per frame "
                          "is not plausible")  # (its product as a float overflowed past 10**308)
    return tuple(shape)


def _depth_meta(info: dict) -> dict:
    """Depth facts of a camera: lerobot 0.6 writes `is_depth_map` (0.4.4: `video.is_depth_map`), the
    unit, and for depth video its 12-bit quantiser (`video.depth_min/depth_max/shift/use_log`, metres)."""
    meta: dict[str, Any] = {"is_depth_map": bool(info.get("is_depth_map", info.get("video.is_depth_map", False)))}
    if not meta["is_depth_map"]:
        return meta
    if info.get("depth_unit") is not None:
        meta["depth_unit"] = info["depth_unit"]
    quantiser = {name: info[f"video.{name}"] for name in ("depth_min", "depth_max", "shift", "use_log") if f"video.{name}" in info}
    if quantiser:
        meta["depth_quantization"] = {
            **quantiser,
            "units": "m",
            "codes": DEPTH_CODES,
            "to_metres": DEPTH_LOG_FORMULA if quantiser.get("use_log", True) else DEPTH_LINEAR_FORMULA,
        }
    return meta


# lerobot's dequantize_depth (datasets/depth_utils.py): code q in 0..4095 -> metres; millimetres = rint(1000 * metres).
DEPTH_CODES = "12-bit codes 0..4095 (gray12le samples)"
DEPTH_LOG_FORMULA = "clip(exp(log(depth_min + shift) + q * (log(depth_max + shift) - log(depth_min + shift)) / 4095) - shift, depth_min, depth_max)"
DEPTH_LINEAR_FORMULA = "clip(depth_min + q * (depth_max - depth_min) / 4095, depth_min, depth_max)"


def _check_declared_dtype(feature: _Feature, data_types: dict[str, pa.DataType], info_path: str) -> None:
    """A numeric feature's values must be stored in the dtype info.json declares: casting float
    actions to a declared int8 would turn them into 0/1 silently."""
    if feature.kind == VIDEO or feature.dtype in ("string", "language") or feature.key not in data_types:
        return
    leaf = data_types[feature.key]
    while is_list(leaf):
        leaf = leaf.value_type
    if pa.types.is_null(leaf):
        return  # no values anywhere: nothing to convert wrongly
    try:
        declared = pa.from_numpy_dtype(np.dtype(feature.dtype))
    except (TypeError, ValueError, pa.ArrowException) as error:  # "float76": numpy's TypeError escaped
        raise FormatError(f"{info_path}: feature {feature.key!r} has dtype {feature.dtype!r}, not a numeric type ({error})") from None
    if leaf != declared:
        raise FormatError(f"{info_path}: feature {feature.key!r} is declared {feature.dtype} but the data files hold {leaf} values; "
                          "fix info.json (converting would change the values)")


def _column_for(feature: _Feature, spec: dict, data_types: dict[str, pa.DataType], fps: float) -> ColumnSpec:
    meta: dict[str, Any] = {"source": feature.key}
    if spec.get("names") is not None:
        names = _names_list(spec["names"])
        meta["names" if names is not None else "source_names"] = names if names is not None else spec["names"]
    info = spec.get("info") or spec.get("video_info") or {}  # `video_info`: what lerobot's v1 -> v2.0 converter wrote
    if feature.kind == VIDEO and feature.dtype == "image":
        width, height = _image_size(feature.shape, spec.get("names"))
        return ColumnSpec(feature.column, VIDEO, pa.string(), {
            "fps": fps,
            "resolution": {"width": width, "height": height},
            **_depth_meta(info),
            "source": feature.key,
            "encoded_from": FROM_IMAGES,
        })
    if feature.kind == VIDEO:
        height, width = (feature.shape + (None, None))[:2]
        meta = {
            "fps": info.get("video.fps", fps),
            "codec": info.get("video.codec"),
            "resolution": {"width": info.get("video.width", width), "height": info.get("video.height", height)},
            "pix_fmt": info.get("video.pix_fmt"),
            **_depth_meta(info),
            "source": feature.key,
        }
        return ColumnSpec(feature.column, VIDEO, pa.string(), meta)
    if feature.kind == "trajectory":
        dim = int(np.prod(feature.shape))
        if len(feature.shape) > 1:
            meta["shape"] = list(feature.shape)
        return ColumnSpec.trajectory(feature.column, np.dtype(feature.dtype), dim, **meta)
    # Per-step values: numeric as their numpy dtype, anything else in the data file's own type.
    if feature.dtype not in ("string", "language"):
        try:
            return ColumnSpec.steps(feature.column, pa.from_numpy_dtype(np.dtype(feature.dtype)), **meta)
        except (TypeError, ValueError, pa.ArrowNotImplementedError):  # ValueError: a dtype "\ud800" numpy cannot encode
            pass
    if feature.dtype == "string":
        return ColumnSpec.steps(feature.column, pa.string(), **meta)
    if feature.key not in data_types:
        raise FormatError(f"feature {feature.key!r} is declared in info.json but missing from the data files")
    if feature.dtype == "language":  # lerobot-annotate's per-step message lists, in the type the files agree on
        meta.update(type="language", dtype=str(data_types[feature.key]))
    return ColumnSpec.steps(feature.column, data_types[feature.key], **meta)


def _read_episodes(fs, root: str) -> pa.Table:
    files = _episode_index_files(fs, root)
    if not files:
        raise FormatError(f"{storage.join(root, EPISODES_DIR)}: no episode index files (meta/episodes/chunk-*/file-*.parquet)")
    tables = []
    for path in files:
        try:
            with storage.open_input(fs, path) as handle:
                parquet = storage.parquet_file(handle)
                wanted = [n for n in parquet.schema_arrow.names if not n.startswith("stats/")]
                tables.append(parquet.read(columns=wanted))
        except (OSError, pa.ArrowException) as error:
            raise FormatError(f"{path}: cannot read episode index: {error}") from error
        for column in _INTEGER_COLUMNS:
            if column not in tables[-1].column_names:
                raise FormatError(f"{path}: episode index lacks required column {column!r}")
        _check_index_types(tables[-1], path)
    try:
        episodes = pa.concat_tables(tables, promote_options="permissive")
    except pa.ArrowInvalid as error:
        raise FormatError(f"{storage.join(root, EPISODES_DIR)}: episode index files disagree in schema: {error}") from error
    episodes = episodes.sort_by("episode_index")
    indices = episodes.column("episode_index").to_numpy()
    if len(np.unique(indices)) != len(indices):
        duplicate = int(indices[np.nonzero(np.diff(indices) == 0)[0][0]])
        raise FormatError(f"{storage.join(root, EPISODES_DIR)}: episode_index {duplicate} appears more than once")
    return episodes


def _check_index_types(table: pa.Table, path: str) -> None:
    """Index and offset columns are integers, timestamps numbers, none null, and `tasks` a list
    column: a null or a string used to end in a traceback, and a float offset (3.7) was truncated
    to another episode's rows."""
    repeated = sorted({name for name in table.column_names if table.column_names.count(name) > 1})
    if repeated:  # a row would keep one of them, silently
        raise FormatError(f"{path}: episode index has the column {repeated[0]!r} more than once")
    for name in table.column_names:
        column, video = table.column(name), name.startswith("videos/")
        if name == "tasks":  # a list of task texts per episode (null: none); anything else was len() of a scalar
            if not is_list(column.type):
                raise FormatError(f"{path}: episode index column 'tasks' must hold lists of task texts, found {column.type}")
            continue
        if name in _INTEGER_COLUMNS or video and name.endswith(("/chunk_index", "/file_index")):
            wanted, kind_ok = "integers", pa.types.is_integer(column.type)
        elif video and name.endswith(("/from_timestamp", "/to_timestamp")):
            wanted, kind_ok = "numbers", pa.types.is_integer(column.type) or pa.types.is_floating(column.type)
        else:
            continue
        if not kind_ok or column.null_count:
            found = f"{column.null_count} nulls" if kind_ok else str(column.type)
            raise FormatError(f"{path}: episode index column {name!r} must hold {wanted}, found {found}")


_INTEGER_COLUMNS = ("episode_index", "length", "dataset_from_index", "dataset_to_index", "data/chunk_index", "data/file_index")


def _episode_index_files(fs, root: str) -> list[str]:
    """meta/episodes/<chunk>/<file>.parquet by listing, not by a glob pattern: a root path holding
    glob characters (`ds[12]`) must not match a sibling, and chunk folders that are symlinks count
    (when they stay inside the dataset)."""
    folder = storage.resolve_inside(root, EPISODES_DIR, what="episode index folder", fs=fs)
    if not fs.isdir(folder):
        return []
    files = []
    for chunk in sorted(entry["name"].rstrip("/") for entry in fs.ls(folder, detail=True)):
        name = chunk.rsplit("/", 1)[-1]
        if name.startswith(".") or not fs.isdir(chunk):
            continue
        chunk = storage.resolve_inside(root, f"{EPISODES_DIR}/{name}", what="episode index folder", fs=fs)
        for entry in sorted(path.rstrip("/") for path in fs.ls(chunk, detail=False)):
            file = entry.rsplit("/", 1)[-1]
            if file.endswith(".parquet") and not file.startswith("."):
                files.append(storage.resolve_inside(root, f"{EPISODES_DIR}/{name}/{file}", what="episode index file", fs=fs))
    return files


def _read_tasks(fs, root: str) -> dict[int, str]:
    path = storage.resolve_inside(root, TASKS_PATH, what="task table", fs=fs)
    if not fs.exists(path):
        return {}
    try:
        table = storage.read_parquet(fs, path)
    except (OSError, pa.ArrowException) as error:
        raise FormatError(f"{path}: cannot read the task table: {error}") from error
    text_column = "task" if "task" in table.column_names else "__index_level_0__"
    if text_column not in table.column_names or "task_index" not in table.column_names:
        raise FormatError(f"{path}: expected columns task_index and task (or a pandas index), found {table.column_names}")
    return dict(zip(table.column("task_index").to_pylist(), table.column(text_column).to_pylist()))


def _parse_splits(splits, path: str) -> list[tuple[str, int, int]]:
    if not splits:
        return []
    if not isinstance(splits, dict):
        raise FormatError(f"{path}: 'splits' must be an object like {{\"train\": \"0:80\"}}, found {splits!r}")
    parsed = []
    for name, span in splits.items():
        try:
            low, high = (int(x) for x in str(span).split(":"))
        except ValueError as error:
            raise FormatError(f"{path}: split {name!r} has range {span!r}, expected 'start:end'") from error
        parsed.append((name, low, high))
    return parsed


def _image_size(shape: tuple[int, ...], names) -> tuple[int | None, int | None]:
    """(width, height) of an `image` feature: by its `names` when given (lerobot writes
    ["height", "width", "channels"]; older datasets ["channels", "height", "width"]), else HWC."""
    if isinstance(names, list) and "height" in names and "width" in names and len(names) == len(shape):
        return shape[names.index("width")], shape[names.index("height")]
    if len(shape) == 3 and shape[0] in (1, 3, 4) and shape[2] not in (1, 3, 4):
        return shape[2], shape[1]
    height, width = (tuple(shape) + (None, None))[:2]
    return width, height


def _probe_images(fs, root: str, refs: list[EpisodeRef], columns: list[ColumnSpec], footers: storage.ParquetFooters) -> None:
    """Decode the first image of each image camera: its pixel format decides how the camera is
    encoded (16-bit depth PNGs go lossless), and its size must be the one info.json declares."""
    cameras = [i for i, spec in enumerate(columns) if spec.kind == VIDEO and spec.meta.get("encoded_from") == FROM_IMAGES]
    if not cameras or not refs:
        return
    first = refs[0]
    path = storage.resolve_inside(root, first.data_file, what="data file", fs=fs)
    with storage.open_input(fs, path) as handle:
        parquet = storage.parquet_file(handle, metadata=footers.footer(path))
        keys = [columns[i].meta["source"] for i in cameras]
        if any(parquet.schema_arrow.get_field_index(key) < 0 for key in keys):
            return  # load() names the missing column with the episode
        table = parquet.read_row_group(0, columns=keys).slice(0, 1)
    ref = EpisodeRef(first.episode_index, "", 1, first.data_file, 0, 1, (), (), ())
    for position, key in zip(cameras, keys):
        spec = columns[position]
        try:
            frame = video.ImageDecoder().decode(episode_images(fs, root, key, table.column(key), ref).frames[0], 0)
        except ConversionError as error:
            raise in_context(error, file=path, sequence=f"episode {first.episode_index} {key!r}") from error
        declared = (spec.meta["resolution"]["width"], spec.meta["resolution"]["height"])
        if None not in declared and declared != (frame.width, frame.height):
            raise FormatError(f"{path}: {key!r} images are {frame.width}x{frame.height}, "
                              f"info.json declares {declared[0]}x{declared[1]} (shape and names)")
        columns[position] = dataclasses.replace(spec, meta={**spec.meta, "pix_fmt": frame.format.name,
                                                            "resolution": {"width": frame.width, "height": frame.height}})


def _data_types(fs, root: str, refs: list[EpisodeRef], keys: list[str], footers: storage.ParquetFooters) -> dict[str, pa.DataType]:
    """One Arrow type per feature over every data file (footers only), so that one rule decides
    what lerobot's writers leave behind: `list<float>` (files rewritten through pandas by
    modify_tasks / merge_datasets) and `fixed_size_list<float>[D]` are one trajectory; a type
    inferred as `null` / `list<null>` in a file where the column is empty takes the type of the
    files where it is not; structs inferred from different rows are joined field by field. Real
    conflicts (another dimension or scalar type) are one error naming both files."""
    seen: dict[str, tuple[pa.DataType, str]] = {}
    files: dict[str, int] = {}  # data file -> its first episode, in the index's order
    for ref in refs:
        files.setdefault(ref.data_file, ref.episode_index)
    paths = [storage.resolve_inside(root, relative, what="data file", fs=fs) for relative in files]
    for position, ((path, schema), episode) in enumerate(zip(footers.schemas(paths), files.values(), strict=True)):
        if isinstance(schema, Exception):
            error = schema
            if position > 0:
                continue  # load() reports it with the episode; the first file must be readable to plan
            if isinstance(error, FileNotFoundError):
                raise FormatError(f"{path}: data file not found (episode {episode})") from error
            raise FormatError(f"{path}: cannot read data file (episode {episode}): {error}") from error
        for key in keys:
            if schema.get_field_index(key) < 0:
                continue  # load() names the missing column with its episode
            kind = schema.field(key).type
            if key not in seen or is_empty_type(seen[key][0]):
                seen[key] = (kind if key not in seen else merge_types(seen[key][0], kind), path)
                continue
            try:
                seen[key] = (merge_types(seen[key][0], kind), seen[key][1])
            except TypeError:
                raise FormatError(f"{path}: episode_{episode:06d}: schema drift between data files: "
                                  f"{key} is {kind} here, {seen[key][0]} in {seen[key][1]}") from None
    return {key: kind for key, (kind, _) in seen.items()}


def _fill(template: str, info_path: str, key: str, **values) -> str:
    """A `data_path` / `video_path` template filled in; a placeholder lerobot does not write or a
    bad format spec is one line naming the template, not a KeyError."""
    problem = storage.template_problem(template)
    if problem is not None:
        raise FormatError(f"{info_path}: {key} {quoted(template)} is not a path template: {problem}")
    try:
        return template.format(**values)
    except (KeyError, IndexError, ValueError, AttributeError) as error:
        example = ("'data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet'" if "episode_index" in values
                   else "'data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet'")
        raise FormatError(f"{info_path}: {key} {template!r} cannot be filled with {', '.join(sorted(values))} "
                          f"({type(error).__name__}: {error}); lerobot writes e.g. {example}") from None


# Episode index rows made Python objects at a time while planning (a million at once took 0.5 GB).
_PLAN_BATCH_ROWS = 65_536


def _any_multi_task(tasks: pa.ChunkedArray) -> bool:
    """Whether an episode lists more than one task (then each step says which of its tasks it does)."""
    return len(tasks) > 0 and (pc.max(pc.list_value_length(tasks)).as_py() or 0) > 1  # a list column (_check_index_types); nulls: none


def _episode_refs(episodes: pa.Table, features, layout: Layout, fps: float, splits, extra_scalars) -> list[EpisodeRef]:
    """One EpisodeRef per row of the episode index, in its order, made from a batch of rows at a
    time. Values repeated across episodes (a data file's path, a video file's path, a task list,
    a split) are one object shared by every ref that holds them (`shared`), not one per episode."""
    shared: dict = {}
    refs = []
    for batch in episodes.to_batches(max_chunksize=_PLAN_BATCH_ROWS):
        refs += [_episode_ref(row, features, layout, fps, splits, extra_scalars, shared) for row in batch.to_pylist()]
    return refs


def _one(shared: dict, value):
    """The object equal to `value` the plan made first (strings and tuples of strings: equal
    means identical, so sharing one changes no ref's value or repr)."""
    return shared.setdefault(value, value)


def _filled(shared: dict, template: str, info_path: str, key: str, **values) -> str:
    """`_fill` once per distinct template and values (typed: 1 and 1.0 fill differently), then shared."""
    memo = (template, *((name, type(value), value) for name, value in values.items()))
    try:
        hash(memo)
    except TypeError:  # a value no template can take (a list): _fill says so
        return _fill(template, info_path, key, **values)
    if memo not in shared:
        path = _fill(template, info_path, key, **values)
        try:  # an absolute path or one through ../ is refused here, naming info.json (the workers check symlinks)
            storage.resolve_inside("", path, what="data file" if key == "data_path" else "video file")
        except FormatError as error:
            raise in_context(error, file=info_path) from None
        shared[memo] = _one(shared, path)
    return shared[memo]


def _episode_ref(row: dict, features, layout: Layout, fps: float, splits, extra_scalars, shared: dict) -> EpisodeRef:
    info_path = layout.info_path
    index = int(row["episode_index"])
    sequence_id = f"episode_{index:06d}"
    length = int(row["length"])
    if length <= 0:
        raise FormatError(f"{info_path}: {sequence_id}: length {length} (an episode needs at least one frame)")
    if length > MAX_EPISODE_FRAMES:
        raise FormatError(f"{info_path}: {sequence_id}: length {length} is not plausible (more than {MAX_EPISODE_FRAMES:.0e} frames)")
    try:
        check_span(row["dataset_from_index"], row["dataset_to_index"], length, ("dataset_from_index", "dataset_to_index"))
    except FormatError as error:
        raise in_context(error, file=info_path, sequence=sequence_id) from None
    videos = [(feature.column, layout.video(row, feature.key, length, fps, shared))
              for feature in features if feature.kind == VIDEO and feature.dtype == "video"]
    scalars = [("episode_index", index)]
    tasks = tuple(row.get("tasks") or ())
    if all(type(task) is str for task in tasks):
        tasks = _one(shared, tasks)
    for name, low, high in splits:
        if low <= index < high:
            scalars.append(_one(shared, ("split", name)))
            break
    else:
        if splits:
            scalars.append(("split", None))
    scalars += episode_field_values(row, extra_scalars)
    return EpisodeRef(
        episode_index=index,
        sequence_id=sequence_id,
        length=length,
        data_file=layout.data_file(row, shared),
        from_index=int(row["dataset_from_index"]),
        to_index=int(row["dataset_to_index"]),
        tasks=tasks,
        videos=tuple(videos),
        scalars=tuple(scalars),
    )


class LeRobotV3(Source):
    id = FORMAT
    expects = "LeRobot v3 expected meta/info.json"
    marker = "meta/info.json"
    shared_files = (TASKS_PATH,)  # info.json is not shared: its totals change with every appended episode
    reader = Reader
    detect = staticmethod(detect)
    plan = staticmethod(plan)


SOURCE = sources.register(LeRobotV3())
