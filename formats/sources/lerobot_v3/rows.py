"""LeRobot v3 episodes read on a worker: one episode's rows out of a shared data file, as a Sequence.

The metadata side (info.json, the episode index, the columns) is formats/sources/lerobot_v3/__init__.py; this module
only reads what a planned EpisodeRef points at. An episode is read by its `index` range: only the
row groups whose statistics overlap it (formats/sources/parquet_rows.py). The reader keeps the row groups
it decoded for the last episode, and cuts the next episode out of them when it lives there too:
a data file's episodes (its read group) arrive one after another in plan order, so a data file
of one row group holding 80 episodes is decoded once, not 80 times.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from formats import storage
from formats.arrow_types import conform, is_empty_type, is_list
from formats.errors import ConversionError, FormatError, in_context
from formats.sequence import FROM_IMAGES, VIDEO, ColumnSpec, DatasetMeta, ImageFrames, Sequence, VideoSegment, rebased_timestamps
from formats.sources import SourceRef, parquet_rows

__all__ = ["Reader", "EpisodeRef", "episode_columns", "episode_images"]


@dataclasses.dataclass(frozen=True, slots=True)
class EpisodeRef(SourceRef):
    """One episode's address in the source: small, picklable, no frame data. Slotted, and its
    repeated values (data file, video paths, tasks) shared between refs by the plan: a million
    of them are held on the launcher at once."""

    episode_index: int
    sequence_id: str
    length: int
    data_file: str  # relative to the root
    from_index: int
    to_index: int
    tasks: tuple[str, ...]
    videos: tuple[tuple[str, VideoSegment], ...]  # (column, segment)
    scalars: tuple[tuple[str, Any], ...]  # episode-level fields: (column, value)

    @property
    def estimated_steps(self) -> int:
        return self.length

    @property
    def read_group(self) -> str:
        """The data file: its episodes, loaded one after another, decode each row group once."""
        return self.data_file

    @property
    def unit_files(self) -> tuple[str, ...]:
        return (self.data_file, *(segment.path for _, segment in self.videos))


class Reader(parquet_rows.ParquetSourceReader):
    """Opened once per worker: data-file footers and key ranges are read once per file, and the
    row groups decoded for one episode serve the next ones that live in them."""

    def load(self, ref: EpisodeRef) -> Sequence:
        fs, root, meta, footers = self.fs, self.root, self.meta, self.footers
        data_path = self.inside(ref.data_file, "data file")
        try:
            if footers.memo(("changed since plan", data_path), lambda: _changed_since_plan(fs, data_path, footers, meta)):
                raise FormatError(f"{data_path}: {ref.sequence_id}: changed while it was being converted (rerun the conversion)")
            table = self.episode_rows(data_path, ref)
            sequence = _to_sequence(table, ref, meta)
            for spec in meta.columns:
                if spec.kind == VIDEO and spec.meta.get("encoded_from") == FROM_IMAGES:
                    images = episode_images(fs, root, spec.meta["source"], table.column(spec.meta["source"]), ref)
                    sequence.videos[spec.name] = ImageFrames(images.frames, source=data_path)
            return sequence
        except ConversionError as error:
            raise in_context(error, file=data_path, sequence=ref.sequence_id) from error
        except (OSError, pa.ArrowException) as error:
            reason = "changed while it was being converted (rerun the conversion)" if _changed_since_read(fs, data_path, footers) \
                else f"cannot read data: {error}"
            failure = FormatError(f"{data_path}: {ref.sequence_id}: {reason}")
            failure.file, failure.sequence = data_path, ref.sequence_id
            raise failure from error

    def episode_rows(self, path: str, ref: EpisodeRef) -> pa.Table:
        """The episode's rows (the columns `episode_columns` names), by its `index` range in a shared data file."""
        return _read_episode_rows(self.fs, path, ref, self.meta, self.footers, self.decoded)


def _changed_since_plan(fs, path: str, footers: storage.ParquetFooters, meta: DatasetMeta) -> bool:
    """Whether the file's footer now differs from the one read while planning (a data file
    rewritten during the run reads as garbage through the old footer: say so, not "thrift").
    The plan keeps each footer's signature (`meta.private["footers"]`); the reader's first read of
    a file is compared with it."""
    planned = meta.private.get("footers", {}).get(path)
    try:
        if planned is None or not fs.exists(path):
            return False
        return storage.footer_signature(footers.footer(path)) != planned
    except (OSError, pa.ArrowException):
        return False  # unreadable now (and maybe then): the read error itself says more


def _changed_since_read(fs, path: str, footers: storage.ParquetFooters) -> bool:
    """After a failed read: whether the file's footer now differs from the one the reader used."""
    try:
        with storage.open_input(fs, path) as handle:
            current = storage.parquet_file(handle).metadata
        return not current.equals(footers.footer(path))
    except (OSError, pa.ArrowException):
        return False  # unreadable now (and maybe then): the read error itself says more


# --- data ---------------------------------------------------------------------------------------


def episode_columns(fs, path: str, ref: EpisodeRef, meta: DatasetMeta, footers: storage.ParquetFooters) -> tuple[Any, pa.Schema, list[str]]:
    """(footer, schema, columns to read) of an episode's data file: the bookkeeping columns the
    file has and the features the plan declared (each must be there)."""
    if not footers.memo(("exists", path), lambda: fs.exists(path)):  # once per file while its episodes are read
        raise FormatError(f"data file not found (episode {ref.episode_index})")
    metadata = footers.footer(path)
    schema = footers.schema(path)
    wanted = [spec.meta["source"] for spec in meta.columns
              if (spec.kind in ("trajectory", "steps") or spec.meta.get("encoded_from") == FROM_IMAGES)
              and spec.meta.get("source") not in (None, "task_index")]
    missing = [key for key in wanted if schema.get_field_index(key) < 0]
    if missing:
        raise FormatError(f"columns {missing} declared in meta/info.json are missing from the data file")
    extra = [c for c in ("timestamp", "frame_index", "episode_index", "task_index") if schema.get_field_index(c) >= 0]
    return metadata, schema, list(dict.fromkeys([*extra, *wanted]))


def _read_episode_rows(fs, path: str, ref: EpisodeRef, meta: DatasetMeta, footers: storage.ParquetFooters,
                       decoded: parquet_rows.DecodedRowGroups) -> pa.Table:
    metadata, schema, columns = episode_columns(fs, path, ref, meta, footers)
    key_column = "index" if schema.get_field_index("index") >= 0 else "episode_index"
    columns = list(dict.fromkeys([key_column, *columns]))
    low, high = (ref.from_index, ref.to_index) if key_column == "index" else (ref.episode_index, ref.episode_index + 1)
    groups = parquet_rows.row_groups_holding(footers, path, key_column, low, high - 1)
    parts = decoded.get(path, metadata, columns, groups,
                        lambda missing: _decode(fs, path, metadata, columns, key_column, missing, decoded))
    table = _cut(parts, low, high, schema, columns, key_column)
    if table.num_rows != ref.length:
        raise FormatError(
            f"episode {ref.episode_index}: offsets {key_column} {low}..{high} point past the data file "
            f"({table.num_rows} of {ref.length} rows found)"
        )
    if key_column == "index":
        order = table.column("index").to_numpy()
        if not np.array_equal(order, np.arange(low, high)):
            table = table.sort_by("index")
        if "episode_index" in table.column_names:
            found = np.unique(table.column("episode_index").to_numpy())
            if found.tolist() != [ref.episode_index]:
                raise FormatError(f"rows {low}..{high} belong to episode(s) {found.tolist()}, not episode {ref.episode_index}")
    return table


class _RowGroup:
    """One decoded row group and its key column as numpy, when that is null-free integers."""

    def __init__(self, table: pa.Table, key_column: str):
        self.table = table
        keys = table.column(key_column)
        numeric = pa.types.is_integer(keys.type) and keys.null_count == 0
        self.keys = keys.to_numpy() if numeric else None
        self.sorted = self.keys is not None and bool((self.keys[1:] >= self.keys[:-1]).all())


def _decode(fs, path: str, metadata, columns: list[str], key_column: str, groups: list[int],
            opened: parquet_rows.DecodedRowGroups) -> dict[int, _RowGroup]:
    """Decode `groups` of the data file (kept open for the next episodes: a row group each, in lerobot's layout)."""
    return {group: _RowGroup(table, key_column)
            for group, table in parquet_rows.read_row_groups(fs, path, metadata, groups, columns, opened=opened).items()}


def _cut(parts: list[_RowGroup], low: int, high: int, schema: pa.Schema, columns: list[str], key_column: str) -> pa.Table:
    """The rows whose key is in [low, high), in file order: zero-copy slices of row groups whose
    key is sorted (a binary search each), else a filter (a copy) over the row groups read."""
    if all(part.sorted for part in parts):
        pieces = []
        for part in parts:
            start, stop = np.searchsorted(part.keys, [low, high], side="left").tolist()
            if stop > start:
                pieces.append(part.table.slice(start, stop - start))
        return parquet_rows.table_or_empty(pieces, schema, columns)
    table = parquet_rows.table_or_empty([part.table for part in parts], schema, columns)
    keys = table.column(key_column)
    mask = pc.and_(pc.greater_equal(keys, low), pc.less(keys, high))
    if not pc.all(mask).as_py():  # row groups shared with neighbours: keep only this episode's rows (a copy)
        table = table.filter(mask)
    return table


def _to_sequence(table: pa.Table, ref: EpisodeRef, meta: DatasetMeta) -> Sequence:
    length = ref.length
    if "frame_index" in table.column_names:
        frames = table.column("frame_index").to_numpy()
        if not np.array_equal(frames, np.arange(length)):
            raise FormatError(f"episode {ref.episode_index}: frame_index is not 0..{length - 1}")
    clock_start = 0.0
    if "timestamp" in table.column_names:  # float32 in lerobot: rebased in float64, as before the rule existed
        raw = table.column("timestamp").to_numpy().astype(np.float64)
        timestamp = rebased_timestamps(raw, meta.fps)
        clock_start = float(raw[0]) if len(raw) else 0.0
    else:
        timestamp = np.arange(length, dtype=np.float64) / meta.fps
    sequence = Sequence(sequence_id=ref.sequence_id, length=length, timestamp=timestamp)
    if clock_start:  # lerobot's episodes start at 0: a later start is worth a look (quality check clock_start)
        sequence.source_facts["clock_start"] = clock_start
    sequence.scalars.update(ref.scalars)
    sequence.scalars["length"] = length
    sequence.scalars["duration_seconds"] = length / meta.fps
    sequence.scalars["tasks"] = list(ref.tasks)
    sequence.scalars["task"] = ref.tasks[0] if ref.tasks else None
    task_texts = meta.source.get("tasks") or {}
    if "task_index" in table.column_names and task_texts:
        per_step = table.column("task_index").to_numpy()
        first = task_texts.get(int(per_step[0]))
        if first is not None:
            sequence.scalars["task"] = first
    for spec in meta.columns:
        source = spec.meta.get("source")
        if spec.kind == "trajectory":
            sequence.trajectories[spec.name] = _trajectory(table.column(source), spec, length)
        elif spec.kind == "steps" and spec.name == "task_index" and source == "task_index":
            sequence.steps["task_index"] = _local_task_indices(table, ref, task_texts)
        elif spec.kind == "steps":
            column = _steps(table.column(source).combine_chunks(), spec)
            numeric = pa.types.is_integer(column.type) or pa.types.is_floating(column.type)
            sequence.steps[spec.name] = column.to_numpy(zero_copy_only=False) if numeric and column.null_count == 0 else column
    sequence.videos.update(dict(ref.videos))
    return sequence


def episode_images(fs, root: str, key: str, column: pa.ChunkedArray, ref: EpisodeRef) -> ImageFrames:
    """An `image` feature's cells (Hugging Face Image storage: struct<bytes, path>, or plain
    binary) -> the encoded images; a cell without bytes is read from its path under the root."""
    array = column.combine_chunks()
    if pa.types.is_struct(array.type):
        names = [array.type.field(i).name for i in range(array.type.num_fields)]
        blobs = array.field("bytes").to_pylist() if "bytes" in names else [None] * len(array)
        paths = array.field("path").to_pylist() if "path" in names else [None] * len(array)
    elif pa.types.is_binary(array.type) or pa.types.is_large_binary(array.type):
        blobs, paths = array.to_pylist(), [None] * len(array)
    else:
        raise FormatError(f"image feature {key!r} is stored as {array.type}, expected struct<bytes, path> or binary")
    frames = []
    for step, (blob, path) in enumerate(zip(blobs, paths)):
        if blob is None and path:
            image_path = storage.resolve_inside(root, path, what="image file", fs=fs)
            if not fs.exists(image_path):
                raise FormatError(f"episode {ref.episode_index}: {key!r} frame {step}: image file {path} not found")
            blob = fs.cat_file(image_path)
        if blob is None:
            raise FormatError(f"episode {ref.episode_index}: {key!r} frame {step} has no image (neither bytes nor path)")
        frames.append(blob)
    return ImageFrames(frames)


def _steps(column: pa.Array, spec: ColumnSpec) -> pa.Array:
    """A per-step column in the column's declared value type: numeric features as info.json says
    (a one-value list per step unwrapped), other types conformed to the type all files share."""
    kind = spec.arrow_type.value_type
    if is_list(column.type) and not is_list(kind) and not is_empty_type(column.type):
        lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False)
        if column.null_count or not (lengths == 1).all():
            raise FormatError(f"feature {spec.meta['source']!r}: a shape [1] feature holds lists of other lengths")
        column = column.flatten()
    if column.type == kind:
        return column
    if spec.meta.get("type") == "language" or is_list(kind) or pa.types.is_struct(kind):
        return conform(column, kind)
    return column.cast(kind)


def _trajectory(column: pa.ChunkedArray, spec: ColumnSpec, length: int) -> np.ndarray:
    """[T, D] in the source dtype, from fixed_size_list, list, or nested (Array2D+) storage; a
    variable-size list (files rewritten through pandas) must hold D values at every step."""
    array = column.combine_chunks()
    dim = spec.meta["dim"]
    if array.null_count:
        raise FormatError(f"feature {spec.meta['source']!r}: step {array.is_null().to_numpy(zero_copy_only=False).argmax()} is null")
    if pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
        per_step = _values_per_step(array)
        if not (per_step == dim).all():
            step = int(np.argmax(per_step != dim))
            raise FormatError(f"feature {spec.meta['source']!r}: step {step} holds {per_step[step]} values, info.json declares {dim}")
    while is_list(array.type):
        array = array.flatten()
    values = array.to_numpy(zero_copy_only=False)
    if values.size != length * dim:
        raise FormatError(f"feature {spec.meta['source']!r}: {values.size} values for {length} steps x {dim} dims")
    return values.astype(np.dtype(spec.meta["dtype"]), copy=False).reshape(length, dim)


def _values_per_step(array: pa.Array) -> np.ndarray:
    """How many leaf values each step of a (possibly nested) list column holds."""
    bounds = np.arange(len(array) + 1, dtype=np.int64)  # step boundaries, as indices into `level`
    level = array
    while is_list(level.type):
        if pa.types.is_fixed_size_list(level.type):
            bounds = (bounds + level.offset) * level.type.list_size
        else:
            bounds = level.offsets.to_numpy().astype(np.int64)[bounds]
        level = level.values
    return np.diff(bounds)


def _local_task_indices(table: pa.Table, ref: EpisodeRef, task_texts: dict[int, str]) -> np.ndarray:
    """Per-step global task_index -> position in this episode's `tasks` (one lookup per distinct task)."""
    positions = {text: i for i, text in enumerate(ref.tasks)}
    global_indices = table.column("task_index").to_numpy()
    distinct, inverse = np.unique(global_indices, return_inverse=True)
    local = np.empty(len(distinct), np.int32)
    for k, global_index in enumerate(distinct.tolist()):
        text = task_texts.get(global_index)
        if text not in positions:
            frame = int(np.argmax(global_indices == global_index))
            raise FormatError(f"episode {ref.episode_index}: frame {frame} has task_index {global_index} outside the episode's tasks")
        local[k] = positions[text]
    return local[inverse]
