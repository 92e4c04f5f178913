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


def _graph(tmp_path, episodes: int, *extra: str, pipeline_out: list | None = None
           ) -> tuple[int, conversion.ConversionPlan, staged_plan.PlanFolder]:
    src, out = tmp_path / f"src{episodes}", tmp_path / f"out{episodes}"
    if not src.exists():
        write_dataset(str(src), SyntheticLeRobot(lengths=[2] * episodes, cameras=()))
    options = PipelineOptions([f"--input={src}", f"--output={out}", *extra])
    pipeline = beam.Pipeline(runner="DirectRunner", options=options)  # only built: any --runner is taken as written
    fs, root = storage.open_root(str(out))
    plan_folder = staged_plan.PlanFolder.create(
        storage.join(conversion.staging_root(fs, root, "graph", options.view_as(conversion.ConvertOptions)), staged_plan.PLAN_DIR))
    plan = conversion.build_pipeline(pipeline, options.view_as(conversion.ConvertOptions), "graph", plan_folder=plan_folder)
    if pipeline_out is not None:
        pipeline_out.append(pipeline)
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


def test_batches_dealt_to_local_workers_skip_their_own_shuffle_and_other_runners_keep_it(tmp_path):
    """The plan files and the graph agree: a batch a file and no batch shuffle for the local
    runner's 3 workers; files of whole batches and the batch shuffle for a runner that spreads work
    its own way (Dask, here only built)."""
    def names(pipeline) -> set[str]:
        return {transform.unique_name for transform in pipeline.to_runner_api().components.transforms.values()}

    built: list = []
    _, plan, plan_folder = _graph(tmp_path, 300, "--direct_num_workers=3", "--direct_running_mode=multi_processing", pipeline_out=built)
    assert [len(list(staged_plan.read_pieces(plan_folder, refs_file(number)))) for number in range(3)] == [1, 1, 1]
    assert not staged_plan.exists(plan_folder, refs_file(3))
    assert "Read/SpreadPlanFiles" in names(built[0]) and "Read/SpreadRefs" not in names(built[0])
    _, plan, plan_folder = _graph(tmp_path, 300, "--runner=DaskRunner", pipeline_out=built)
    # One data file of 300 refs: the group cut into MIN_BATCHES pieces, in one file.
    assert len(list(staged_plan.read_pieces(plan_folder, refs_file(0)))) == 16 and "Read/SpreadRefs" in names(built[1])
