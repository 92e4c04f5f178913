"""DaskRunner against the local runner: the LeRobot copy and re-encode workloads of bench/run.py,
on a dask.distributed LocalCluster of 2 worker processes (1 thread each, loopback) and on the
local runner with 2 workers (--direct_num_workers=2, multi_processing), same data, same run.

    python bench/bench_dask.py [--scale=0.1] [--only=a,b] [--repeat=2]

(a) copy: 200 x `--scale` episodes x 300 frames, two AV1 cameras at 320x240, --video=copy
    --verify_copies=false; (b) the same episodes at a tenth (at least 2) with --video=reencode.
The cluster starts once, before the runs (its start-up is not counted: a cluster outlives a
conversion); the launcher's wall time is. CPU is the launcher's (rusage of its subprocess) plus,
for Dask, what the cluster's processes spent meanwhile (psutil). The ratio printed is Dask / local.
"""

from __future__ import annotations

import argparse
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


def main() -> None:
    import psutil
    from dask.distributed import LocalCluster

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=0.1)
    parser.add_argument("--only", default="a,b")
    parser.add_argument("--repeat", type=int, default=2, help="runs per command; the fastest counts")
    args = parser.parse_args()
    episodes = max(2, int(200 * args.scale))

    def lerobot(count: int) -> SyntheticLeRobot:
        return SyntheticLeRobot(lengths=[300] * count, width=320, height=240, episodes_per_video_file=20, episodes_per_data_file=50,
                                video_variants=8)

    work = pathlib.Path(tempfile.mkdtemp(prefix="bench_dask_"))
    cases = {"a": (workload("a", lerobot(episodes)), ["--verify_copies=false"]),
             "b": (workload("a", lerobot(max(2, episodes // 10))), ["--video=reencode"])}
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, host="127.0.0.1",
                      worker_dashboard_address=None) as cluster:
        cluster_processes = psutil.Process().children(recursive=True)
        dask = ["--runner=DaskRunner", f"--dask_client_address={cluster.scheduler_address}"]
        try:
            for name in args.only.split(","):
                source, extra = cases[name]
                results = {}
                for label, command in (("local, 2 workers", convert(source, work / "local", 2, *extra)),
                                       ("dask, 2 processes", [sys.executable, "-m", "pipelines.convert", f"--input={source}",
                                                              f"--output={work / 'dask'}", "--progress=off", *extra, *dask])):
                    runs = []
                    for _ in range(args.repeat):
                        shutil.rmtree(work / "local", ignore_errors=True)
                        shutil.rmtree(work / "dask", ignore_errors=True)
                        before = _cluster_cpu(cluster_processes)
                        wall, cpu, rss = measure(command)
                        runs.append((wall, cpu + (_cluster_cpu(cluster_processes) - before if "dask" in label else 0.0)))
                    results[label] = min(runs)
                    print(f"  ({name}) {label:<18} wall {results[label][0]:7.2f} s  CPU {results[label][1]:7.2f} s", file=sys.stderr)
                (local_wall, local_cpu), (dask_wall, dask_cpu) = results.values()
                print(f"({name}) {'copy' if name == 'a' else 're-encode'}: dask / local = {dask_wall / local_wall:.2f}x wall, "
                      f"{dask_cpu / local_cpu:.2f}x CPU")
        finally:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
