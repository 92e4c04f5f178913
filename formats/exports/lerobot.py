"""Mixtrain -> LeRobot v3.0, laid out as lerobot 0.6 writes it, and v2.1 as lerobot 0.3 does
(docs/export.md has the mapping).

A plan (`plan_export`, on the launcher, from the sidecar and a scan of the scalar columns) puts
the episodes in order and into groups; each group is one data file and, per camera, the
episodes' MP4s joined into one file by copying their samples (formats/video/mp4.py
`write_joined`: no frame decoded or changed). `write_group` writes one group from its rows (on a
worker); `write_meta` writes `meta/` once every group is written. v2.1 keeps one data file and one
MP4 per episode (the Mixtrain MP4 copied as it is); its groups only share the work out. Column names, dtypes, shapes
and per-feature metadata come back from what the conversion recorded (`column_types.*.source`,
`source.features`); a dataset converted from another format gets lerobot's conventional names.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import re
import shutil
from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from formats import storage, video
from formats.errors import FormatError
from formats.read.lance_rows import BLOB_CELL
from formats.sequence import FROM_IMAGES
from formats.video import mp4

__all__ = ["Feature", "Episode", "ExportPlan", "Writer", "plan_export", "write_group", "write_meta", "write_group_v21", "write_meta_v21",
           "CODEBASE_VERSION", "DATA_PATH", "VIDEO_PATH", "V21_DATA_PATH", "V21_VIDEO_PATH", "LAYOUTS"]

CODEBASE_VERSION = "v3.0"
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_PATH = "meta/episodes/chunk-000/file-000.parquet"
V21_VERSION = "v2.1"
V21_DATA_PATH = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
V21_VIDEO_PATH = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
V21_STATS = ("min", "max", "mean", "std", "count")  # lerobot 0.3's episodes_stats.jsonl
CHUNKS_SIZE = 1000  # lerobot 0.6's defaults
DATA_FILE_MB = 100
VIDEO_FILE_MB = 200
INDEX_FEATURES = ("timestamp", "frame_index", "episode_index", "index", "task_index")  # lerobot appends these to every dataset
LEROBOT_SOURCES = ("lerobot_v3", "lerobot_v2")
QUANTILES = (("q01", 0.01), ("q10", 0.10), ("q50", 0.50), ("q90", 0.90), ("q99", 0.99))
SOURCE_ID = "source_sequence_id"  # meta/episodes column: a non-LeRobot source's own episode id
SOURCE_INDEX = "source_episode_index"  # meta/episodes column: a LeRobot source's index, where episodes were renumbered
EPISODE_KEYS = {"episode_index", "tasks", "length", "dataset_from_index", "dataset_to_index", "stats"}
MAX_EPISODE_FRAMES = 10**9  # as the LeRobot source reader bounds an episode
EPISODE_PREFIXES = ("data/", "videos/", "stats/", "meta/")
STRUCTURAL = {"sequence_id", "length", "duration_seconds", "episode_index", "task", "tasks", "split"}
_KEY = re.compile(r"[A-Za-z0-9_.\-]+")


@dataclasses.dataclass(frozen=True)
class Feature:
    """One LeRobot feature and the Mixtrain column it comes from."""

    column: str
    key: str
    dtype: str  # lerobot's: float32, int64, bool, string, video ...
    shape: tuple[int, ...]
    names: Any = None
    info: dict | None = None  # video features: lerobot's `info` object
    entry: dict | None = None  # the source's own features entry, written back as it was (lerobot sources)

    @property
    def is_video(self) -> bool:
        return self.dtype == "video"

    @property
    def is_image(self) -> bool:
        """A LeRobot source's `image` feature, which the conversion encoded to video: written back
        as one image per frame (PNG; 16-bit depth as TIFF, as lerobot 0.6 writes it)."""
        return self.dtype == "image"

    def info_json(self) -> dict:
        if self.entry is not None:
            return self.entry
        value: dict[str, Any] = {"dtype": self.dtype, "shape": list(self.shape), "names": self.names}
        if self.info is not None:
            value["info"] = self.info
        return value


@dataclasses.dataclass(frozen=True)
class Episode:
    sequence_id: str
    episode_index: int
    length: int
    index_from: int  # the first frame's global `index`
    group: int


@dataclasses.dataclass
class ExportPlan:
    fps: float | int
    robot_type: str | None
    features: list[Feature]  # info.json order; the index features last, as lerobot writes them
    tasks: list[str]  # task_index -> text
    episodes: list[Episode]  # in episode order
    groups: int
    columns: list[str]  # the Mixtrain columns a group's rows need
    episode_columns: list[str]  # custom per-episode columns kept in meta/episodes
    splits: dict[str, str] | None
    left_out: list[str]  # what LeRobot cannot hold, said in the summary and in info.json
    data_file_mb: float = DATA_FILE_MB
    video_file_mb: float = VIDEO_FILE_MB
    computed: list[str] = dataclasses.field(default_factory=list)  # episode columns filled in by the export, not read

    @property
    def frame_features(self) -> list[Feature]:
        return [feature for feature in self.features if not feature.is_video]

    @property
    def video_features(self) -> list[Feature]:
        return [feature for feature in self.features if feature.is_video]

    @property
    def total_frames(self) -> int:
        return sum(episode.length for episode in self.episodes)


def _conventional_key(column: str, kind: str) -> str:
    """lerobot's naming for a column converted from another format: obs_x -> observation.x,
    video_x -> observation.images.x; action and the rest keep their names."""
    if kind == "video":
        return "observation.images." + (column[len("video_"):] if column.startswith("video_") else column)
    if column.startswith("obs_"):
        return "observation." + column[len("obs_"):]
    return column


def _element_type(kind: pa.DataType) -> pa.DataType:
    return kind.value_type if pa.types.is_list(kind) or pa.types.is_large_list(kind) else kind


def _dtype_name(kind: pa.DataType) -> str:
    while pa.types.is_fixed_size_list(kind) or pa.types.is_list(kind):
        kind = kind.value_type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return "string"
    if pa.types.is_boolean(kind):
        return "bool"
    return np.dtype(kind.to_pandas_dtype()).name


def plan_export(dataset, *, data_file_mb: float = DATA_FILE_MB, video_file_mb: float = VIDEO_FILE_MB,
                fps: float | None = None) -> ExportPlan:
    """The export's plan from the dataset's metadata and its scalar columns (no trajectory read).
    `fps`: the frame rate to declare where the dataset records none (no camera, no source rate)."""
    meta = dataset.metadata
    where = dataset.where
    source = meta.get("source") or {}
    from_lerobot = source.get("format") in LEROBOT_SOURCES
    source_features = source.get("features") if from_lerobot and isinstance(source.get("features"), dict) else {}
    schema = dataset.schema
    left_out: list[str] = []
    features: list[Feature] = []
    video_fps = None
    for column, entry in dataset.column_types.items():
        kind = entry.get("type")
        if column in ("timestamp", "task_index") and kind in ("timestamps", "steps"):
            continue  # rebuilt: lerobot's index features
        if kind not in ("trajectory", "steps", "video"):
            left_out.append(f"{column} ({kind}: LeRobot has no such feature)")
            continue
        key = entry.get("source") if from_lerobot and isinstance(entry.get("source"), str) else _conventional_key(column, kind)
        if not isinstance(key, str) or not _KEY.fullmatch(key) or key.startswith(".") or key in INDEX_FEATURES:
            raise FormatError(f"{where}: column {column!r}: {key!r} is not a name LeRobot can hold (letters, digits, '_', '.', '-' "
                              f"only, not starting with '.', none of {', '.join(INDEX_FEATURES)})")
        original = source_features.get(key) if isinstance(source_features.get(key), dict) else None
        if kind == "video":
            video_fps = video_fps or _rate(entry.get("fps"), f"column_types.{column}.fps", where)
            features.append(_video_feature(column, key, entry, original))
            continue
        features.append(_frame_feature(column, key, kind, entry, original, schema.field(column).type, where))
    if from_lerobot and source_features:  # info.json's own order
        order = {key: position for position, key in enumerate(source_features)}
        features.sort(key=lambda feature: order.get(feature.key, len(order)))
    if len({feature.key for feature in features}) != len(features):
        raise FormatError(f"{where}: two columns map to one LeRobot feature name")
    recorded_fps = _rate(source.get("fps"), "source.fps", where) or _rate(source.get("frame_rate_hz"), "source.frame_rate_hz", where) \
        or video_fps
    if recorded_fps and fps:  # the same rate would change nothing: an option without effect is refused too
        raise FormatError(f"{where}: records {_plain(recorded_fps)} frames a second; --fps={_plain(fps)} is for a dataset that records "
                          "none")
    fps = recorded_fps or fps
    if not fps:
        raise FormatError(f"{where}: no frame rate recorded (no camera, no source rate): give the one LeRobot should declare with --fps")
    fps = int(fps) if float(fps).is_integer() else float(fps)
    for feature in features:
        rate = _rate(dataset.column_types[feature.column].get("fps"), f"column_types.{feature.column}.fps", where) if feature.is_video \
            else None
        if rate and rate != float(fps):
            raise FormatError(f"{where}: camera {feature.column} runs at {_plain(rate)} frames a second, the dataset at {fps}: LeRobot shows "
                              "every camera at the dataset's rate")
    features.extend(_index_features(source_features))

    scalars = [name for name in dataset.scalar_columns if name in schema.names]
    table = dataset.scan(scalars)
    order = _episode_order(table, where)
    table = table.take(pa.array(order, pa.int64()))
    tasks = _tasks(table, source if from_lerobot else {}, where)
    episode_columns = [name for name in scalars if name not in STRUCTURAL]
    for name in episode_columns:
        if name in EPISODE_KEYS or name.startswith(EPISODE_PREFIXES):
            raise FormatError(f"{where}: column {name!r} would overwrite LeRobot's own episodes column of that name")
    computed = []  # episode columns the export fills in; a column of that name already there (an export converted back) is kept
    if not from_lerobot and SOURCE_ID not in episode_columns:
        computed.append(SOURCE_ID)  # the episode's id in the format it was converted from
    kept_indices = "episode_index" in table.column_names and table.column("episode_index").to_pylist() == list(range(table.num_rows))
    if "episode_index" in table.column_names and not kept_indices and SOURCE_INDEX not in episode_columns:
        computed.append(SOURCE_INDEX)  # renumbered 0..N-1 (a subset, a gap): the source's own index kept
    episode_columns += computed
    episodes, groups = _group(dataset, table, features, data_file_mb, video_file_mb)
    recorded_splits = _clamped_splits(source.get("splits"), table.num_rows) if from_lerobot and kept_indices else None
    splits = recorded_splits if recorded_splits is not None else _splits(table)
    needed = ["sequence_id", "length", *(feature.column for feature in features if feature.column in schema.names),
              *(name for name in ("timestamp", "task_index", "task", "tasks", "episode_index") if name in schema.names),
              *(name for name in episode_columns if name not in computed)]
    return ExportPlan(fps=fps, robot_type=source.get("robot_type"), features=features, tasks=tasks, episodes=episodes,
                      groups=groups, columns=list(dict.fromkeys(needed)), episode_columns=episode_columns, splits=splits,
                      left_out=left_out, data_file_mb=data_file_mb, video_file_mb=video_file_mb, computed=computed)


def _frame_feature(column: str, key: str, kind: str, entry: dict, original: dict | None, arrow: pa.DataType, where: str) -> Feature:
    """A per-frame feature whose dtype and shape are those of the data (the Arrow type); what the
    sidecar records about them must agree, or the dataset is refused (info.json would lie)."""
    element = _element_type(arrow)
    try:
        dtype = _dtype_name(element)
    except (NotImplementedError, TypeError):
        raise FormatError(f"{where}: column {column!r} holds {element}, which LeRobot has no dtype for") from None
    if kind == "trajectory":
        if not pa.types.is_fixed_size_list(element):
            raise FormatError(f"{where}: column {column!r} is a trajectory of {element}, not of fixed-size vectors")
        dim = element.list_size
        if entry.get("dim") is not None and entry.get("dim") != dim:
            raise FormatError(f"{where}: column {column!r}: column_types says dim {entry.get('dim')!r}, the data holds {dim} values a step")
    else:
        dim = 1
    recorded = (original or {}).get("shape") or entry.get("shape")
    if recorded is not None:
        if not isinstance(recorded, list) or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in recorded) \
                or math.prod(recorded) != dim:
            raise FormatError(f"{where}: column {column!r}: shape {recorded!r} recorded for {dim} values a step")
    shape = tuple(recorded) if recorded else ((dim,) if kind == "trajectory" else (1,))
    if original and original.get("dtype") is not None and not _same_dtype(original.get("dtype"), dtype):
        raise FormatError(f"{where}: column {column!r}: source.features says {key} is {original.get('dtype')!r}, the data holds {dtype}")
    names = entry.get("names") if entry.get("names") is not None else (original or {}).get("names")
    keep = original if original and _same_dtype(original.get("dtype"), dtype) and tuple(original.get("shape") or ()) == shape else None
    return Feature(column, key, dtype, shape, names, entry=keep)


def _same_dtype(recorded: Any, actual: str) -> bool:
    """Whether a recorded dtype names the data's (numpy's spellings: "float" is float64)."""
    if recorded == actual:
        return True
    try:
        return np.dtype(recorded).name == actual
    except (TypeError, ValueError):
        return False


def _rate(value: Any, what: str, where: str) -> float | None:
    """A recorded frame rate: a finite positive number, or absent."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise FormatError(f"{where}: {what} {value!r} is not a frame rate")
    return float(value)


def _video_feature(column: str, key: str, entry: dict, original: dict | None) -> Feature:
    if original and original.get("dtype") == "image" and entry.get("encoded_from") == FROM_IMAGES:
        shape = original.get("shape")
        if not isinstance(shape, list) or len(shape) != 3 or shape[2] not in (1, 3) \
                or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in shape):
            raise FormatError(f"column {column!r}: source.features gives image {key} the shape {shape!r}, not [height, width, 1 or 3]")
        return Feature(column, key, "image", tuple(shape), original.get("names"), entry=original)
    width, height = (entry.get("resolution") or {}).get("width"), (entry.get("resolution") or {}).get("height")
    depth = bool(entry.get("is_depth_map"))
    channels = 1 if depth else 3
    info = dict((original or {}).get("info") or {})
    if original and original.get("dtype") == "video":
        info.update({"video.codec": entry.get("codec", info.get("video.codec")), "video.pix_fmt": entry.get("pix_fmt", info.get("video.pix_fmt"))})
    else:
        info = {"video.height": height, "video.width": width, "video.codec": entry.get("codec"), "video.pix_fmt": entry.get("pix_fmt"),
                "video.is_depth_map": depth, "video.fps": entry.get("fps"), "video.channels": channels, "has_audio": False}
    shape = tuple(original["shape"]) if original and original.get("dtype") == "video" else (height, width, channels)
    names = (original or {}).get("names") or ["height", "width", "channels"]
    entry_out = {**original, "info": info} if original and original.get("dtype") == "video" else None
    return Feature(column, key, "video", shape, names, info=info, entry=entry_out)


def _index_features(source_features: dict) -> list[Feature]:
    out = []
    for key, dtype in zip(INDEX_FEATURES, ("float32", "int64", "int64", "int64", "int64")):
        original = source_features.get(key) if isinstance(source_features.get(key), dict) else None
        out.append(Feature(key, key, dtype, (1,), None, entry=original))
    return out


def _episode_order(table: pa.Table, where: str) -> list[int]:
    """Rows in episode order: the source's episode_index where the conversion kept it, else the id."""
    if "episode_index" in table.column_names:
        values = table.column("episode_index").to_pylist()
        if None in values:
            raise FormatError(f"{where}: episode_index is null in sequence {table.column('sequence_id')[values.index(None)]}")
        if len(set(values)) != len(values):
            raise FormatError(f"{where}: episode_index repeats: two sequences claim one episode")
        return sorted(range(len(values)), key=values.__getitem__)
    ids = table.column("sequence_id").to_pylist()
    return sorted(range(len(ids)), key=ids.__getitem__)


def _row_tasks(tasks: list | None, task: str | None) -> list[str]:
    """An episode's tasks: its list, else its one task, else the empty task (LeRobot has no task-less episode)."""
    return [str(text) for text in tasks] if tasks else ([str(task)] if task is not None else [""])


def _tasks(table: pa.Table, source: dict, where: str) -> list[str]:
    """The task table: a LeRobot source's own (its indices kept), else the tasks in order of first
    appearance. Every episode's tasks must be in it."""
    ids = table.column("sequence_id").to_pylist()
    tasks = table.column("tasks").to_pylist() if "tasks" in table.column_names else [None] * len(ids)
    task = table.column("task").to_pylist() if "task" in table.column_names else [None] * len(ids)
    wanted = {sequence_id: _row_tasks(own, one) for sequence_id, own, one in zip(ids, tasks, task)}
    recorded = source.get("tasks")
    if isinstance(recorded, dict) and recorded and sorted(recorded, key=lambda k: int(k) if str(k).isdigit() else -1) == \
            [str(i) for i in range(len(recorded))] and all(isinstance(text, str) for text in recorded.values()):
        table_tasks = [recorded[str(i)] for i in range(len(recorded))]
        known = set(table_tasks)
        if len(known) != len(table_tasks):
            raise FormatError(f"{where}: source.tasks holds one text under two indices")
        for sequence_id, texts in wanted.items():
            missing = [text for text in texts if text not in known]
            if missing:
                raise FormatError(f"{where}: sequence {sequence_id}: task {missing[0]!r} is not in the source's task table")
        return table_tasks
    seen: dict[str, None] = {}
    for texts in wanted.values():
        for text in texts:
            seen.setdefault(text, None)
    return list(seen) or [""]


def _clamped_splits(recorded: Any, episodes: int) -> dict[str, str] | None:
    """A LeRobot source's own splits ("train": "0:80"), cut to the episodes exported (0..episodes-1:
    a conversion of the first N, --limit); None when they are not ranges."""
    if not isinstance(recorded, dict):
        return None
    out = {}
    for name, value in recorded.items():
        parts = value.split(":") if isinstance(value, str) else []
        if len(parts) != 2 or not all(part.isdigit() for part in parts):
            return None
        low, high = min(int(parts[0]), episodes), min(int(parts[1]), episodes)
        if low < high:
            out[name] = f"{low}:{high}"
    return out


def _splits(table: pa.Table) -> dict[str, str] | None:
    """info.json `splits` from the split column, when each split is one run of episodes."""
    if "split" not in table.column_names:
        return None
    runs: dict[str, list[int]] = {}
    for position, value in enumerate(table.column("split").to_pylist()):
        if value is not None:
            runs.setdefault(value, []).append(position)
    if any(indices != list(range(indices[0], indices[-1] + 1)) for indices in runs.values()):
        return None
    return {name: f"{indices[0]}:{indices[-1] + 1}" for name, indices in runs.items()}


def _frame_bytes(features: list[Feature]) -> int:
    """A data file's bytes a frame, about (images counted raw: 16-bit for depth)."""
    sizes = {"float64": 8, "int64": 8, "float32": 4, "int32": 4, "int16": 2, "uint16": 2, "int8": 1, "uint8": 1, "bool": 1}
    total = 0
    for feature in features:
        if feature.is_image:
            total += math.prod(feature.shape) * (2 if ((feature.entry or {}).get("info") or {}).get("is_depth_map") else 1)
        elif not feature.is_video:
            total += sizes.get(feature.dtype, 8) * math.prod(feature.shape)
    return total


def _group(dataset, table: pa.Table, features: list[Feature], data_file_mb: float, video_file_mb: float) -> tuple[list[Episode], int]:
    """Consecutive episodes share a data file and, per camera, a video file, until either would
    pass its size (lerobot's rule: a file rolls over once it is full)."""
    lengths = table.column("length").to_pylist()
    ids = table.column("sequence_id").to_pylist()
    per_frame = _frame_bytes(features)
    cameras = [feature.column for feature in features if feature.is_video]
    video_sizes = {column: dataset.video_sizes(column) for column in cameras}
    episodes, group, data_bytes, video_bytes, index = [], 0, 0, dict.fromkeys(cameras, 0), 0
    for position, (sequence_id, length) in enumerate(zip(ids, lengths)):
        if length is None or length < 0:
            raise FormatError(f"{dataset.where}: sequence {sequence_id}: no length, or a negative one")
        if length > MAX_EPISODE_FRAMES:
            raise FormatError(f"{dataset.where}: sequence {sequence_id}: length {length} is past {MAX_EPISODE_FRAMES} frames")
        size = length * per_frame
        videos = {column: video_sizes[column].get(sequence_id, 0) for column in cameras}
        full = data_bytes and data_bytes + size > data_file_mb * 1e6
        full = full or any(video_bytes[c] and video_bytes[c] + videos[c] > video_file_mb * 1e6 for c in cameras)
        if position and full:
            group, data_bytes, video_bytes = group + 1, 0, dict.fromkeys(cameras, 0)
        data_bytes += size
        for column in cameras:
            video_bytes[column] += videos[column]
        episodes.append(Episode(sequence_id, position, int(length), index, group))
        index += int(length)
    return episodes, (group + 1 if episodes else 0)


# --- one group: a data file and each camera's joined video -----------------------------------


def _flat(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    return array.flatten()


def _steps(column: pa.ChunkedArray, lengths: list[int]) -> pa.Array:
    """A per-step column's values, episode after episode; an episode whose cell is null (a column
    only some episodes have) gives a null for each of its frames."""
    array = column.combine_chunks()
    if not array.null_count:
        return array.flatten()
    parts = [pa.nulls(length, array.type.value_type) if not array[i].is_valid else array.slice(i, 1).flatten()
             for i, length in enumerate(lengths)]
    return pa.concat_arrays(parts) if parts else array.flatten()


def _frames(plan: ExportPlan, rows: pa.Table, episodes: list[Episode], task_of: dict[str, int], where: str,
            images: dict[str, pa.Array]) -> pa.Table:
    """The data file's rows: one per frame, the episodes one after another (`images`: each image
    feature's cells, made by `_image_cells`)."""
    lengths = rows.column("length").to_pylist()
    ids = rows.column("sequence_id").to_pylist()
    per_step = [feature.column for feature in plan.frame_features if feature.key not in INDEX_FEATURES and not feature.is_image]
    for column in [*per_step, *(name for name in ("timestamp", "task_index") if name in rows.column_names)]:
        counts = pc.list_value_length(rows.column(column)).to_pylist()
        for sequence_id, length, count in zip(ids, lengths, counts):
            if count is None and column in ("timestamp", "task_index"):
                raise FormatError(f"{where}: sequence {sequence_id}: column {column} is null")
            if count is not None and count != length:
                raise FormatError(f"{where}: sequence {sequence_id}: column {column} holds {count} steps for {length} timesteps")
    columns, names = [], []
    for feature in plan.frame_features:
        if feature.key in INDEX_FEATURES:
            continue
        if feature.is_image:
            columns.append(images[feature.key])
            names.append(feature.key)
            continue
        values = _steps(rows.column(feature.column), lengths)
        if feature.shape == (1,) and pa.types.is_fixed_size_list(values.type):
            values = values.flatten()  # lerobot keeps a one-value feature as a scalar per frame
        if len(values) != sum(lengths):
            raise FormatError(f"{where}: column {feature.column} holds {len(values)} steps for {sum(lengths)} timesteps")
        if len(feature.shape) > 1:  # [d1, d2, ...] kept flat in Mixtrain, row-major: nested again
            nested = values.flatten() if pa.types.is_fixed_size_list(values.type) else values
            for size in reversed(feature.shape):
                nested = pa.FixedSizeListArray.from_arrays(nested, size)
            values = nested
        columns.append(_named_as_lerobot(values))
        names.append(feature.key)
    total = sum(lengths)
    if "timestamp" in rows.column_names:
        timestamps = _flat(rows.column("timestamp")).to_numpy(zero_copy_only=False).astype(np.float32)
    else:
        timestamps = np.concatenate([np.arange(n) / plan.fps for n in lengths]).astype(np.float32) if total else np.zeros(0, np.float32)
    frame_index = np.concatenate([np.arange(n, dtype=np.int64) for n in lengths]) if total else np.zeros(0, np.int64)
    episode_index = np.repeat(np.array([e.episode_index for e in episodes], np.int64), lengths)
    index = np.concatenate([np.arange(e.index_from, e.index_from + n, dtype=np.int64) for e, n in zip(episodes, lengths)]) \
        if total else np.zeros(0, np.int64)
    columns += [pa.array(timestamps), pa.array(frame_index), pa.array(episode_index), pa.array(index),
                pa.array(_task_indices(rows, lengths, task_of, where), pa.int64())]
    names += list(INDEX_FEATURES)
    return pa.table(columns, names=names)


def _lerobot_type(kind: pa.DataType) -> pa.DataType:
    """`kind` with every list's value field named `element`, as lerobot (Hugging Face datasets)
    writes it; a Lance table reads its lists back with `item`."""
    if pa.types.is_fixed_size_list(kind):
        return pa.list_(pa.field("element", _lerobot_type(kind.value_type), kind.value_field.nullable), kind.list_size)
    if pa.types.is_list(kind):
        return pa.list_(pa.field("element", _lerobot_type(kind.value_type), kind.value_field.nullable))
    return kind


def _named_as_lerobot(values: pa.Array) -> pa.Array:
    kind = _lerobot_type(values.type)
    return values if str(kind) == str(values.type) else values.cast(kind)  # DataType equality ignores field names


def _task_indices(rows: pa.Table, lengths: list[int], task_of: dict[str, int], where: str) -> np.ndarray:
    out = []
    tasks = rows.column("tasks").to_pylist() if "tasks" in rows.column_names else [None] * rows.num_rows
    task = rows.column("task").to_pylist() if "task" in rows.column_names else [None] * rows.num_rows
    per_step = rows.column("task_index").to_pylist() if "task_index" in rows.column_names else [None] * rows.num_rows
    ids = rows.column("sequence_id").to_pylist()
    for sequence_id, length, own, one, steps in zip(ids, lengths, tasks, task, per_step):
        texts = _row_tasks(own, one)
        if steps is not None:
            if not own or any(i is None or not 0 <= i < len(own) for i in steps):
                raise FormatError(f"{where}: sequence {sequence_id}: task_index points outside the row's tasks")
            out.append(np.array([task_of[str(own[i])] for i in steps], np.int64))
            continue
        if texts[0] not in task_of:
            raise FormatError(f"{where}: sequence {sequence_id}: task {texts[0]!r} is not in the task table")
        out.append(np.full(length, task_of[texts[0]], np.int64))
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def _episode_stats(frames: pa.Table, features: list[Feature], lengths: list[int]) -> dict[str, pa.Array]:
    """Per numeric feature, one column per statistic, a row per episode (`stats/<key>/<name>`:
    min, max, mean, std, lerobot 0.6's quantiles, count); null for an episode of no frames."""
    out: dict[str, pa.Array] = {}
    episodes = len(lengths)
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    by_length: dict[int, list[int]] = {}
    for number, length in enumerate(lengths):
        if length:
            by_length.setdefault(int(length), []).append(number)
    valid = np.array([bool(length) for length in lengths], bool)
    for feature in features:
        if feature.dtype in ("string", "video", "image") or feature.key not in frames.column_names:
            continue
        column = frames.column(feature.key).combine_chunks()
        values = column
        while pa.types.is_fixed_size_list(values.type):
            values = values.flatten()
        try:
            matrix = values.to_numpy(zero_copy_only=False).astype(np.float64).reshape(len(column), -1)
        except (pa.ArrowInvalid, ValueError, TypeError):
            continue
        names = ["min", "max", "mean", "std", *(name for name, _ in QUANTILES)]
        table = {name: np.zeros((episodes, matrix.shape[1]), np.float64) for name in names}
        for length, numbers in by_length.items():  # episodes of one length: one array, each statistic computed once for all
            stacked = matrix[(starts[numbers][:, None] + np.arange(length)[None, :])]  # [episodes, frames, values]
            table["min"][numbers], table["max"][numbers] = stacked.min(1), stacked.max(1)
            table["mean"][numbers], table["std"][numbers] = stacked.mean(1), stacked.std(1)
            quantiles = np.quantile(stacked, [q for _, q in QUANTILES], axis=1)
            for i, (name, _) in enumerate(QUANTILES):
                table[name][numbers] = quantiles[i]
        for name in names:
            out[f"stats/{feature.key}/{name}"] = _list_column(table[name], valid)
        out[f"stats/{feature.key}/count"] = _list_column(np.array(lengths, np.int64)[:, None], valid)
    return out


def _list_column(matrix: np.ndarray, valid: np.ndarray) -> pa.Array:
    """[rows, values] -> list<values' type>, a row where `valid` is False null."""
    rows, width = matrix.shape
    offsets = pa.array(np.arange(0, rows * width + 1, width, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, pa.array(matrix.reshape(-1)), mask=pa.array(~valid))


def _records(plan: ExportPlan, rows: pa.Table, episodes: list[Episode], group: int, stats: dict[str, pa.Array],
             placed: dict[str, list[tuple[int, float, float]]] | None = None) -> pa.Table:
    """The group's episodes as the episode records both layouts' metadata are built from: a row per
    episode, LeRobot's episodes columns (v3.0 names; `placed`: each camera's file and times)."""
    indices = np.array([episode.episode_index for episode in episodes], np.int64)
    lengths = np.array([episode.length for episode in episodes], np.int64)
    starts = np.array([episode.index_from for episode in episodes], np.int64)
    tasks_rows = rows.column("tasks").to_pylist() if "tasks" in rows.column_names else [None] * rows.num_rows
    task_rows = rows.column("task").to_pylist() if "task" in rows.column_names else [None] * rows.num_rows
    columns: dict[str, pa.Array] = {
        "episode_index": pa.array(indices), "length": pa.array(lengths),
        "data/chunk_index": pa.array(np.full(len(episodes), group, np.int64)), "data/file_index": pa.array(np.zeros(len(episodes), np.int64)),
        "dataset_from_index": pa.array(starts), "dataset_to_index": pa.array(starts + lengths),
        "tasks": pa.array([_row_tasks(many, one) for many, one in zip(tasks_rows, task_rows)], pa.list_(pa.string()))}
    for name in plan.episode_columns:  # in their own Arrow types here; typed as lerobot's when written (write_meta)
        if name == SOURCE_ID and name in plan.computed:
            columns[name] = pa.array([episode.sequence_id for episode in episodes], pa.string())
        elif name == SOURCE_INDEX and name in plan.computed:
            columns[name] = rows.column("episode_index").combine_chunks()
        else:
            columns[name] = rows.column(name).combine_chunks()
    columns.update(stats)
    for key, where in (placed or {}).items():
        columns[f"videos/{key}/chunk_index"] = pa.array(np.full(len(episodes), group, np.int64))
        columns[f"videos/{key}/file_index"] = pa.array([file_index for file_index, _, _ in where], pa.int64())
        columns[f"videos/{key}/from_timestamp"] = pa.array([float(start) for _, start, _ in where], pa.float64())
        columns[f"videos/{key}/to_timestamp"] = pa.array([float(end) for _, _, end in where], pa.float64())
    return pa.table(columns)


def write_group(plan: ExportPlan, group: int, rows: pa.Table, dataset, out_fs, out_root: str) -> tuple[pa.Table, list[str]]:
    """Write group `group`'s data file and videos under `out_root`; returns its episode records
    (`_records`) and the files written (relative to `out_root`)."""
    rows, episodes, where = _ordered(plan, rows, dataset)
    files: list[str] = []
    # The videos first: each is counted against its episode's length before any frame is built.
    placed = {feature.key: _write_camera(plan, feature, group, rows.column(feature.column).to_pylist(), episodes, dataset, out_fs,
                                         out_root, where, files) for feature in plan.video_features}
    frames = _group_frames(plan, rows, episodes, dataset, where, "List")  # lerobot 0.6 with datasets 4
    lengths = rows.column("length").to_pylist()
    files.append(DATA_PATH.format(chunk_index=group, file_index=0))
    data_path = storage.join(out_root, files[-1])
    out_fs.makedirs(data_path.rsplit("/", 1)[0], exist_ok=True)
    with out_fs.open(data_path, "wb") as handle:
        pq.write_table(frames, handle, compression="snappy")
    return _records(plan, rows, episodes, group, _episode_stats(frames, plan.frame_features, lengths), placed), files


def _ordered(plan: ExportPlan, rows: pa.Table, dataset) -> tuple[pa.Table, list[Episode], str]:
    """The group's rows in episode order, their episodes, and the dataset's URL for messages."""
    by_id = {episode.sequence_id: episode for episode in plan.episodes}
    ids = rows.column("sequence_id").to_pylist()
    rows = rows.take(pa.array(sorted(range(len(ids)), key=lambda i: by_id[ids[i]].episode_index), pa.int64()))
    return rows, [by_id[sequence_id] for sequence_id in rows.column("sequence_id").to_pylist()], storage.url_for(dataset.fs, dataset.root)


def _group_frames(plan: ExportPlan, rows: pa.Table, episodes: list[Episode], dataset, where: str, sequence: str) -> pa.Table:
    """The frames of the group's data file(s): its episodes one after another, with the Hugging Face
    features lerobot's writer records (`sequence`: the name its datasets version gives a vector)."""
    images = {feature.key: _image_cells(dataset, rows.column(feature.column).to_pylist(), feature, episodes, where)
              for feature in plan.frame_features if feature.is_image}
    frames = _frames(plan, rows, episodes, {text: number for number, text in enumerate(plan.tasks)}, where, images)
    features = _hf_features(plan, sequence)
    if features is None:
        return frames
    return frames.replace_schema_metadata({b"huggingface": json.dumps({"info": {"features": features}}).encode()})


def _hf_features(plan: ExportPlan, sequence: str) -> dict | None:
    """The data file's `huggingface` schema metadata, as lerobot writes it through Hugging Face
    datasets (`Image` for image features, which a reader could not tell from a struct column
    otherwise: lerobot 0.3 reads v2.1 data files by this metadata). None for a dataset with a
    feature of more than one dimension, whose ArrayND storage is not this export's nested lists:
    those files carry none, and readers infer every column."""
    features: dict[str, dict] = {}
    for feature in plan.frame_features:
        value = {"dtype": feature.dtype, "_type": "Value"}
        if feature.is_image:
            features[feature.key] = {"_type": "Image"}
        elif len(feature.shape) > 1:
            return None
        elif feature.shape == (1,):
            features[feature.key] = value
        else:
            features[feature.key] = {"feature": value, "length": feature.shape[0], "_type": sequence}
    return features


IMAGE_CELL = pa.struct([("bytes", pa.binary()), ("path", pa.string())])  # Hugging Face Image storage, as lerobot writes it


def _image_cells(dataset, cells: list[str | None], feature: Feature, episodes: list[Episode], where: str) -> pa.Array:
    """An image feature's cells for the group's frames: each episode's video decoded a frame at a
    time and each frame written as the image file lerobot keeps in its data files (`bytes`, and
    `path` the name lerobot gives it: frame-NNNNNN.png, .tiff for 16-bit depth)."""
    blobs: list[bytes] = []
    paths: list[str] = []
    for cell, episode in zip(cells, episodes):
        _video_cell(dataset, cell, feature, episode, where)
        count = 0
        depth = bool(((feature.entry or {}).get("info") or {}).get("is_depth_map"))
        for frame in dataset.iter_decoded(cell, feature.column, length=episode.length, gray=feature.shape[2] == 1):
            if frame.shape[:2] != feature.shape[:2] or frame.shape[2] != feature.shape[2]:
                raise FormatError(f"{where}: sequence {episode.sequence_id}: {cell} holds {frame.shape[1]}x{frame.shape[0]}x"
                                  f"{frame.shape[2]} frames, source.features gives {feature.key} the shape {list(feature.shape)}")
            if frame.dtype == np.uint16:  # 16-bit gray: depth as TIFF, as lerobot 0.6 writes it; other 16-bit images as PNG
                image_format, suffix = ("tiff16", "tiff") if depth else ("png16", "png")
            else:
                image_format, suffix = ("png", "png") if frame.shape[2] == 3 else ("png_gray", "png")
            blobs.append(video.encode_image(frame if frame.shape[2] == 3 else frame[..., 0], image_format))
            paths.append(f"frame-{count:06d}.{suffix}")
            count += 1
    return pa.StructArray.from_arrays([pa.array(blobs, pa.binary()), pa.array(paths, pa.string())], fields=list(IMAGE_CELL))


def _episode_video(dataset, cell: str | None, feature: Feature, episode: Episode, where: str) -> tuple[str, mp4.SampleTable | None, float]:
    """The episode's MP4 in a camera column: its path, its sample table (None when not the plain
    case) and the time its first frame is shown; only the file's boxes are read here, its samples
    are streamed when written. Only a file inside the dataset is taken (a cell naming a URL or a
    path outside is refused: the export would copy it into its output), and only a video of
    exactly `length` frames."""
    sequence = f"{where}: sequence {episode.sequence_id}"
    cell = _video_cell(dataset, cell, feature, episode, where)
    try:
        with dataset.open_video(cell, feature.column) as handle:
            table = mp4.read_sample_table(handle)
            if table is not None:
                frames, start = len(table.pts), (float(table.pts.min()) / table.timescale if len(table.pts) else 0.0)
            else:
                handle.seek(0)
                frames, start = _demuxed(handle, f"{sequence}: {cell}")
    except FileNotFoundError:
        raise FormatError(f"{sequence}: {cell}: video file not found") from None
    if frames != episode.length:
        raise FormatError(f"{sequence}: {cell} holds {frames} frames for {episode.length} timesteps")
    return cell, table, start


def _video_cell(dataset, cell: str | None, feature: Feature, episode: Episode, where: str) -> str:
    """A camera's cell, checked: present, and a file inside the dataset or (a Lance dataset) a
    blob of its table; a URL or a path outside is refused (the export would copy it into its
    output). Returns the cell, for `dataset.open_video`."""
    sequence = f"{where}: sequence {episode.sequence_id}"
    if cell is None:
        raise FormatError(f"{sequence}: no video in {feature.column}: a LeRobot episode has every camera")
    if cell.startswith(BLOB_CELL) and getattr(dataset, "lance", None) is not None:
        if cell[len(BLOB_CELL):].rsplit("/", 1)[0] != feature.column:
            raise FormatError(f"{sequence}: {feature.column} names the blob of another column ({cell!r})")
        return cell  # made by the Lance reader itself from this column's blob (formats/read/lance_rows.py)
    if "://" in cell:
        raise FormatError(f"{sequence}: {feature.column} names {cell!r}: the export copies only video files inside the dataset")
    storage.resolve_inside(dataset.root, cell, what="video file", fs=dataset.fs)
    return cell


def _opened(dataset, cells: list[str], column: str):
    """The videos one after another, each closed once the next is wanted (write_joined streams them)."""
    for cell in cells:
        with dataset.open_video(cell, column) as handle:
            yield handle


def _copy_file(dataset, cell: str, column: str, out_fs, target: str) -> None:
    out_fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
    with dataset.open_video(cell, column) as source, out_fs.open(target, "wb") as destination:
        shutil.copyfileobj(source, destination, 8 << 20)


def _demuxed(handle, where: str) -> tuple[int, float]:
    """Frames and the first shown time of a video the sample-table parser leaves to the demuxer
    (fragmented, several tracks): its packets counted, nothing decoded."""
    import av

    try:
        with av.open(handle) as container:
            if not container.streams.video:
                raise FormatError(f"{where}: no video stream")
            stream = container.streams.video[0]
            times = []
            for packet in container.demux(stream):
                if packet.is_corrupt:
                    raise FormatError(f"{where}: damaged: sample {len(times)} is cut short")
                if packet.size and packet.pts is not None:
                    times.append(packet.pts)
            return len(times), (float(min(times) * stream.time_base) if times else 0.0)
    except av.error.FFmpegError as error:
        raise FormatError(f"{where}: not a video file: {error}") from None


def _write_camera(plan: ExportPlan, feature: Feature, group: int, cells: list[str | None], episodes: list[Episode], dataset,
                  out_fs, out_root: str, where: str, files: list[str]) -> list[tuple[int, float, float]]:
    """The camera's episodes joined into as few files as the samples allow (a file whose codec
    configuration or time base differs from the one before starts the next file; a file whose
    sample table is not the plain case is copied whole as a file of its own). Returns each
    episode's (file_index, from_timestamp, to_timestamp); the files written are added to `files`."""
    placed: list[tuple[int, int, float, float]] = []  # (position, file_index, from, to)
    pending: list[tuple[int, mp4.SampleTable, str]] = []
    file_index = 0

    def target(number: int) -> str:
        files.append(VIDEO_PATH.format(video_key=feature.key, chunk_index=group, file_index=number))
        return storage.join(out_root, files[-1])

    def flush() -> None:
        nonlocal file_index, pending
        if not pending:
            return
        tables = [table for _, table, _ in pending]
        path = target(file_index)
        out_fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        with out_fs.open(path, "wb") as destination:
            with contextlib.closing(_opened(dataset, [source for _, _, source in pending], feature.column)) as sources:
                starts = mp4.write_joined(tables, sources, destination)
        timescale = tables[0].timescale
        for number, (position, _, _) in enumerate(pending):
            placed.append((position, file_index, starts[number] / timescale, starts[number + 1] / timescale))
        file_index += 1
        pending = []

    for position, (cell, episode) in enumerate(zip(cells, episodes)):
        source, table, start = _episode_video(dataset, cell, feature, episode, where)
        if table is None or not mp4.joinable(table):
            flush()
            _copy_file(dataset, source, feature.column, out_fs, target(file_index))
            placed.append((position, file_index, start, start + episode.length / float(plan.fps)))
            file_index += 1
            continue
        if pending and not mp4.joinable(table, pending[0][1]):
            flush()
        pending.append((position, table, source))
    flush()
    return [(file_index_, start, end) for _, file_index_, start, end in sorted(placed)]


def write_group_v21(plan: ExportPlan, group: int, rows: pa.Table, dataset, out_fs, out_root: str) -> tuple[pa.Table, list[str]]:
    """v2.1: each episode of the group as its own data file and, per camera, its own MP4 (the
    Mixtrain file's bytes: one episode per file is what both layouts hold). Returns the episode
    records (`_records`, from which write_meta_v21 makes its lines) and the files written."""
    rows, episodes, where = _ordered(plan, rows, dataset)
    # The videos first: each is counted against its episode's length before any frame is built.
    key_column = {feature.key: feature.column for feature in plan.video_features}
    videos = {feature.key: [_episode_video(dataset, cell, feature, episode, where)[0]
                            for cell, episode in zip(rows.column(feature.column).to_pylist(), episodes)] for feature in plan.video_features}
    frames = _group_frames(plan, rows, episodes, dataset, where, "Sequence")  # lerobot 0.3 with datasets 3
    lengths = rows.column("length").to_pylist()
    files, offset = [], 0
    for number, episode in enumerate(episodes):
        chunk = episode.episode_index // CHUNKS_SIZE
        files.append(V21_DATA_PATH.format(episode_chunk=chunk, episode_index=episode.episode_index))
        path = storage.join(out_root, files[-1])
        out_fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        with out_fs.open(path, "wb") as handle:
            pq.write_table(frames.slice(offset, episode.length), handle, compression="snappy")
        offset += episode.length
        for key, sources in videos.items():
            files.append(V21_VIDEO_PATH.format(episode_chunk=chunk, video_key=key, episode_index=episode.episode_index))
            _copy_file(dataset, sources[number], key_column[key], out_fs, storage.join(out_root, files[-1]))
    return _records(plan, rows, episodes, group, _episode_stats(frames, plan.frame_features, lengths)), files


def write_meta_v21(plan: ExportPlan, records: Iterable[pa.Table], stats: dict, out_fs, out_root: str) -> dict:
    """meta/info.json, episodes.jsonl, tasks.jsonl, episodes_stats.jsonl and stats.json (v2.1)."""
    ordered = _in_order(plan, records)
    custom = {name: _as_lerobot_writes(ordered.column(name)).to_pylist() for name in plan.episode_columns}
    indices, lengths, tasks = (ordered.column(name).to_pylist() for name in ("episode_index", "length", "tasks"))
    stat_columns = [(name, *name[len("stats/"):].rsplit("/", 1)) for name in ordered.column_names if name.startswith("stats/")]
    stat_values = {name: ordered.column(name).to_pylist() for name, _, stat in stat_columns if stat in V21_STATS}

    def lines(values: Iterable[dict]) -> bytes:
        return "".join(json.dumps(value, default=str) + "\n" for value in values).encode()

    def episode_stats(row: int) -> dict[str, dict[str, list]]:
        per_feature: dict[str, dict[str, list]] = {}
        for name, key, stat in stat_columns:
            if stat in V21_STATS and stat_values[name][row] is not None:
                per_feature.setdefault(key, {})[stat] = stat_values[name][row]
        return per_feature

    out_fs.makedirs(storage.join(out_root, "meta"), exist_ok=True)
    out_fs.pipe_file(storage.join(out_root, "meta/episodes.jsonl"),
                     lines({"episode_index": indices[row], "tasks": tasks[row], **{name: custom[name][row] for name in custom},
                            "length": lengths[row]} for row in range(ordered.num_rows)))
    out_fs.pipe_file(storage.join(out_root, "meta/episodes_stats.jsonl"),
                     lines({"episode_index": indices[row], "stats": episode_stats(row)} for row in range(ordered.num_rows)))
    out_fs.pipe_file(storage.join(out_root, "meta/tasks.jsonl"),
                     lines({"task_index": number, "task": text} for number, text in enumerate(plan.tasks)))
    episodes = len(plan.episodes)
    info: dict[str, Any] = {
        "codebase_version": V21_VERSION, "robot_type": plan.robot_type, "total_episodes": episodes, "total_frames": plan.total_frames,
        "total_tasks": len(plan.tasks), "total_videos": episodes * len(plan.video_features),
        "total_chunks": -(-episodes // CHUNKS_SIZE), "chunks_size": CHUNKS_SIZE, "fps": plan.fps,
        "splits": plan.splits or {"train": f"0:{episodes}"}, "data_path": V21_DATA_PATH,
        "video_path": V21_VIDEO_PATH if plan.video_features else None, "features": _features_json(plan)}
    return _finish_meta(plan, info, stats, out_fs, out_root)


# --- meta/ -----------------------------------------------------------------------------------


def write_meta(plan: ExportPlan, records: Iterable[pa.Table], stats: dict, out_fs, out_root: str) -> dict:
    """meta/info.json, tasks.parquet, stats.json and the episodes table; returns info.json."""
    ordered = _in_order(plan, records)
    keys = ["episode_index", "tasks", "length", "data/chunk_index", "data/file_index", "dataset_from_index", "dataset_to_index"]
    for feature in plan.video_features:
        keys += [f"videos/{feature.key}/{name}" for name in ("chunk_index", "file_index", "from_timestamp", "to_timestamp")]
    keys += plan.episode_columns
    keys += sorted((name for name in ordered.column_names if name.startswith("stats/") and ordered.column(name).null_count < len(ordered)),
                   key=_stats_order(plan))
    columns = {}
    for key in keys:
        column = ordered.column(key) if key in ordered.column_names else pa.chunked_array([pa.nulls(ordered.num_rows, pa.int64())])
        columns[key] = _as_lerobot_writes(column) if key in plan.episode_columns else column.combine_chunks()
    columns["meta/episodes/chunk_index"] = columns["meta/episodes/file_index"] = pa.array(np.zeros(ordered.num_rows, np.int64))
    episodes_path = storage.join(out_root, EPISODES_PATH)
    out_fs.makedirs(episodes_path.rsplit("/", 1)[0], exist_ok=True)
    with out_fs.open(episodes_path, "wb") as handle:
        pq.write_table(pa.table(columns), handle)
    with out_fs.open(storage.join(out_root, "meta/tasks.parquet"), "wb") as handle:
        pq.write_table(_tasks_table(plan.tasks), handle)
    info: dict[str, Any] = {
        "codebase_version": CODEBASE_VERSION, "robot_type": plan.robot_type, "total_episodes": len(plan.episodes),
        "total_frames": plan.total_frames, "total_tasks": len(plan.tasks), "chunks_size": CHUNKS_SIZE,
        "data_files_size_in_mb": _plain(plan.data_file_mb), "video_files_size_in_mb": _plain(plan.video_file_mb), "fps": plan.fps,
        "splits": plan.splits or {"train": f"0:{len(plan.episodes)}"}, "data_path": DATA_PATH,
        "video_path": VIDEO_PATH if plan.video_features else None, "features": _features_json(plan)}
    return _finish_meta(plan, info, stats, out_fs, out_root)


def _plain(number: float) -> float | int:
    return int(number) if float(number).is_integer() else number


def _tasks_table(tasks: list[str]) -> pa.Table:
    """meta/tasks.parquet as lerobot writes it through pandas: `task` is the DataFrame's index
    (lerobot reads an item's task text as `tasks.iloc[task_index].name`)."""
    table = pa.table({"task_index": pa.array(range(len(tasks)), pa.int64()), "task": pa.array(tasks, pa.string())})
    pandas = {"index_columns": ["task"], "column_indexes": [{"name": None, "field_name": None, "pandas_type": "unicode",
                                                            "numpy_type": "object", "metadata": {"encoding": "UTF-8"}}],
              "columns": [{"name": "task_index", "field_name": "task_index", "pandas_type": "int64", "numpy_type": "int64",
                           "metadata": None},
                          {"name": "task", "field_name": "task", "pandas_type": "unicode", "numpy_type": "object", "metadata": None}],
              "attributes": {}, "creator": {"library": "pyarrow", "version": pa.__version__}, "pandas_version": "2.2.0"}
    return table.replace_schema_metadata({b"pandas": json.dumps(pandas).encode()})


def _features_json(plan: ExportPlan) -> dict:
    return {feature.key: feature.info_json() for feature in plan.features}


def _in_order(plan: ExportPlan, records: Iterable[pa.Table]) -> pa.Table:
    """Every episode's record, in order; a group that did not come back is an error, not a gap."""
    tables = list(records)
    if not tables:  # a dataset of no episode: meta/ with its columns typed, no row
        empty = pa.table({"sequence_id": pa.array([], pa.string()), "length": pa.array([], pa.int64()),
                          **{name: pa.array([]) for name in plan.episode_columns}})
        placed = {feature.key: [] for feature in plan.video_features}
        tables = [_records(dataclasses.replace(plan, computed=[]), empty, [], 0, {}, placed)]
    table = pa.concat_tables(tables, promote_options="permissive")
    table = table.take(pc.sort_indices(table, [("episode_index", "ascending")]))
    if not np.array_equal(table.column("episode_index").to_numpy(), np.arange(len(plan.episodes))):
        raise FormatError("the export lost an episode: its groups did not all come back")
    return table


def _as_lerobot_writes(column: pa.ChunkedArray) -> pa.Array:
    """A custom episode column as lerobot's episodes table holds it: the type Arrow gives its
    Python values (an int32 column is written as int64, as pandas would)."""
    return pa.array(column.to_pylist())


def _finish_meta(plan: ExportPlan, info: dict, stats: dict, out_fs, out_root: str) -> dict:
    """meta/stats.json and, last, meta/info.json (with what was left out) for either layout."""
    by_column = {feature.column: feature.key for feature in plan.features}
    lerobot_stats = {by_column[column]: value for column, value in stats.items() if column in by_column}
    out_fs.pipe_file(storage.join(out_root, "meta/stats.json"), json.dumps(lerobot_stats, indent=4).encode())
    if plan.left_out:
        info["mixtrain_export"] = {"left_out": plan.left_out}
    out_fs.pipe_file(storage.join(out_root, "meta/info.json"), json.dumps(info, indent=4).encode())
    return info


def _stats_order(plan: ExportPlan):
    position = {feature.key: number for number, feature in enumerate(plan.features)}
    names = {name: number for number, name in enumerate(["min", "max", "mean", "std", "count", *(q for q, _ in QUANTILES)])}

    def key(column: str) -> tuple:
        feature, _, stat = column[len("stats/"):].rpartition("/")
        return position.get(feature, len(position)), names.get(stat, len(names))

    return key


LAYOUTS = {"lerobot_v3": (write_group, write_meta), "lerobot_v2.1": (write_group_v21, write_meta_v21)}


class Writer:
    """The plan, the dataset's statistics and the layout, as the export's Beam steps call them
    (transforms/export.py)."""

    def __init__(self, plan: ExportPlan, stats: dict, layout: str = "lerobot_v3") -> None:
        self.plan, self.stats, self.layout = plan, stats, layout
        self.columns = plan.columns
        self.group_of = {episode.sequence_id: episode.group for episode in plan.episodes}

    def write_group(self, group: int, rows: pa.Table, dataset, out_fs, out_root: str) -> tuple[pa.Table, list[str]]:
        return LAYOUTS[self.layout][0](self.plan, group, rows, dataset, out_fs, out_root)

    def write_meta(self, records: list[pa.Table], out_fs, out_root: str) -> dict:
        return LAYOUTS[self.layout][1](self.plan, records, self.stats, out_fs, out_root)
