"""`--runner=DaskRunner` (pipelines/dask_runner.py) on a real dask.distributed LocalCluster of 2
worker processes on loopback: each correction of Beam's translation shown on a minimal pipeline
(strict xfail on Beam's own DaskRunner: the test fails there), then every registered source's
sample converted through the cluster, byte-identical to the local runner."""

from __future__ import annotations

import json
import pathlib
import re
import shutil

import pytest

distributed = pytest.importorskip("dask.distributed", reason="the DaskRunner needs dask[distributed] (pip install 'mixtrain-convert[dask]')")

import apache_beam as beam  # noqa: E402
from apache_beam.options.pipeline_options import PipelineOptions  # noqa: E402
from apache_beam.runners.dask.dask_runner import DaskRunner as BeamDaskRunner  # noqa: E402

from pipelines import convert, local_workers  # noqa: E402
from pipelines.dask_runner import DaskRunner  # noqa: E402
from tests.pipelines import dask_fns  # noqa: E402

BEAMS = pytest.param(BeamDaskRunner, marks=pytest.mark.xfail(strict=True, reason="Beam 2.77's DaskRunner translation"), id="beam")
RUNNERS = [pytest.param(DaskRunner, id="ours"), BEAMS]


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, host="127.0.0.1",
                                  worker_dashboard_address=None) as local:
        yield local.scheduler_address


def _run(runner_class, cluster, build, *extra):
    pipeline = beam.Pipeline(runner=runner_class(), options=PipelineOptions([f"--dask_client_address={cluster}", *extra]))
    build(pipeline)
    result = pipeline.run()
    try:
        result.wait_until_finish()
    finally:
        result.client.close()


@pytest.mark.parametrize("runner", RUNNERS)
def test_outputs_of_finish_bundle_reach_the_next_step(runner, cluster, tmp_path):
    _run(runner, cluster, lambda p: p | beam.Create([1, 2, 3]) | beam.ParDo(dask_fns.BufferFn()) | beam.ParDo(dask_fns.RecordFn(str(tmp_path))))
    assert dask_fns.seen(str(tmp_path)) == [1, 2, 3]


@pytest.mark.parametrize("runner", RUNNERS)
def test_each_tagged_output_reaches_its_own_consumer(runner, cluster, tmp_path):
    def build(pipeline):
        split = pipeline | beam.Create([1, 2, 3, 4]) | beam.ParDo(dask_fns.SplitFn()).with_outputs("odd", main="even")
        _ = split.odd | "Odd" >> beam.ParDo(dask_fns.RecordFn(str(tmp_path / "odd")))
        _ = split.even | "Even" >> beam.ParDo(dask_fns.RecordFn(str(tmp_path / "even")))

    _run(runner, cluster, build)
    assert (dask_fns.seen(str(tmp_path / "odd")), dask_fns.seen(str(tmp_path / "even"))) == ([1, 3], [2, 4])


@pytest.mark.parametrize("runner", RUNNERS)
def test_every_leaf_runs(runner, cluster, tmp_path):
    def build(pipeline):
        numbers = pipeline | beam.Create([1, 2])
        _ = numbers | "A" >> beam.ParDo(dask_fns.RecordFn(str(tmp_path / "a")))
        _ = numbers | "B" >> beam.ParDo(dask_fns.RecordFn(str(tmp_path / "b")))

    _run(runner, cluster, build)
    assert [dask_fns.seen(str(tmp_path / leaf)) if (tmp_path / leaf).exists() else [] for leaf in "ab"] == [[1, 2], [1, 2]]


@pytest.mark.parametrize("runner", RUNNERS)
def test_side_inputs_are_computed_once(runner, cluster, tmp_path):
    """Two side inputs of one grouped upstream (the converter's publish step: shard results and
    stats), read by a main input of 4 bundles: the upstream runs once."""
    def build(pipeline):
        grouped = (pipeline | "Side" >> beam.Create([1, 2]) | "Record" >> beam.ParDo(dask_fns.RecordFn(str(tmp_path / "side")))
                   | beam.Map(lambda v: (v % 2, v)) | beam.GroupByKey())
        total = grouped | "Total" >> beam.MapTuple(lambda _, values: sum(values)) | beam.CombineGlobally(sum)
        count = grouped | "Count" >> beam.combiners.Count.Globally()
        added = pipeline | "Main" >> beam.Create(list(range(8))) | beam.Map(lambda x, t, c: x + 10 * t + c, beam.pvalue.AsSingleton(total),
                                                                             beam.pvalue.AsSingleton(count))
        _ = added | "Out" >> beam.ParDo(dask_fns.RecordFn(str(tmp_path / "out")))

    _run(runner, cluster, build, "--dask_npartitions=4")
    assert (dask_fns.seen(str(tmp_path / "side")), dask_fns.seen(str(tmp_path / "out"))) == ([1, 2], list(range(32, 40)))


@pytest.mark.parametrize("runner", RUNNERS)
def test_a_reshuffle_spreads_elements_over_bundles(runner, cluster, tmp_path):
    """What a Create of one value fans out to must not stay one bundle on one worker: the
    converter's shape, one plan file -> Reshuffle -> its ref batches -> Reshuffle -> loads."""
    def build(pipeline):
        _ = (pipeline | beam.Create([1]) | "Files" >> beam.FlatMap(lambda n: list(range(n))) | "SpreadFiles" >> beam.Reshuffle()
             | "Batches" >> beam.FlatMap(lambda _: list(range(8))) | "SpreadBatches" >> beam.Reshuffle()
             | beam.ParDo(dask_fns.RecordFn(str(tmp_path))))

    _run(runner, cluster, build)
    assert dask_fns.seen(str(tmp_path)) == list(range(8)) and dask_fns.bundles(str(tmp_path)) == 4  # 2 per worker thread


@pytest.mark.parametrize("runner", RUNNERS)
def test_impulse_gives_its_one_element(runner, cluster, tmp_path):
    _run(runner, cluster, lambda p: p | beam.Impulse() | beam.Map(lambda _: 7) | beam.ParDo(dask_fns.RecordFn(str(tmp_path))))
    assert dask_fns.seen(str(tmp_path)) == [7]


# --- the converter on the cluster -------------------------------------------------------------

def _published(folder) -> dict:
    """Every published file's bytes; mixtrain.json without its created_at (the only field a run's time changes)."""
    files = {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
    sidecar = json.loads(files.pop("mixtrain.json"))
    sidecar["converter"].pop("created_at", None)
    sidecar.pop("created_at", None)
    return {**files, "mixtrain.json": sidecar}


def _convert(cluster, src, dst, *extra, runner: bool = True):
    dask = ["--runner=DaskRunner", f"--dask_client_address={cluster}"] if runner else []
    return convert.run([f"--input={src}", f"--output={dst}", "--progress=off", *dask, *extra])


def test_every_source_converts_byte_identical_to_the_local_runner(cluster, sample_inputs, tmp_path, capsys):
    assert set(sample_inputs) >= {"lerobot_v3", "ortf", "rlds", "l5kit"}
    for source_id, (src, extra) in sample_inputs.items():
        on_dask, here = tmp_path / "dask" / source_id, tmp_path / "local" / source_id
        assert _convert(cluster, src, on_dask, "--num_shards=2", *extra) == convert.EXIT_OK, capsys.readouterr().err
        assert _convert(cluster, src, here, "--num_shards=2", *extra, runner=False) == convert.EXIT_OK
        dask_files, local_files = _published(on_dask), _published(here)
        assert sorted(dask_files) == sorted(local_files), source_id
        assert {"data/part-00000.parquet", "data/part-00001.parquet", "stats.json", "_fingerprints.json"} <= set(dask_files), source_id
        assert source_id == "l5kit" or any(name.startswith("files/video_") for name in dask_files), source_id
        for name in local_files:
            assert dask_files[name] == local_files[name], f"{source_id}: {name} differs"


def test_reencode_and_incremental_on_the_cluster(cluster, sample_inputs, tmp_path):
    src, extra = sample_inputs["lerobot_v3"]
    on_dask, here = tmp_path / "dask", tmp_path / "local"
    assert _convert(cluster, src, on_dask, "--video=reencode", *extra) == convert.EXIT_OK
    assert _convert(cluster, src, here, "--video=reencode", *extra, runner=False) == convert.EXIT_OK
    assert _published(on_dask) == _published(here)
    # The codecs of the 2 single-thread workers on this machine got half its cores each, as 2 local workers do.
    with distributed.Client(cluster) as client:
        shares = set(client.run(dask_fns.codec_threads).values())
    assert shares == {str(local_workers.codec_threads(2))}
    assert _convert(cluster, src, on_dask, "--video=reencode", "--incremental", *extra) == convert.EXIT_OK
    sidecar = json.loads((on_dask / "mixtrain.json").read_text())
    assert sidecar["incremental"]["reused_sequences"] == sidecar["num_sequences"] == 3


def test_a_lake_table_on_the_cluster(cluster, sample_inputs, tmp_path):
    pytest.importorskip("deltalake", reason="--table_format=delta needs deltalake ('mixtrain-convert[lake]')")
    import deltalake

    src, extra = sample_inputs["ortf"]
    assert _convert(cluster, src, tmp_path / "table", "--table_format=delta", *extra) == convert.EXIT_OK
    rows = deltalake.DeltaTable(str(tmp_path / "table")).to_pyarrow_table().column("sequence_id").to_pylist()
    assert sorted(rows) == ["ep-0000_kitchen_0", "ep-0001_kitchen_0", "ep-0002_kitchen_1"]


def test_bad_input_fails_with_the_local_runners_one_line(cluster, sample_inputs, tmp_path, capsys):
    src, extra = sample_inputs["lerobot_v3"]
    broken = tmp_path / "broken"
    shutil.copytree(src, broken)
    video = sorted(broken.glob("videos/**/*.mp4"))[0]
    video.write_bytes(video.read_bytes()[: video.stat().st_size // 2])
    lines = {}
    for runner in (True, False):
        assert _convert(cluster, broken, tmp_path / f"out{runner}", *extra, runner=runner) == convert.EXIT_FAILED
        err = capsys.readouterr().err.replace(str(tmp_path / f"out{runner}"), "OUT")
        # The error line; a hint may follow it where a sequence was done before the failure (kept to resume).
        lines[runner] = "".join(line for line in err.splitlines(keepends=True)
                                if not line.startswith("(the sequences it completed are kept in "))
        assert not (tmp_path / f"out{runner}").exists()
    # Episodes 0 and 1 share the cut file: which one fails first depends on the workers' order.
    same = {runner: re.sub(r"episode_00000[01] ", "episode_00000X ", line) for runner, line in lines.items()}
    assert same[True] == same[False] and lines[True].startswith("error: ") and lines[True].count("\n") == 1
    assert "(video_front): cannot open video" in lines[True] and "file-000.mp4" in lines[True]
    # --on_error=skip: the bad sequence's record travels as a tagged output, to _errors.jsonl only.
    for runner in (True, False):
        assert _convert(cluster, broken, tmp_path / f"skip{runner}", "--on_error=skip", "--max_skipped=100%", *extra,
                        runner=runner) == convert.EXIT_SKIPPED
    on_dask, here = _published(tmp_path / "skipTrue"), _published(tmp_path / "skipFalse")
    assert on_dask == here and len(on_dask["_errors.jsonl"].splitlines()) == 2  # the two episodes of the cut video file


def test_beams_own_dask_runner_now_fails_instead_of_publishing_a_short_dataset(cluster, sample_inputs, tmp_path, capsys, monkeypatch):
    """What an earlier check saw (Beam's DaskRunner published 0 sequences without an error) is now
    one line: the publish step checks what arrived (here the loaded and the video-written sequences,
    3 each, handed to the error records' consumer as well) before it publishes."""
    from pipelines import dask_runner

    monkeypatch.setattr(dask_runner, "DaskRunner", BeamDaskRunner)
    src, extra = sample_inputs["lerobot_v3"]
    assert _convert(cluster, src, tmp_path / "out", *extra) == convert.EXIT_FAILED
    error, *hint = capsys.readouterr().err.splitlines()
    assert error == (f"error: {tmp_path / 'out'}: the publish step received 6 Sequence element(s) among the error "
                     "records: the runner mixed the pipeline's outputs; nothing was published")
    assert [line.startswith("(the sequences it completed are kept in ") for line in hint] == [True]  # verified again if resumed
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("extra", "expected"), [
    (["--dask_npartitions=4"], "error: --dask_npartitions has no effect without --runner=DaskRunner"),
    (["--runner=DaskRunner", "--detach"],
     "error: --detach cannot work with --runner=DaskRunner: the run's tasks belong to this process's Dask client, and its exit "
     "cancels them; run the launcher where it can wait (a batch job, tmux)"),
    (["--runner=DaskRunner", "--dry_run=True"],
     "error: --dry_run has no effect with --runner=DaskRunner (it runs the conversion); it is for --runner=DataflowRunner"),
    (["--runner=DaskRunner", "--output=memory://x/out"],
     "error: --output=memory://x/out is this process's memory, which DaskRunner workers cannot read; use a path on storage the "
     "workers share, or an object store URL"),
])
def test_the_command_line_refuses_what_cannot_work_on_dask(sample_inputs, tmp_path, capsys, extra, expected):
    src, _ = sample_inputs["lerobot_v3"]
    assert convert.run([f"--input={src}", f"--output={tmp_path / 'out'}", "--progress=off", *extra]) == convert.EXIT_USAGE
    assert capsys.readouterr().err.splitlines()[0] == expected


def test_without_dask_installed_one_line_says_what_to_install(sample_inputs, tmp_path, capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None if name in ("dask", "distributed") else real(name, *args))
    src, _ = sample_inputs["lerobot_v3"]
    assert convert.run([f"--input={src}", f"--output={tmp_path / 'out'}", "--runner=DaskRunner"]) == convert.EXIT_USAGE
    assert capsys.readouterr().err == ("error: --runner=DaskRunner needs dask.distributed, which is not installed: pip install "
                                       "'mixtrain-convert[dask]' (on the launcher and on every worker)\n")


def test_an_interrupt_cancels_the_clusters_tasks_and_leaves_the_output(cluster, sample_inputs, tmp_path, capsys, monkeypatch):
    """Ctrl-C while the launcher waits (the session turns SIGINT into Interrupted) and the workers
    load slowly: exit 130, the run's tasks gone from the cluster at once (cancelled), and nothing
    appears at the output afterwards (a task left running would write into the removed staging)."""
    import signal
    import time

    from pipelines import dask_runner
    from pipelines.session import Interrupted

    def interrupted(self, duration=None):
        time.sleep(1.0)  # the loads are running
        raise Interrupted(signal.SIGINT)

    monkeypatch.setattr(dask_runner.DaskRunnerResult, "wait_until_finish", interrupted)
    src, extra = sample_inputs["lerobot_v3"]
    with distributed.Client(cluster) as client:
        client.run(dask_fns.slow_loads, 2.0)
        try:
            assert _convert(cluster, src, tmp_path / "out", *extra) == 130
            assert capsys.readouterr().err == "error: interrupted (SIGINT): the output was left as it was\n"
            deadline = time.monotonic() + 2
            while client.run_on_scheduler(dask_fns.scheduled) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert client.run_on_scheduler(dask_fns.scheduled) == 0
            time.sleep(3)  # longer than a load left running would take to finish and write
            assert list(tmp_path.iterdir()) == []
        finally:
            client.run(dask_fns.slow_loads, 0.0)


def test_progress_comes_from_the_workers(cluster, sample_inputs, tmp_path, capsys):
    """The workers' reports travel as Dask events to the launcher, which draws them as on the local runner."""
    src, extra = sample_inputs["lerobot_v3"]
    with distributed.Client(cluster) as client:
        client.run(dask_fns.slow_loads, 1.0)  # a run long enough to draw a few lines
        try:
            assert _convert(cluster, src, tmp_path / "out", "--progress=lines", "--progress_interval=0.1", *extra) == convert.EXIT_OK
        finally:
            client.run(dask_fns.slow_loads, 0.0)
    progress = re.findall(r"^\[mixtrain-convert\] (\d)/3 sequences \(\d+%\), (\d+) timesteps", capsys.readouterr().out, re.MULTILINE)
    assert progress and max(int(done) for done, _ in progress) >= 1, progress


def test_a_killed_launcher_is_resumed_on_the_cluster(cluster, tmp_path, capsys):
    """The launcher SIGKILLed midway (its cluster lives on): the same command resumes, takes what the
    workers recorded, and publishes what the local runner publishes."""
    import glob
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    from formats.sources.lerobot_v3.sample import SyntheticLeRobot, write_dataset
    from tests.pipelines.test_resume import _files

    src = tmp_path / "src"
    write_dataset(str(src), SyntheticLeRobot(lengths=(12,) * 40, codec="h264", gop=None, episodes_per_video_file=10,
                                             episodes_per_data_file=10))
    dst, here = tmp_path / "out", tmp_path / "here"
    assert _convert(cluster, src, here, "--num_shards=2", runner=False) == convert.EXIT_OK

    def recorded() -> int:
        found = 0
        for path in glob.glob(f"{tmp_path}/.out.mixtrain-*/_resume/done/*.json"):
            try:
                found += len(json.loads(open(path).read())["rows"])
            except (OSError, ValueError):
                pass
        return found

    with distributed.Client(cluster) as client:
        client.run(dask_fns.slow_loads, 0.4)
        try:
            process = subprocess.Popen([sys.executable, "-m", "pipelines.convert", f"--input={src}", f"--output={dst}", "--progress=off",
                                        "--num_shards=2", "--runner=DaskRunner", f"--dask_client_address={cluster}"],
                                       cwd=pathlib.Path(__file__).resolve().parents[2], start_new_session=True,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            deadline = time.monotonic() + 120
            while process.poll() is None and recorded() < 8 and time.monotonic() < deadline:
                time.sleep(0.02)
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            assert recorded() >= 8
            deadline = time.monotonic() + 30  # the dead launcher's tasks released by the scheduler
            while client.run_on_scheduler(dask_fns.scheduled) and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(1.0)  # a load the cluster was running finishes (and records) before the rerun tidies
        finally:
            client.run(dask_fns.slow_loads, 0.0)
    capsys.readouterr()
    assert _convert(cluster, src, dst, "--num_shards=2") == convert.EXIT_OK
    reused = re.search(r"resumed: (\d+) of them reused from the interrupted run", capsys.readouterr().out)
    assert reused and int(reused.group(1)) >= 8
    assert _files(dst) == _files(here)
