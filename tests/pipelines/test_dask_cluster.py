"""`--runner=DaskRunner` on a cluster shaped like a real one (tests/dask_cluster.py): `dask scheduler`
and two `dask worker` commands, each worker in its own working and temporary folder, input and
output on s3:// (moto's server): nothing shared but the object store. The output is the local
runner's, byte for byte; a worker killed mid-run is survived."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time

import pytest

from formats import storage
from formats.mixtrain import publish
from formats.sources.lerobot_v3.sample import SyntheticLeRobot, write_dataset
from tests import dask_cluster, s3_server
from tests.pipelines.test_s3 import _files, _run, _upload

distributed = pytest.importorskip("dask.distributed", reason="the DaskRunner needs dask[distributed] (the dask extra)")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """moto's S3 server for this module, a local folder to stage uploads in."""
    with s3_server.serving_this_process():
        yield tmp_path_factory.mktemp("s3_local")


def _without_time(files: dict[str, bytes]) -> dict[str, bytes]:
    sidecar = json.loads(files.pop("mixtrain.json"))
    sidecar.pop("created_at")
    return {**files, "mixtrain.json": json.dumps(sidecar, sort_keys=True).encode()}


def _dataset(store, name: str, episodes: int) -> str:
    local = store / name
    write_dataset(str(local), SyntheticLeRobot(lengths=(12,) * episodes, codec="h264", gop=None, episodes_per_video_file=5,
                                               episodes_per_data_file=5))
    return _upload(local, f"s3://bucket/sources/{name}")


def test_separate_scheduler_and_workers_write_the_local_runners_bytes(store, tmp_path):
    src = _dataset(store, "cluster_src", 10)
    local_dst, cluster_dst = "s3://bucket/mixtrain/cluster_local", "s3://bucket/mixtrain/cluster_remote"
    assert _run(f"--input={src}", f"--output={local_dst}", "--num_shards=2")[0] == 0
    with dask_cluster.separate_commands(tmp_path) as cluster:
        code, _, console = _run(f"--input={src}", f"--output={cluster_dst}", "--num_shards=2", "--runner=DaskRunner",
                                f"--dask_scheduler_file={cluster.scheduler_file}")
        assert code == 0, console
        local, remote = _without_time(_files(local_dst)), _without_time(_files(cluster_dst))
        assert sorted(local) == sorted(remote) and sum(name.startswith("files/") for name in local) == 2 * 10  # two cameras
        assert [name for name in local if local[name] != remote[name]] == []
        # The workers' own folders hold nothing of the conversion: no spill, no video, no shard.
        left = [p for folder in cluster.folders for p in (folder / "tmp").rglob("*") if p.is_file()]
        assert left == []


class _Launcher:
    """The convert command on the cluster, in a process of its own, its console read as it goes."""

    def __init__(self, src: str, dst: str, cluster: dask_cluster.Cluster):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "pipelines.convert", f"--input={src}", f"--output={dst}", "--num_shards=2",
             "--runner=DaskRunner", f"--dask_scheduler_file={cluster.scheduler_file}", "--progress=lines",
             "--progress_interval=0.1"], cwd=dask_cluster.ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=dict(os.environ))
        self.lines: list[str] = []
        self.errors: list[str] = []
        self._readers = [threading.Thread(target=lambda: self.lines.extend(self.process.stdout), daemon=True),
                         threading.Thread(target=lambda: self.errors.extend(self.process.stderr), daemon=True)]  # a full pipe would stall it
        for reader in self._readers:
            reader.start()

    def done_so_far(self) -> int:
        return max([int(line.split("]")[1].split("/")[0]) for line in list(self.lines) if " sequences (" in line] or [0])

    def wait_until_converting(self) -> int:
        """The count of converted sequences once the progress lines say some are (the run's middle)."""
        deadline = time.monotonic() + 120
        while not self.done_so_far():
            assert self.process.poll() is None and time.monotonic() < deadline, (self.lines, self.errors)
            time.sleep(0.05)
        return self.done_so_far()

    def wait(self, timeout: float) -> tuple[int, str]:
        code = self.process.wait(timeout=timeout)
        for reader in self._readers:
            reader.join(timeout=10)
        return code, "".join(self.errors)


def test_a_worker_killed_mid_run_is_survived(store, tmp_path):
    """SIGKILL of one of the two workers while sequences are converting: Dask reruns its tasks on the
    other, and the output is the bytes of an uninterrupted run."""
    from tests.pipelines import dask_fns

    src = _dataset(store, "killed_src", 24)
    local_dst, cluster_dst = "s3://bucket/mixtrain/killed_local", "s3://bucket/mixtrain/killed_remote"
    assert _run(f"--input={src}", f"--output={local_dst}", "--num_shards=2")[0] == 0
    with dask_cluster.separate_commands(tmp_path) as cluster:
        with distributed.Client(scheduler_file=str(cluster.scheduler_file)) as client:
            client.run(dask_fns.slow_loads, 0.3)  # a run long enough to kill a worker in its middle
        launcher = _Launcher(src, cluster_dst, cluster)
        done_at_kill = launcher.wait_until_converting()
        cluster.kill_worker(0)
        code, stderr = launcher.wait(timeout=300)
        scheduler_log = (tmp_path / "scheduler" / "log.txt").read_text()
    assert 0 < done_at_kill < 24, launcher.lines  # killed in the middle of the run
    assert "Remove worker addr" in scheduler_log and "name: worker0" in scheduler_log
    assert code == 0, stderr
    assert stderr == ""
    local, remote = _without_time(_files(local_dst)), _without_time(_files(cluster_dst))
    assert sorted(local) == sorted(remote) and sum(name.startswith("files/") for name in local) == 2 * 24
    assert [name for name in local if local[name] != remote[name]] == []
    assert launcher.lines[-1].startswith("converted 24 sequences, 288 timesteps"), launcher.lines[-3:]


def test_a_scheduler_killed_mid_run_is_one_line_at_once(store, tmp_path):
    """SIGKILL of the scheduler once the first sequences are recorded: the launcher says so in one
    line as soon as its client notices, and keeps what was completed for the same command to resume
    on a cluster that is back. Beam's wait took the cancelled futures for finished ones (the launcher
    then said its publish step never ran), or raised a Dask key's cancellation after 30 s of asking
    the dead scheduler what was still running."""
    from tests.pipelines import dask_fns

    src = _dataset(store, "lost_src", 24)
    dst = "s3://bucket/mixtrain/lost"
    fs, _ = storage.open_root(dst)
    with dask_cluster.separate_commands(tmp_path) as cluster:
        with distributed.Client(scheduler_file=str(cluster.scheduler_file)) as client:
            client.run(dask_fns.slow_loads, 0.3)
            address = client.scheduler.address
        launcher = _Launcher(src, dst, cluster)
        deadline = time.monotonic() + 120
        while not fs.glob("bucket/mixtrain/.lost.mixtrain-*/_resume/done/*"):  # completed work recorded
            fs.invalidate_cache()  # s3fs keeps listings
            assert launcher.process.poll() is None and time.monotonic() < deadline, (launcher.lines, launcher.errors)
            time.sleep(0.05)
        cluster.kill_scheduler()  # the run is going (asserted above) and has completed work
        killed = time.monotonic()
        code, stderr = launcher.wait(timeout=120)
        took = time.monotonic() - killed
    error, *hint = stderr.splitlines()
    assert (code, error) == (1, f"error: {dst}: the connection to the Dask scheduler at {address} was lost before the run's "
                                "work was done"), stderr
    assert len(hint) == 1 and "the sequences it completed are kept in s3://bucket/mixtrain/.lost.mixtrain-" in hint[0], stderr
    assert took < 20, took  # the client's reconnection attempts last 30 s
    fs.invalidate_cache()  # the listing the wait above kept
    assert not fs.exists("bucket/mixtrain/lost")
    # Resumed (here by the local runner, the cluster being gone): the kept sequences are reused, and the
    # output is an uninterrupted run's. A task of the killed run may still be writing a journal entry as the
    # rerun lists them: moto listed one it did not serve yet (2 of 5 runs on a loaded machine; read 0.5 s
    # later it was whole). The rerun says it ignored it and converts its units again.
    code, out, console = _run(f"--input={src}", f"--output={dst}", "--num_shards=2")
    assert code == 0, console
    resuming = re.search(r"resuming run \S+ \(started \S+\): (\d+) sequences recorded(, \d+ unreadable journal file\(s\) "
                         r"ignored)?, [0-9.]+ MB staged in s3://bucket/mixtrain/\.lost\.mixtrain-\S+: (\d+) sequences reused", out)
    assert resuming and int(resuming.group(3)) > 0, out
    uninterrupted = "s3://bucket/mixtrain/lost_uninterrupted"
    assert _run(f"--input={src}", f"--output={uninterrupted}", "--num_shards=2")[0] == 0
    local, resumed = _without_time(_files(uninterrupted)), _without_time(_files(dst))
    assert sorted(local) == sorted(resumed) and [name for name in local if local[name] != resumed[name]] == []


def test_a_scheduler_killed_while_a_worker_publishes_leaves_that_publication_alone(store, tmp_path):
    """The scheduler SIGKILLed once the publish step (on a worker) has removed the run's journal and
    before it moves the staged objects: the launcher fails in one line, but the folder the worker
    publishes from is not removed under it (the launcher used to discard it, so the worker's copy
    found nothing, or half of it). The worker's task ends as it would have: the output is an
    uninterrupted run's."""
    from tests.pipelines import dask_fns

    src = _dataset(store, "publishing_src", 6)
    dst, uninterrupted = "s3://bucket/mixtrain/publishing", "s3://bucket/mixtrain/publishing_uninterrupted"
    assert _run(f"--input={src}", f"--output={uninterrupted}", "--num_shards=2")[0] == 0
    fs, _ = storage.open_root(dst)
    with dask_cluster.separate_commands(tmp_path) as cluster:
        with distributed.Client(scheduler_file=str(cluster.scheduler_file)) as client:
            client.run(dask_fns.slow_publish, 3.0)
        launcher = _Launcher(src, dst, cluster)
        deadline = time.monotonic() + 120
        while True:  # publishing: its heartbeat written, its journal removed
            fs.invalidate_cache()
            folders = fs.glob("bucket/mixtrain/.publishing.mixtrain-*")
            if folders and fs.exists(f"{folders[0]}/{publish.PUBLISHING}") and not fs.exists(f"{folders[0]}/_resume"):
                break
            assert launcher.process.poll() is None and time.monotonic() < deadline, (launcher.lines, launcher.errors)
            time.sleep(0.05)
        cluster.kill_scheduler()
        code, stderr = launcher.wait(timeout=120)
        assert code == 1 and stderr.splitlines()[0].endswith("was lost before the run's work was done"), stderr
        deadline = time.monotonic() + 60  # the worker's task goes on for about 3 s
        while not fs.exists("bucket/mixtrain/publishing/mixtrain.json") and time.monotonic() < deadline:
            time.sleep(0.2)
            fs.invalidate_cache()
    local, published = _without_time(_files(uninterrupted)), _without_time(_files(dst))
    assert sorted(local) == sorted(published) and [name for name in local if local[name] != published[name]] == []
