"""The job graph holds no per-unit data (issue 20): its size does not depend on the number of
episodes; the refs, fingerprints and reused ids reach the workers through the run's plan files."""

from __future__ import annotations

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from formats import storage
from formats.sources.lerobot_v3.sample import SyntheticLeRobot, write_dataset
from pipelines import conversion
from transforms import staged_plan
from transforms.read import refs_file
from transforms.write import staged_fingerprints


def _graph(tmp_path, episodes: int) -> tuple[int, conversion.ConversionPlan, staged_plan.PlanFolder]:
    src, out = tmp_path / f"src{episodes}", tmp_path / f"out{episodes}"
    write_dataset(str(src), SyntheticLeRobot(lengths=[2] * episodes, cameras=()))
    options = PipelineOptions([f"--input={src}", f"--output={out}"])
    pipeline = beam.Pipeline(options=options)
    fs, root = storage.open_root(str(out))
    plan_folder = staged_plan.PlanFolder.create(
        storage.join(conversion.staging_root(fs, root, "graph", options.view_as(conversion.ConvertOptions)), staged_plan.PLAN_DIR))
    plan = conversion.build_pipeline(pipeline, options.view_as(conversion.ConvertOptions), "graph", plan_folder=plan_folder)
    return len(pipeline.to_runner_api().SerializeToString()), plan, plan_folder


def test_graph_size_does_not_grow_with_the_episodes(tmp_path):
    small, _, _ = _graph(tmp_path, 200)
    large, plan, plan_folder = _graph(tmp_path, 4000)
    assert abs(large - small) < 2_000 and large < 2_000_000, (small, large)
    staged = [ref for number in range(2) for batch in staged_plan.read_pieces(plan_folder, refs_file(number)) for ref in batch]
    assert staged == list(plan.to_convert) and len(staged) == 4000
    fingerprints = staged_fingerprints(plan_folder)
    assert fingerprints == {"context": plan.fingerprints.context, "units": plan.fingerprints.units}
    assert list(fingerprints["units"]) == [ref.sequence_id for ref in staged] and plan.fingerprints.known is None
