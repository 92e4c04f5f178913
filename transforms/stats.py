"""Statistics for stats.json as a Beam CombineFn over the shard writers' results.

Each shard writer summarises its own rows (sorted by sequence_id) into `ColumnStats`; this
CombineFn collects the shard results keyed by shard index and folds their partials in shard order
at the end, so the floating-point result does not depend on how the runner ordered the merges.
"""

from __future__ import annotations

import dataclasses

import apache_beam as beam

from formats.mixtrain.stats import summarise

__all__ = ["MergeShardsFn"]


class MergeShardsFn(beam.CombineFn):
    """Shard results (dataclasses with `index` and `stats`, {column: ColumnStats}) -> (every result
    in shard order, copies included, their stats emptied: sketches are MBs; the stats.json dict,
    one partial per shard). One combine for both, where a list of the results and a merge of their
    stats were two: each global combine is two more stages after the last shard, 0.05-0.1 s each
    on a local runner. A shard's result delivered twice stays twice: the publish step counts what
    arrived, and refuses a runner that delivered work twice."""

    def create_accumulator(self) -> list:
        return []

    def add_input(self, accumulator, shard):
        accumulator.append(shard)
        return accumulator

    def merge_accumulators(self, accumulators):
        return [shard for accumulator in accumulators for shard in accumulator]

    def extract_output(self, accumulator) -> tuple[list, dict[str, dict]]:
        shards = sorted(accumulator, key=lambda shard: int(shard.index))
        partials = {int(shard.index): shard.stats for shard in shards}  # in shard order, one a shard
        return [dataclasses.replace(shard, stats={}) for shard in shards], summarise(list(partials.values()))
