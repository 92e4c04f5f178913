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

import bisect
import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import fsspec
import pyarrow as pa

from formats import storage
from formats.errors import FormatError
from formats.sequence import DatasetMeta
from formats.sources import SourceReader

__all__ = ["ParquetSourceReader", "DecodedRowGroups", "read_row_groups", "key_ranges", "row_groups_holding", "table_or_empty"]

READ_BATCH_ROWS = 4096  # a row group longer than this is decoded in batches of it
READ_AHEAD_BYTES = 8 << 20  # the most (uncompressed) row-group bytes decoded ahead of the episode read


class ParquetSourceReader(SourceReader):
    """A reader of many episodes per Parquet file: each file's footer and key ranges are read
    once per worker (`self.footers`), not once per episode; the row groups decoded for the last
    episode are kept for the next one (`self.decoded`)."""

    def __init__(self, fs: fsspec.AbstractFileSystem, root: str, meta: DatasetMeta):
        super().__init__(fs, root, meta)
        self.footers = storage.ParquetFooters(fs)
        self.decoded = DecodedRowGroups()

    def close(self) -> None:
        self.decoded.close()

    def inside(self, relative: str, what: str) -> str:
        """`storage.resolve_inside` of a path the plan names, once per file while its episodes are
        read (a resolve checks every symlink on the way: 0.1 ms an episode)."""
        return self.footers.memo(("inside", relative, what),
                                 lambda: storage.resolve_inside(self.root, relative, what=what, fs=self.fs))


class DecodedRowGroups:
    """The decoded row groups of one file that the last episode needed, and those read ahead of it.

    Episodes of one read group arrive one after another in plan order, which is the files' key
    order in every writer's layout (where it is not, a row group is decoded again): the next one needs the
    same row group (one row group, many episodes) or the next ones, so keeping exactly what the
    last episode read decodes each row group once, and memory never holds more than the row
    groups one episode spans (what reading that episode alone held) and one batch read ahead
    (`get`). Another file, other
    columns or another footer (the file re-read after a change) start afresh.
    """

    def __init__(self):
        self._file: tuple | None = None
        self._metadata: Any = None
        self._groups: dict[int, Any] = {}  # the row groups the last episode needed
        self._ahead: dict[int, Any] = {}  # row groups read ahead of it (at most one batch: `_ahead`)
        self._last: int | None = None  # the last row group the last episode needed
        self._opened: tuple | None = None  # (path, footer, ParquetFile, handle or None) of the file read last

    def parquet(self, fs: fsspec.AbstractFileSystem, path: str, metadata: Any) -> Any:
        """`path` opened through `metadata`, kept open while its episodes are read: LeRobot writes a
        row group per episode, and opening the file again for each one cost more than decoding it
        (0.33 ms of 0.6 ms per episode). Opening another file (or the same one through another
        footer) closes it."""
        if self._opened is not None and self._opened[0] == path and self._opened[1] is metadata:
            return self._opened[2]
        self.close()
        local = storage.local_path(fs, path)
        handle = None if local else storage.open_input(fs, path)
        # pre_buffer coalesces ranged reads: worth it on object stores, 60 % slower per small local read.
        parquet = storage.parquet_file(local or handle, metadata=metadata, buffer_size=1 << 20, pre_buffer=not local)
        self._opened = (path, metadata, parquet, handle)
        return parquet

    def close(self) -> None:
        if self._opened is not None:
            _, _, parquet, handle = self._opened
            self._opened = None
            parquet.close()
            if handle is not None:
                handle.close()

    def get(self, path: str, metadata: Any, columns: Sequence[str] | None, groups: Sequence[int],
            decode: Callable[[list[int]], dict[int, Any]]) -> list[Any]:
        """What `decode` made of each of `groups`; `decode(missing)` is called (once, with the
        groups not kept, in order) only when some are missing. `metadata` is the footer the
        groups are read through: another footer object (the file re-read after a change) is
        another file.

        While a file is read forward (this episode's row groups go on from the last episode's),
        the small row groups after the episode's are decoded in the same call (`_ahead`):
        lerobot writes a row group per episode, and one decode of 80 of them costs a third of 80
        decodes. They are kept until an episode past them is read; what was read ahead of
        episodes that come in another order is let go as they pass it, so that memory stays at
        the row groups one episode spans and one batch read ahead. Each episode's slice of a
        batch holds the whole batch's buffers while the episode is alive (at most 4,096 rows)."""
        file = (path, tuple(columns) if columns is not None else None)
        if file != self._file or metadata is not self._metadata:  # forget the old file before decoding the new one
            self._file, self._metadata, self._groups, self._ahead, self._last = None, None, {}, {}, None
        kept = {**self._ahead, **self._groups}
        missing = [group for group in groups if group not in kept]
        decoded = {group: kept[group] for group in groups if group in kept}
        last = max(groups, default=-1)
        ahead = {group: part for group, part in self._ahead.items() if group > last}  # read ahead, not yet reached
        if missing:
            forward = self._last is not None and min(groups) <= self._last + 1 <= last  # on from the last episode's
            window = _ahead(metadata, missing, last) if forward else []
            made = decode(missing + [group for group in window if group not in ahead])
            decoded.update((group, made[group]) for group in missing)
            if forward:  # what is kept ahead is this one window, never more than one batch
                ahead = {group: ahead[group] if group in ahead else made[group] for group in window}
        self._file, self._metadata, self._last = file, metadata, last
        self._groups, self._ahead = {group: decoded[group] for group in groups}, ahead
        return [decoded[group] for group in groups]


def _ahead(metadata: Any, missing: Sequence[int], last: int) -> list[int]:
    """The row groups after `last` that one decode with `missing` takes: small ones, while the
    rows stay within one batch and the bytes within READ_AHEAD_BYTES."""
    rows = sum(metadata.row_group(group).num_rows for group in missing)
    size = sum(metadata.row_group(group).total_byte_size for group in missing)
    extra: list[int] = []
    for group in range(last + 1, metadata.num_row_groups):
        row_group = metadata.row_group(group)
        rows, size = rows + row_group.num_rows, size + row_group.total_byte_size
        if rows > READ_BATCH_ROWS or size > READ_AHEAD_BYTES:
            break
        extra.append(group)
    return extra


def read_row_groups(fs: fsspec.AbstractFileSystem, path: str, metadata: Any, groups: Sequence[int],
                    columns: Sequence[str] | None = None, opened: DecodedRowGroups | None = None) -> dict[int, pa.Table]:
    """Decode `groups` of one Parquet file, `columns` only (None: all), through the file `opened`
    keeps open (or, without it, one open for all of them). Runs of consecutive small row groups
    are decoded in one call and sliced apart (zero-copy): a call costs ~80 us beyond its rows."""
    columns = list(columns) if columns is not None else None
    decoded = {}
    with contextlib.nullcontext(opened) if opened is not None else contextlib.closing(DecodedRowGroups()) as files:
        parquet = files.parquet(fs, path, metadata)
        for run in _runs(metadata, groups):
            if len(run) > 1 or metadata.row_group(run[0]).num_rows <= READ_BATCH_ROWS:
                # Small row groups: Arrow's thread pool costs more than it saves (0.29 -> 0.16 ms).
                table = parquet.read_row_groups(run, columns=columns, use_threads=False)
                if table.num_rows != sum(metadata.row_group(group).num_rows for group in run):  # each group's rows are cut by the footer's counts
                    raise FormatError(f"{path}: row groups {run[0]}..{run[-1]} hold {table.num_rows} rows, not the "
                                      f"{sum(metadata.row_group(group).num_rows for group in run)} the footer counts")
                offset = 0
                for group in run:
                    rows = metadata.row_group(group).num_rows
                    decoded[group] = table.slice(offset, rows)
                    offset += rows
            else:  # in batches: decoding a long row group of list columns at once peaks at ~8x its size
                batches = parquet.iter_batches(batch_size=READ_BATCH_ROWS, row_groups=run, columns=columns)
                decoded[run[0]] = pa.Table.from_batches(list(batches))
    return decoded


def _runs(metadata: Any, groups: Sequence[int]) -> list[list[int]]:
    """`groups` cut into runs of consecutive row groups of at most READ_BATCH_ROWS rows in all; a
    longer row group is a run of its own."""
    runs: list[list[int]] = []
    rows = 0
    for group in groups:
        count = metadata.row_group(group).num_rows
        if runs and group == runs[-1][-1] + 1 and rows + count <= READ_BATCH_ROWS:
            runs[-1].append(group)
            rows += count
        else:
            runs.append([group])
            rows = count
    return runs


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


def _sorted_bounds(footers: storage.ParquetFooters, path: str, column: str) -> tuple[list, list] | None:
    """(minimums, maximums) of the row groups when both ascend (every writer's layout: episodes in
    key order), else None: then a range's row groups are found by two binary searches."""
    def compute():
        ranges = key_ranges(footers, path, column)
        if not ranges or any(bounds is None for bounds in ranges):
            return None
        lows, highs = [bounds[0] for bounds in ranges], [bounds[1] for bounds in ranges]
        try:
            ascending = all(a <= b for a, b in zip(lows, lows[1:])) and all(a <= b for a, b in zip(highs, highs[1:]))
        except TypeError:  # values that do not compare
            return None
        return (lows, highs) if ascending else None
    return footers.memo(("sorted bounds", path, column), compute)


def row_groups_holding(footers: storage.ParquetFooters, path: str, column: str, low: Any, high: Any) -> list[int]:
    """Row groups that may hold rows whose `column` is in [low, high] (both included). Scanning
    every row group for every episode was quadratic in episodes per file (10 million bound checks
    for 40 files of 500 episodes)."""
    bounds = _sorted_bounds(footers, path, column)
    if bounds is not None:
        try:  # groups whose maximum reaches low (a suffix) and whose minimum is at most high (a prefix)
            return list(range(bisect.bisect_left(bounds[1], low), bisect.bisect_right(bounds[0], high)))
        except TypeError:  # a key of another kind than the statistics: cannot rule any group out
            pass
    return [group for group, bounds in enumerate(key_ranges(footers, path, column)) if _holds(bounds, low, high)]


def table_or_empty(tables: list[pa.Table], schema: pa.Schema, columns: list[str] | None) -> pa.Table:
    """The row groups' tables as one (zero-copy), or an empty table of the file's columns."""
    if tables:
        return pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    empty = schema.empty_table()
    return empty.select(columns) if columns is not None else empty
