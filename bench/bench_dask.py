"""DaskRunner against the local runner: the LeRobot copy and re-encode workloads of bench/run.py,
on a Dask cluster of 2 worker processes (1 thread each, loopback) and on the local runner with 2
workers (--direct_num_workers=2, multi_processing), same data, same run.

    python bench/bench_dask.py [--scale=0.1] [--only=a,b] [--repeat=2] [--cluster=local|commands]

(a) copy: 200 x `--scale` episodes x 300 frames, two AV1 cameras at 320x240, --video=copy
    --verify_copies=false; (b) the same episodes at a tenth (at least 2) with --video=reencode.
--cluster=local: a dask.distributed LocalCluster, input and output on the local disk.
--cluster=commands: `dask scheduler` and two `dask worker` commands, each worker in its own
working and temporary folder (tests/dask_cluster.py), input and output on s3:// (moto's server on
loopback, tests/s3_server.py); the local runner then also converts s3:// -> s3://.
The cluster starts once, before the runs (its start-up is not counted: a cluster outlives a
conversion); the launcher's wall time is. CPU is the launcher's (rusage of its subprocess) plus,
for Dask, what the cluster's processes spent meanwhile (psutil). The ratio printed is Dask / local.
"""

from __future__ import annotations

import argparse
import contextlib
import pathlib
import shutil
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.run import convert, measure, workload  # noqa: E402
from formats.sources.lerobot_v3.sample import SyntheticLeRobot  # noqa: E402


def _cluster_cpu(processes) -> float:
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
            total += times.user + times.system
        except Exception:  # noqa: BLE001 - a process gone between listing and reading
            pass
    return total


@contextlib.contextmanager
def _cluster(kind: str, work: pathlib.Path, sources: dict[str, pathlib.Path]):
    """(the Dask options, the cluster's processes, where each input is, where the outputs go)."""
    import psutil

    if kind == "local":
        from dask.distributed import LocalCluster

        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, host="127.0.0.1",
                          worker_dashboard_address=None) as cluster:
            yield ([f"--dask_client_address={cluster.scheduler_address}"], psutil.Process().children(recursive=True), sources,
                   str(work))
        return
    from formats import storage
    from tests import dask_cluster, s3_server

    with s3_server.serving_this_process():  # the launchers (measure passes its environment on) and the workers reach it
        fs, _ = storage.open_root("s3://bucket")
        for name, path in sources.items():
            fs.put(str(path), f"bucket/sources/{name}", recursive=True)
        with dask_cluster.separate_commands(work / "cluster") as cluster:
            yield ([f"--dask_scheduler_file={cluster.scheduler_file}"], [psutil.Process(p.pid) for p in cluster.workers],
                   {name: f"s3://bucket/sources/{name}" for name in sources}, "s3://bucket/out")


def _remove(url: str) -> None:
    from formats import storage

    fs, root = storage.open_root(url)
    if fs.exists(root):
        fs.rm(root, recursive=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=0.1)
    parser.add_argument("--only", default="a,b")
    parser.add_argument("--repeat", type=int, default=2, help="runs per command; the fastest counts")
    parser.add_argument("--cluster", choices=("local", "commands"), default="local")
    args = parser.parse_args()
    episodes = max(2, int(200 * args.scale))

    def lerobot(count: int) -> SyntheticLeRobot:
        return SyntheticLeRobot(lengths=[300] * count, width=320, height=240, episodes_per_video_file=20, episodes_per_data_file=50,
                                video_variants=8)

    work = pathlib.Path(tempfile.mkdtemp(prefix="bench_dask_"))
    cases = {"a": (workload("a", lerobot(episodes)), ["--verify_copies=false"]),
             "b": (workload("a", lerobot(max(2, episodes // 10))), ["--video=reencode"])}
    names = args.only.split(",")
    try:
        with _cluster(args.cluster, work, {name: cases[name][0] for name in names}) as (dask, cluster_processes, inputs, out):
            for name in names:
                extra = cases[name][1]
                local_out, dask_out = f"{out}/local", f"{out}/dask"
                results = {}
                for label, command in (("local, 2 workers", convert(inputs[name], local_out, 2, *extra)),
                                       ("dask, 2 processes", [sys.executable, "-m", "pipelines.convert", f"--input={inputs[name]}",
                                                              f"--output={dask_out}", "--progress=off", *extra, "--runner=DaskRunner",
                                                              *dask])):
                    runs = []
                    for _ in range(args.repeat):
                        _remove(local_out)
                        _remove(dask_out)
                        before = _cluster_cpu(cluster_processes)
                        wall, cpu, rss = measure(command)
                        runs.append((wall, cpu + (_cluster_cpu(cluster_processes) - before if "dask" in label else 0.0)))
                    results[label] = min(runs)
                    print(f"  ({name}) {label:<18} wall {results[label][0]:7.2f} s  CPU {results[label][1]:7.2f} s", file=sys.stderr)
                (local_wall, local_cpu), (dask_wall, dask_cpu) = results.values()
                print(f"({name}) {'copy' if name == 'a' else 're-encode'} ({args.cluster} cluster): dask / local = "
                      f"{dask_wall / local_wall:.2f}x wall, {dask_cpu / local_cpu:.2f}x CPU")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
