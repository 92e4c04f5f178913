"""What can be proven of the Dataflow path offline: the job graph builds with DataflowRunner's
dry run, nothing a worker reads is a launcher-only path, and the deploy files match the code."""

import io
import json
import pathlib

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from formats.sources.lerobot_v3.sample import SyntheticLeRobot
from formats.sources.lerobot_v3.sample import write_dataset as write_lerobot
from pipelines import conversion, convert
from transforms import staged_plan

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATAFLOW = ["--runner=DataflowRunner", "--project=my-project-123", "--region=us-central1", "--temp_location=gs://bucket/tmp"]


def test_dataflow_job_graph_builds_offline(tmp_path, monkeypatch):
    pytest.importorskip("apache_beam.runners.dataflow.internal.apiclient", reason="apache-beam[gcp] is a dependency")
    import apache_beam as beam

    src = tmp_path / "ds"
    write_lerobot(str(src), SyntheticLeRobot(lengths=(5, 4)))
    monkeypatch.chdir(ROOT)
    options = PipelineOptions([f"--input={src}", "--output=gs://bucket/out", *DATAFLOW, "--dry_run=True", "--no_auth",
                               "--sdk_location=container", "--setup_file=./setup.py", "--video=reencode"])
    pipeline = beam.Pipeline(options=options)
    plan = conversion.build_pipeline(pipeline, options.view_as(conversion.ConvertOptions), "dry", write_assets=False)
    result = pipeline.run()  # DataflowRunner with dry_run: the job proto is built, nothing is submitted
    assert result is not None and len(plan.refs) == 2
    labels = {transform.full_label for transform in pipeline.transforms_stack[0].parts}
    assert {"Read", "Videos", "Write"} <= labels


def test_remote_runner_refuses_launcher_paths(tmp_path, capsys):
    assert convert.run([f"--input={tmp_path}", "--output=gs://bucket/out", *DATAFLOW]) == convert.EXIT_USAGE
    assert f"--input={tmp_path} is on this machine's disk, which DataflowRunner workers cannot read" in capsys.readouterr().err


def test_flex_template_parameters_are_the_pipeline_options():
    metadata = json.loads((ROOT / "deploy/flex_metadata.json").read_text())
    names = {parameter["name"] for parameter in metadata["parameters"]}
    parser_options = PipelineOptions([]).view_as(conversion.ConvertOptions)
    own = set(parser_options.get_all_options(retain_unknown_options=False))
    declared = {action.dest for action in _convert_parser()._actions if action.dest != "help"}
    assert names == declared and names <= own


def _convert_parser():
    import argparse

    parser = argparse.ArgumentParser()
    conversion.ConvertOptions._add_argparse_args(parser)
    return parser


def test_beam_version_lives_in_one_place():
    version = (ROOT / "BEAM_VERSION").read_text().strip()
    import apache_beam

    assert apache_beam.__version__ == version
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "ARG BEAM_VERSION\n" in dockerfile and version not in dockerfile
    assert "FROM apache/beam_python${PYTHON_VERSION}_sdk:${BEAM_VERSION}" in dockerfile
    for name in ("setup.py", "docs/dataflow.md", "deploy/flex_metadata.json"):
        assert version not in (ROOT / name).read_text(), f"{name} repeats the Beam version"
    assert 'with_name("BEAM_VERSION")' in (ROOT / "setup.py").read_text()
    assert '--build-arg BEAM_VERSION="$(cat BEAM_VERSION)"' in (ROOT / "docs/dataflow.md").read_text()
    assert "include BEAM_VERSION" in (ROOT / "MANIFEST.in").read_text()


def test_the_exports_job_graph_builds_offline(tmp_path, monkeypatch):
    """The export's steps on DataflowRunner's dry run: the job proto is built (its DoFns, the
    writer and its plan pickled for the workers), nothing is submitted."""
    pytest.importorskip("apache_beam.runners.dataflow.internal.apiclient", reason="apache-beam[gcp] is a dependency")
    import io

    import apache_beam as beam

    from formats.exports import lerobot
    from formats.read.reader import open_dataset
    from transforms.export import export

    write_lerobot(str(tmp_path / "src"), SyntheticLeRobot(lengths=(5, 4)))
    out, console = io.StringIO(), io.StringIO()
    assert conversion.run([f"--input={tmp_path / 'src'}", f"--output={tmp_path / 'm'}", "--progress=off"], out=out, console=console) == 0
    dataset = open_dataset(str(tmp_path / "m"))
    plan = lerobot.plan_export(dataset)
    monkeypatch.chdir(ROOT)
    pipeline = beam.Pipeline(options=PipelineOptions([*DATAFLOW, "--dry_run=True", "--no_auth", "--sdk_location=container",
                                                      "--setup_file=./setup.py"]))
    export(pipeline, "gs://bucket/m", list(dataset.shards), lerobot.Writer(plan, dataset.stats()), "gs://bucket/.out.staging",
           staged_plan.PlanFolder.create(str(tmp_path / "plan")),  # on gs:// in a real launch; only built here
           identity="0" * 64, groups=plan.groups, recorded=frozenset({0}))
    assert pipeline.run() is not None
    labels = {transform.full_label for transform in pipeline.transforms_stack[0].parts}
    assert {"ReadRows", "WriteGroups", "TakeRecorded", "WriteMeta"} <= labels


def test_the_exports_job_graph_does_not_grow_with_the_episodes(tmp_path):
    """The writer (an entry per episode) reaches the steps as a plan file, not pickled into each
    step of the job graph: 0.56 MB a step at 100,000 episodes, past Dataflow's 10 MB request
    limit at about 500,000."""
    import apache_beam as beam

    from formats.exports import lerobot
    from formats.read.reader import open_dataset
    from transforms.export import WRITER_FILE, export

    sizes = {}
    for episodes in (20, 2000):
        src, converted = tmp_path / f"src{episodes}", tmp_path / f"m{episodes}"
        write_lerobot(str(src), SyntheticLeRobot(lengths=[2] * episodes, cameras=()))
        assert conversion.run([f"--input={src}", f"--output={converted}", "--progress=off"], out=io.StringIO(), console=io.StringIO()) == 0
        dataset = open_dataset(str(converted))
        plan = lerobot.plan_export(dataset)
        folder = staged_plan.PlanFolder.create(str(tmp_path / f"plan{episodes}"))
        pipeline = beam.Pipeline(runner="DirectRunner")  # only built
        export(pipeline, str(converted), list(dataset.shards), lerobot.Writer(plan, dataset.stats()), str(tmp_path / f"out{episodes}"),
               folder, identity="0" * 64, groups=plan.groups)
        sizes[episodes] = len(pipeline.to_runner_api().SerializeToString())
        staged = staged_plan.read_value(folder, WRITER_FILE)
        assert staged.plan.episodes == plan.episodes and len(staged.group_of) == episodes
    assert abs(sizes[2000] - sizes[20]) < 2_000, sizes


@pytest.mark.parametrize("extra, said", [
    (["--input=/data/m", "--output=gs://bucket/out"],
     "--input=/data/m is on this machine's disk, which DataflowRunner workers cannot read; use a gs:// URL"),
    (["--input=gs://bucket/m", "--output=gs://bucket/out", "--project=p"], "DataflowRunner needs --region, --temp_location"),
    (["--input=gs://bucket/m", "--output=gs://bucket/out", *DATAFLOW[1:], "--dry_run=True"],
     "--dry_run has no effect with the export on DataflowRunner (it runs the export and publishes it)"),
    (["--input=gs://bucket/m", "--output=gs://bucket/out", *DATAFLOW[1:], "--direct_num_workers=2"],
     "--direct_num_workers has no effect with --runner=DataflowRunner (Dataflow's workers write the groups)"),
    (["--input=gs://bucket/m", "--output=gs://bucket/out", *DATAFLOW[1:], "--bogus=1"], "unrecognized arguments: --bogus=1"),
])
def test_the_export_on_dataflow_refuses_what_cannot_work(extra, said):
    import io

    from pipelines import export

    out, console = io.StringIO(), io.StringIO()
    assert export.run(["--to=lerobot_v3", "--runner=DataflowRunner", *extra], out=out, console=console) == 2
    assert (out.getvalue(), console.getvalue()) == ("", f"error: {said} (see --help)\n")


def test_beams_options_without_dataflow_are_unknown_to_the_export(tmp_path):
    import io

    from pipelines import export

    out, console = io.StringIO(), io.StringIO()
    code = export.run([f"--input={tmp_path}", f"--output={tmp_path / 'o'}", "--to=lerobot_v3", "--project=p"], out=out, console=console)
    assert (code, console.getvalue()) == (2, "error: unrecognized arguments: --project=p (Beam's options are taken with "
                                              "--runner=DataflowRunner only) (see --help)\n")
