"""Rows of one key range from a Parquet file's row groups: what every source that packs many
episodes into one file needs (LeRobot data files, ORTF chunk files).

Only the row groups whose min/max statistics of the key column can hold the range are read; a row
group without statistics (or whose statistics cannot be compared with the key: integer ids
against string ids) is always read. The caller cuts its own key's rows out of what it gets back.

Many episodes share a row group (a file rewritten by pandas is one row group of up to 100 MB):
a file's episodes are one read group (`SourceRef.read_group`), loaded one after another by one
reader, which keeps the row groups it decoded last (`DecodedRowGroups`), so each row group is
decoded once instead of once per episode.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import fsspec
import pyarrow as pa

from formats import storage
from formats.sequence import DatasetMeta
from formats.sources import SourceReader

__all__ = ["ParquetSourceReader", "DecodedRowGroups", "read_row_groups", "key_ranges", "row_groups_holding", "table_or_empty"]

READ_BATCH_ROWS = 4096  # a row group longer than this is decoded in batches of it


class ParquetSourceReader(SourceReader):
    """A reader of many episodes per Parquet file: each file's footer and key ranges are read
    once per worker (`self.footers`), not once per episode; the row groups decoded for the last
    episode are kept for the next one (`self.decoded`)."""

    def __init__(self, fs: fsspec.AbstractFileSystem, root: str, meta: DatasetMeta):
        super().__init__(fs, root, meta)
        self.footers = storage.ParquetFooters(fs)
        self.decoded = DecodedRowGroups()


class DecodedRowGroups:
    """The decoded row groups of one file that the last episode needed, and nothing else.

    Episodes of one read group arrive one after another in plan order, which is the files' key
    order in every writer's layout (where it is not, a row group is decoded again): the next one needs the
    same row group (one row group, many episodes) or the next ones, so keeping exactly what the
    last episode read decodes each row group once, and memory never holds more than the row
    groups one episode spans (what reading that episode alone held). Another file, other
    columns or another footer (the file re-read after a change) start afresh.
    """

    def __init__(self):
        self._file: tuple | None = None
        self._metadata: Any = None
        self._groups: dict[int, Any] = {}

    def get(self, path: str, metadata: Any, columns: Sequence[str] | None, groups: Sequence[int],
            decode: Callable[[list[int]], dict[int, Any]]) -> list[Any]:
        """What `decode` made of each of `groups`; `decode(missing)` is called (once, with the
        groups not kept, in order) only when some are missing. `metadata` is the footer the
        groups are read through: another footer object (the file re-read after a change) is
        another file."""
        file = (path, tuple(columns) if columns is not None else None)
        if file != self._file or metadata is not self._metadata:
            self._file, self._metadata, self._groups = None, None, {}  # forget the old file before decoding the new one
        missing = [group for group in groups if group not in self._groups]
        decoded = {group: self._groups[group] for group in groups if group in self._groups}
        if missing:
            decoded.update(decode(missing))
        self._file, self._metadata = file, metadata
        self._groups = {group: decoded[group] for group in groups}
        return [decoded[group] for group in groups]


def read_row_groups(fs: fsspec.AbstractFileSystem, path: str, metadata: Any, groups: Sequence[int],
                    columns: Sequence[str] | None = None) -> dict[int, pa.Table]:
    """Decode `groups` of one Parquet file (one open for all of them), `columns` only (None: all)."""
    local = storage.local_path(fs, path)
    columns = list(columns) if columns is not None else None
    decoded = {}
    with contextlib.nullcontext(local) if local else storage.open_input(fs, path) as handle:  # local: Arrow's own reads
        # pre_buffer coalesces ranged reads: worth it on object stores, 60 % slower per small local read.
        parquet = storage.parquet_file(handle, metadata=metadata, buffer_size=1 << 20, pre_buffer=not local)
        for group in groups:
            if metadata.row_group(group).num_rows <= READ_BATCH_ROWS:
                # A small row group: Arrow's thread pool costs more than it saves (0.29 -> 0.16 ms).
                decoded[group] = parquet.read_row_group(group, columns=columns, use_threads=False)
            else:  # in batches: decoding a long row group of list columns at once peaks at ~8x its size
                batches = parquet.iter_batches(batch_size=READ_BATCH_ROWS, row_groups=[group], columns=columns)
                decoded[group] = pa.Table.from_batches(list(batches))
    return decoded


def key_ranges(footers: storage.ParquetFooters, path: str, column: str) -> list[tuple[Any, Any] | None]:
    """Per row group: (min, max) statistics of `column`, None when unknown. Read once per file
    and holder: a file holds many episodes, and scanning its row groups for each of them was
    quadratic in episodes per file."""
    def compute():
        metadata = footers.footer(path)
        # Parquet numbers leaf columns: a struct or list feature before `column` shifts its position.
        position = next((i for i in range(metadata.num_columns) if metadata.schema.column(i).path == column), None)
        ranges: list[tuple[Any, Any] | None] = []
        for group in range(metadata.num_row_groups):
            stats = metadata.row_group(group).column(position).statistics if position is not None else None
            ranges.append((stats.min, stats.max) if stats is not None and stats.has_min_max else None)
        return ranges
    return footers.memo(("key ranges", path, column), compute)


def _holds(bounds: tuple[Any, Any] | None, low: Any, high: Any) -> bool:
    try:
        return bounds is None or (bounds[1] >= low and bounds[0] <= high)
    except TypeError:  # statistics of another kind than the key: cannot rule the group out
        return True


def row_groups_holding(footers: storage.ParquetFooters, path: str, column: str, low: Any, high: Any) -> list[int]:
    """Row groups that may hold rows whose `column` is in [low, high] (both included)."""
    return [group for group, bounds in enumerate(key_ranges(footers, path, column)) if _holds(bounds, low, high)]


def table_or_empty(tables: list[pa.Table], schema: pa.Schema, columns: list[str] | None) -> pa.Table:
    """The row groups' tables as one (zero-copy), or an empty table of the file's columns."""
    if tables:
        return pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    empty = schema.empty_table()
    return empty.select(columns) if columns is not None else empty
