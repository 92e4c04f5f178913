"""What can be proven of the Dataflow path offline: the job graph builds with DataflowRunner's
dry run, nothing a worker reads is a launcher-only path, and the deploy files match the code."""

import json
import pathlib

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from formats.sources.lerobot_v3.sample import SyntheticLeRobot
from formats.sources.lerobot_v3.sample import write_dataset as write_lerobot
from pipelines import conversion, convert

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
