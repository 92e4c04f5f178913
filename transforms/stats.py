"""Statistics for stats.json as a Beam CombineFn over per-shard partials.

Each shard writer summarises its own rows (sorted by sequence_id) into `ColumnStats`; this
CombineFn collects the partials keyed by shard index and folds them in shard order at the end,
so the floating-point result does not depend on how the runner ordered the merges.
"""

from __future__ import annotations

import apache_beam as beam

from formats.mixtrain.stats import ColumnStats, summarise

__all__ = ["MergeShardStatsFn"]


class MergeShardStatsFn(beam.CombineFn):
    """(shard_index, {column: ColumnStats}) elements -> the stats.json dict."""

    def create_accumulator(self) -> dict[int, dict[str, ColumnStats]]:
        return {}

    def add_input(self, accumulator, element):
        index, partial = element
        accumulator[int(index)] = partial
        return accumulator

    def merge_accumulators(self, accumulators):
        merged: dict[int, dict[str, ColumnStats]] = {}
        for accumulator in accumulators:
            merged.update(accumulator)
        return merged

    def extract_output(self, accumulator) -> dict[str, dict]:
        return summarise([accumulator[index] for index in sorted(accumulator)])
