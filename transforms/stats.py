"""Statistics for stats.json as a Beam CombineFn over the shard writers' results.

Each shard writer summarises its own rows (sorted by sequence_id) into `ColumnStats`; this
CombineFn collects the shard results keyed by shard index and folds their partials in shard order
at the end, so the floating-point result does not depend on how the runner ordered the merges.
The data-quality findings (formats/mixtrain/quality.py) merge as they arrive.
"""

from __future__ import annotations

import dataclasses

import apache_beam as beam

from formats.mixtrain.quality import Partial
from formats.mixtrain.stats import summarise

__all__ = ["MergeShardsFn"]


class MergeShardsFn(beam.CombineFn):
    """Shard results (dataclasses with `index`, `stats`, {column: ColumnStats}, and `quality`, a
    quality.Partial or None) -> (every result in shard order, copies included, their stats and
    findings emptied: sketches are MBs; the stats.json dict, one partial per shard; the findings
    of every shard merged, or None). One combine for all three, where a list of the results and a
    merge of their stats were two: each global combine is two more stages after the last shard,
    0.05-0.1 s each on a local runner. Findings merge as results arrive (their merge does not
    depend on the order), so the combine holds one set of them, not one per shard. A shard's
    result delivered twice stays twice: the publish step counts what arrived, and refuses a
    runner that delivered work twice."""

    def create_accumulator(self) -> list:
        return [[], None]  # [shard results, merged findings]

    def add_input(self, accumulator, shard):
        found = getattr(shard, "quality", None)
        if found is not None:
            accumulator[1] = (accumulator[1] or Partial()).merge(found)  # never the input's own object, which it would change
            shard = dataclasses.replace(shard, quality=None)
        accumulator[0].append(shard)
        return accumulator

    def merge_accumulators(self, accumulators):
        shards, found = [], None
        for held, partial in accumulators:
            shards += held
            if partial is not None:
                found = partial if found is None else found.merge(partial)
        return [shards, found]

    def extract_output(self, accumulator) -> tuple[list, dict[str, dict], Partial | None]:
        shards = sorted(accumulator[0], key=lambda shard: int(shard.index))
        partials = {int(shard.index): shard.stats for shard in shards}  # in shard order, one a shard
        return [dataclasses.replace(shard, stats={}) for shard in shards], summarise(list(partials.values())), accumulator[1]
