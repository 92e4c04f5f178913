"""`python -m pipelines.export --runner=DaskRunner`: the export's groups written by a Dask cluster's
workers, byte-identical to the local runner's: on a LocalCluster, and on a cluster shaped like a
real one (`dask scheduler` and two `dask worker` commands, each in its own folders) with input
and output on s3:// only. What cannot work on Dask is refused in one line."""

from __future__ import annotations

import io
import pathlib

import pytest

from formats.sources.lerobot_v3.sample import SyntheticLeRobot, write_dataset
from pipelines import conversion, export
from tests import dask_cluster, s3_server
from tests.pipelines.test_export import _export
from tests.pipelines.test_s3 import _files as _s3_files
from tests.pipelines.test_s3 import _upload

distributed = pytest.importorskip("dask.distributed", reason="the DaskRunner needs dask[distributed] (the dask extra)")


def _files(folder: pathlib.Path) -> dict:
    return {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def mixtrain(tmp_path_factory) -> pathlib.Path:
    folder = tmp_path_factory.mktemp("export_dask")
    write_dataset(str(folder / "src"), SyntheticLeRobot(lengths=(20,) * 10, episodes_per_video_file=4, episodes_per_data_file=5))
    out, console = io.StringIO(), io.StringIO()
    assert conversion.run([f"--input={folder / 'src'}", f"--output={folder / 'm'}", "--progress=off", "--num_shards=2"], out=out,
                          console=console) == 0, console.getvalue()
    return folder / "m"


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, host="127.0.0.1",
                                  worker_dashboard_address=None) as local:
        yield local.scheduler_address


@pytest.mark.parametrize("to, extra", [("lerobot_v3", ("--data_file_mb=0.01",)), ("lerobot_v2.1", ())])
def test_a_local_cluster_writes_the_local_runners_bytes(mixtrain, cluster, tmp_path, to, extra):
    assert _export(mixtrain, tmp_path / "local", *extra, to=to)[0] == 0
    code, out, console = _export(mixtrain, tmp_path / "dask", *extra, "--runner=DaskRunner", f"--dask_client_address={cluster}", to=to)
    assert (code, console) == (0, ""), console
    assert out.startswith("exported 10 episodes, 200 frames, 2 cameras as ")
    local = _files(tmp_path / "local")
    assert _files(tmp_path / "dask") == local and len([p for p in local if p.parts[0] == "data"]) > 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dask", "local"]  # no staging folder left


def test_separate_scheduler_and_workers_over_s3_write_the_local_runners_bytes(mixtrain, tmp_path):
    with s3_server.serving_this_process():
        source = _upload(mixtrain, "s3://bucket/mixtrain/export_src")
        assert _export(source, "s3://bucket/lerobot/local", "--data_file_mb=0.01")[0] == 0
        with dask_cluster.separate_commands(tmp_path) as cluster:
            code, _, console = _export(source, "s3://bucket/lerobot/cluster", "--data_file_mb=0.01", "--runner=DaskRunner",
                                       f"--dask_scheduler_file={cluster.scheduler_file}")
            assert code == 0, console
            local, remote = _s3_files("s3://bucket/lerobot/local"), _s3_files("s3://bucket/lerobot/cluster")
            assert local == remote and any(name.startswith("videos/") for name in local)
            left = [p for folder in cluster.folders for p in (folder / "tmp").rglob("*") if p.is_file()]
            assert left == []  # the workers' own folders hold nothing of the export


@pytest.mark.parametrize("extra, said", [
    (["--dask_client_address=127.0.0.1:8786"], "--dask_client_address has no effect without --runner=DaskRunner"),
    (["--runner=DaskRunner", "--direct_num_workers=2"],
     "--direct_num_workers has no effect with --runner=DaskRunner (the cluster's workers write the groups)"),
    (["--runner=DaskRunner", "--dask_client_address=not an address"],
     "--dask_client_address='not an address': expected a scheduler address, HOST:PORT or tcp://HOST:PORT"),
    (["--runner=DaskRunner", "--dask_scheduler_file=/nonexistent/scheduler.json"],
     "--dask_scheduler_file=/nonexistent/scheduler.json: no such file (the one `dask scheduler --scheduler-file` writes)"),
    (["--runner=DaskRunner", "--output=memory://x/out"],
     "--output=memory://x/out is this process's memory, which DaskRunner workers cannot read; use a path on storage the workers "
     "share, or an object store URL"),
])
def test_what_cannot_work_on_dask_is_refused_in_one_line(mixtrain, tmp_path, extra, said):
    argv = [f"--input={mixtrain}", f"--output={tmp_path / 'out'}", "--to=lerobot_v3", *extra]
    out, console = io.StringIO(), io.StringIO()
    assert export.run(argv, out=out, console=console) == 2
    assert (out.getvalue(), console.getvalue()) == ("", f"error: {said} (see --help)\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == []
