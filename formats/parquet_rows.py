"""Rows of one key range from a Parquet file's row groups: what every source that packs many
episodes into one file needs (LeRobot data files, ORTF chunk files).

Only the row groups whose min/max statistics of the key column can hold the range are read; a row
group without statistics (or whose statistics cannot be compared with the key: integer ids
against string ids) is always read. The caller cuts its own key's rows out of what it gets back.

Many episodes share a row group (a file rewritten by pandas is one row group of up to 100 MB):
`first_row_groups` names, at plan time, the row group each episode starts in (its read group,
`SourceRef.read_group`), and a reader keeps the row groups it decoded last (`DecodedRowGroups`),
so episodes loaded one after another decode each row group once instead of once per episode.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa

from formats import storage
from formats.sequence import DatasetMeta
from formats.source import SourceReader

__all__ = ["ParquetSourceReader", "DecodedRowGroups", "key_ranges", "row_groups_holding", "first_row_groups", "with_first_row_groups",
           "table_or_empty"]


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

    Episodes of one read group arrive one after another in key order: the next one needs the
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


def first_row_groups(ranges: list[tuple[Any, Any] | None], spans: Sequence[tuple[Any, Any]]) -> list[int | None]:
    """Per key span [low, high] (both included): the first row group `row_groups_holding` would
    read for it, None when none can hold it. `ranges` is `key_ranges` of the file.

    Vectorised when the statistics are known integers in key order (what every writer of
    episode-ordered files leaves): planning a million episodes must not scan every row group
    for each of them."""
    if not spans:
        return []
    integer = all(bounds is not None and all(isinstance(v, int) and not isinstance(v, bool) for v in bounds) for bounds in ranges) \
        and all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for span in spans for v in span)
    if integer and ranges:
        mins = np.array([bounds[0] for bounds in ranges], np.int64)
        maxs = np.array([bounds[1] for bounds in ranges], np.int64)
        if (np.diff(mins) >= 0).all() and (np.diff(maxs) >= 0).all():
            lows, highs = (np.array(values, np.int64) for values in zip(*spans))
            first = np.searchsorted(maxs, lows, side="left")  # the first group whose max reaches low ...
            holds = (first < len(ranges)) & (mins[np.minimum(first, len(ranges) - 1)] <= highs)  # ... and whose min is below high
            return [int(group) if held else None for group, held in zip(first.tolist(), holds.tolist())]
    return [next((group for group, bounds in enumerate(ranges) if _holds(bounds, low, high)), None) for low, high in spans]


def with_first_row_groups(refs: list, file_of: Callable[[Any], str], key_ranges: dict[str, tuple[str, list]],
                          span_of: Callable[[Any, str], tuple[Any, Any]]) -> list:
    """The refs, each with `first_row_group` (a dataclass field) set to the first row group of its
    file that can hold its key span: the row group the reader decodes first, which names its read
    group. `key_ranges`: file -> (key column, `key_ranges` of it), from the footers the plan read
    anyway; `span_of(ref, key column)` -> [low, high]. Refs of a file not in `key_ranges` (its
    footer unreadable: load reports it) or that no row group can hold keep None.

    The list is updated in place (and returned): a million refs and their copies are not held at once."""
    by_file: dict[str, list[int]] = {}
    for position, ref in enumerate(refs):
        by_file.setdefault(file_of(ref), []).append(position)
    for file, positions in by_file.items():
        if file not in key_ranges:
            continue
        key, ranges = key_ranges[file]
        for position, first in zip(positions, first_row_groups(ranges, [span_of(refs[p], key) for p in positions])):
            if first is not None:
                refs[position] = dataclasses.replace(refs[position], first_row_group=first)
    return refs


def table_or_empty(tables: list[pa.Table], schema: pa.Schema, columns: list[str] | None) -> pa.Table:
    """The row groups' tables as one (zero-copy), or an empty table of the file's columns."""
    if tables:
        return pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    empty = schema.empty_table()
    return empty.select(columns) if columns is not None else empty
