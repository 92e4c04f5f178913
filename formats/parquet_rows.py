"""Rows of one key range from a Parquet file's row groups: what every source that packs many
episodes into one file needs (LeRobot data files, ORTF chunk files).

Only the row groups whose min/max statistics of the key column can hold the range are read; a row
group without statistics (or whose statistics cannot be compared with the key: integer ids
against string ids) is always read. The caller filters the rows it gets back to its own key.
"""

from __future__ import annotations

from typing import Any

import fsspec

from formats import storage
from formats.sequence import DatasetMeta
from formats.source import SourceReader

__all__ = ["ParquetSourceReader", "key_ranges", "row_groups_holding"]


class ParquetSourceReader(SourceReader):
    """A reader of many episodes per Parquet file: each file's footer and key ranges are read
    once per worker (`self.footers`), not once per episode."""

    def __init__(self, fs: fsspec.AbstractFileSystem, root: str, meta: DatasetMeta):
        super().__init__(fs, root, meta)
        self.footers = storage.ParquetFooters(fs)


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


def row_groups_holding(footers: storage.ParquetFooters, path: str, column: str, low: Any, high: Any) -> list[int]:
    """Row groups that may hold rows whose `column` is in [low, high] (both included)."""
    groups = []
    for group, bounds in enumerate(key_ranges(footers, path, column)):
        try:
            if bounds is None or (bounds[1] >= low and bounds[0] <= high):
                groups.append(group)
        except TypeError:  # statistics of another kind than the key: cannot rule the group out
            groups.append(group)
    return groups
