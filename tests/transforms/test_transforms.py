"""Wiring only: ReadSequences yields one sequence per ref; stats merge in shard order."""

import apache_beam as beam
import numpy as np
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from formats import lerobot_v3, sources, storage
from formats.stats import ColumnStats, summarise
from transforms.read import ReadSequences, stage_refs
from transforms.stats import MergeShardStatsFn


def test_read_sequences_one_per_ref(multi_file_dataset, tmp_path):
    path, truth = multi_file_dataset
    fs, root = storage.open_root(str(path))
    meta, refs = lerobot_v3.plan(fs, root)
    files = stage_refs(refs, str(tmp_path / "plan"))
    with TestPipeline(runner="FnApiRunner") as pipeline:
        loaded = (pipeline | ReadSequences(sources.get("lerobot_v3"), storage.url_for(fs, root), meta, str(tmp_path / "plan"),
                                           files))["sequences"]
        summary = loaded | beam.Map(lambda s: (s.sequence_id, s.length, float(s.trajectories["action"].sum())))
        expected = [(f"episode_{i:06d}", len(a), float(a.sum())) for i, a in enumerate(truth["action"])]
        assert_that(summary, equal_to(expected))


def test_merge_shard_stats_is_order_independent():
    rng = np.random.default_rng(0)
    partials = [(i, {"x": ColumnStats.of(rng.normal(size=(5000, 2)))}) for i in range(6)]
    expected = summarise([p for _, p in partials])
    with TestPipeline(runner="FnApiRunner") as pipeline:
        merged = pipeline | beam.Create(list(reversed(partials))) | beam.CombineGlobally(MergeShardStatsFn())
        assert_that(merged, equal_to([expected]))
