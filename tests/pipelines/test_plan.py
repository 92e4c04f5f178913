"""The conversion plan (pipelines/plan.py): options in, a frozen plan out, without Beam."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import subprocess
import sys

import pytest

from formats import samples, sources, storage
from pipelines import cli, convert
from pipelines.plan import make_plan

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _plan(src, dst, *extra):
    args, _ = cli.parse([f"--input={src}", f"--output={dst}", *extra])
    return make_plan(args, output_url=str(dst), created_at="2026-01-01T00:00:00+00:00")


def test_planning_imports_no_beam():
    probe = subprocess.run([sys.executable, "-c", "import sys, pipelines.plan; print('apache_beam' in sys.modules)"], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert probe.stdout.strip() == "False", probe.stderr


def test_plan_holds_the_metadata_as_written_and_leaves_the_sources_own_untouched(tmp_path):
    src = tmp_path / "ortf"
    samples.get("ortf").small(str(src))
    plan = _plan(src, tmp_path / "out", "--video=reencode", "--num_shards=3")
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.num_shards = 1
    fs, root = storage.open_root(str(src))
    source_meta, refs = sources.get("ortf").plan(fs, root, {})
    assert plan.source.id == "ortf" and plan.num_shards == 3 and plan.to_convert == plan.refs and len(plan.refs) == len(refs) == 3
    cameras = [spec for spec in plan.meta.columns if spec.kind == "video"]
    assert cameras and all(spec.meta["written_as"] == "encode" for spec in cameras)
    assert all("written_as" not in spec.meta for spec in source_meta.columns if spec.kind == "video")  # the source's plan is not mutated
    assert plan.copied == frozenset() and set(plan.encode) == {spec.name for spec in cameras}
    assert plan.assets and plan.meta.source["assets"] == [f"files/_dataset/{path}" for path in plan.assets]
    assert source_meta.source["assets"] == list(plan.assets)
    assert plan.sidecar_extra["options"]["source_options"] == {}  # the RLDS options are RLDS's alone


def test_an_incremental_plan_converts_only_changed_units(tmp_path):
    src, dst = tmp_path / "ortf", tmp_path / "out"
    samples.get("ortf").small(str(src))
    assert convert.run([f"--input={src}", f"--output={dst}", "--progress=off"]) == convert.EXIT_OK
    steps = sorted((src / "data").rglob("*.parquet"))[0]
    steps.write_bytes(steps.read_bytes())  # same bytes, new mtime: the episodes of this chunk file are "changed"
    plan = _plan(src, dst, "--incremental")
    assert plan.reused is not None and 0 < len(plan.to_convert) < len(plan.refs)
    assert plan.sidecar_extra["incremental"]["converted_units"] == len(plan.to_convert)
    assert json.loads((dst / "mixtrain.json").read_text())["num_sequences"] == len(plan.refs)
    assert plan.reused["context_changed"] is False


def test_an_incremental_run_says_so_when_the_previous_output_was_written_with_other_options(tmp_path, capsys):
    src, dst = tmp_path / "ortf", tmp_path / "out"
    samples.get("ortf").small(str(src))
    assert convert.run([f"--input={src}", f"--output={dst}", "--progress=off", "--video=reencode"]) == convert.EXIT_OK
    capsys.readouterr()
    plan = _plan(src, dst, "--incremental")
    assert plan.reused["context_changed"] is True and plan.to_convert == plan.refs
    assert convert.run([f"--input={src}", f"--output={dst}", "--progress=off", "--incremental"]) == convert.EXIT_OK
    assert ("[mixtrain-convert] --incremental: the previous output was written with other options or by another converter "
            "version; every sequence is converted again") in capsys.readouterr().out.splitlines()


def test_partition_columns_are_checked_by_the_plan_before_anything_is_written(tmp_path):
    from formats.sources.lerobot_v3.sample import SyntheticLeRobot, write_dataset

    src, dst = tmp_path / "lerobot", tmp_path / "out"
    write_dataset(str(src), SyntheticLeRobot(lengths=(4, 3), codec="h264", gop=None, cameras=("observation.images.front",)))
    with pytest.raises(cli.UsageError) as raised:
        _plan(src, dst, "--table_format=iceberg", "--partition_by=task,tasks")
    assert str(raised.value) == ("--partition_by=tasks: not a scalar column of this lerobot_v3 dataset that a table can partition by "
                                 "(a list<string> column); columns it can partition by: length, duration_seconds, episode_index, "
                                 "task, split")
    assert _plan(src, dst, "--table_format=iceberg", "--partition_by=task").meta is not None
    assert not dst.exists()
