"""Wiring only: ReadSequences yields one sequence per ref; stats merge in shard order."""

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from formats import sources, storage
from formats.errors import ConversionError
from formats.mixtrain.stats import ColumnStats, summarise
from formats.sources import lerobot_v3
from transforms import staged_plan
from transforms.read import ReadSequences, stage_refs
from transforms.stats import MergeShardsFn


def test_read_sequences_one_per_ref(multi_file_dataset, tmp_path):
    path, truth = multi_file_dataset
    fs, root = storage.open_root(str(path))
    meta, refs = lerobot_v3.plan(fs, root)
    plan_folder = staged_plan.PlanFolder.create(str(tmp_path / "plan"))
    files = stage_refs(refs, plan_folder)
    with TestPipeline(runner="FnApiRunner") as pipeline:
        loaded = (pipeline | ReadSequences(sources.get("lerobot_v3"), storage.url_for(fs, root), meta, plan_folder, files))["sequences"]
        summary = loaded | beam.Map(lambda s: (s.sequence_id, s.length, float(s.trajectories["action"].sum())))
        expected = [(f"episode_{i:06d}", len(a), float(a.sum())) for i, a in enumerate(truth["action"])]
        assert_that(summary, equal_to(expected))


def test_merge_shards_is_order_independent_and_empties_the_results_stats():
    from transforms.write import ShardResult

    rng = np.random.default_rng(0)
    shards = [ShardResult(i, 10 + i, 100, 1000, {"x": ColumnStats.of(rng.normal(size=(5000, 2)))}) for i in range(6)]
    expected = ([ShardResult(i, 10 + i, 100, 1000, {}) for i in range(6)], summarise([shard.stats for shard in shards]), None)
    with TestPipeline(runner="FnApiRunner") as pipeline:
        merged = pipeline | beam.Create(list(reversed(shards))) | beam.CombineGlobally(MergeShardsFn())
        assert_that(merged, equal_to([expected]))


def test_a_publish_step_retried_after_it_published_leaves_the_dataset_as_published(multi_file_dataset, tmp_path):
    """Dataflow retries a bundle whose worker died after its work: the retried publish step finds
    its staging gone (publication removes it) and must not publish again from nothing (that wrote
    empty shards over the dataset)."""
    import hashlib
    import json

    from pipelines import convert
    from transforms.write import _PublishFn

    root, _ = multi_file_dataset
    output = tmp_path / "out"
    assert convert.run([f"--input={root}", f"--output={output}", "--progress=off"]) == 0
    sidecar = json.loads((output / "mixtrain.json").read_text())

    def digest():
        return {str(p.relative_to(output)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(output.rglob("*")) if p.is_file()}

    before = digest()
    meta, _ = lerobot_v3.plan(*storage.open_root(str(root)))
    extra = {"converter_version": sidecar["converter"]["version"], "options": sidecar["converter"]["options"],
             "created_at": sidecar["created_at"]}
    retry = _PublishFn(f"file://{output}/_staging/gone", f"file://{output}", meta, sidecar["num_shards"], extra)
    assert list(retry.process(None, ([], {}, None), [])) == [{"sequences": sidecar["num_sequences"], "timesteps": sidecar["num_timesteps"]}]
    assert digest() == before
    # Died while removing the staging: the marker says it published; the rest is removed, nothing rebuilt.
    half = output / "_staging" / "half"
    (half / "files").mkdir(parents=True)
    (half / "files" / "left.mp4").write_bytes(b"x")
    (output / "_staging" / "half.published").write_bytes(b"")
    retry = _PublishFn(f"file://{half}", f"file://{output}", meta, sidecar["num_shards"], {**extra, "created_at": "other"})
    assert list(retry.process(None, ([], {}, None), [])) == [{"sequences": sidecar["num_sequences"], "timesteps": sidecar["num_timesteps"]}]
    assert digest() == before and not (output / "_staging").exists()
    # A first attempt whose staging holds nothing (every sequence failed) is not taken for one that published.
    first = _PublishFn(f"file://{output}/_staging/empty", f"file://{output}", meta, sidecar["num_shards"], {**extra, "created_at": "other"})
    with pytest.raises(ConversionError, match="no sequence was converted"):
        list(first.process(None, ([], {}, None), []))
    # (the launcher removes a failed run's staging)
    assert {name: value for name, value in digest().items() if not name.startswith("_staging/")} == before
