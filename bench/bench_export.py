"""Export against conversion, in one run (issue 43): the copy workload of bench/bench_scaling.py
(at --scale=1: 3,200 LeRobot v3 episodes x 150 frames x 2 AV1 cameras) converted to Mixtrain,
then that dataset exported back to LeRobot v3.0, with the same workers.

    python bench/bench_export.py [--workload=copy|traj] [--scale=1] [--workers=1] [--repeat=2] [--work=DIR]

--workload=traj is bench_scaling's trajectory workload instead (20,000 episodes x 50 steps, no
camera, at --scale=1; --scale=5 is the 100,000 episodes of issue 43's attack list).

Printed: each run's wall and CPU (best of --repeat), and export wall / conversion wall (target <=
1.3). The conversion copies each episode's video out of the shared MP4s (sample-table cuts); the
export joins them back (formats/video/mp4.py write_joined), so both are bounded by the same
reads and writes of the video bytes.
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_scaling import timed, workloads  # noqa: E402
from formats.sources.lerobot_v3.sample import write_dataset  # noqa: E402


def convert(src: pathlib.Path, dst: pathlib.Path, workers: int, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "pipelines.convert", f"--input={src}", f"--output={dst}", "--progress=off",
            f"--direct_num_workers={workers}", "--direct_running_mode=multi_processing", *extra]


def export(src: pathlib.Path, dst: pathlib.Path, workers: int) -> list[str]:
    return [sys.executable, "-m", "pipelines.export", f"--input={src}", f"--output={dst}", "--to=lerobot_v3",
            f"--direct_num_workers={workers}"]


def best(command: list[str], output: pathlib.Path, repeat: int) -> tuple[float, float]:
    runs = []
    for _ in range(repeat):
        shutil.rmtree(output, ignore_errors=True)
        runs.append(timed(command))
    return min(runs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", choices=("copy", "traj"), default="copy")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--work", default=None)
    args = parser.parse_args()
    work = pathlib.Path(args.work or tempfile.mkdtemp(prefix="bench-export-"))
    spec, extra = workloads(args.scale)[args.workload]
    source = work / "lerobot"
    if not (source / "meta" / "info.json").exists():
        write_dataset(str(source), spec)
    mixtrain, exported = work / "mixtrain", work / "exported"
    convert_wall, convert_cpu = best(convert(source, mixtrain, args.workers, extra), mixtrain, args.repeat)
    export_wall, export_cpu = best(export(mixtrain, exported, args.workers), exported, args.repeat)
    episodes = len(spec.lengths)
    print(f"{args.workload} workload: {episodes} episodes x {spec.lengths[0]} frames x {len(spec.cameras)} cameras, {args.workers} "
          f"worker(s), best of {args.repeat}")
    print(f"convert (LeRobot v3 -> Mixtrain): wall {convert_wall:.2f} s, CPU {convert_cpu:.2f} s")
    print(f"export  (Mixtrain -> LeRobot v3): wall {export_wall:.2f} s, CPU {export_cpu:.2f} s")
    print(f"export / convert: wall {export_wall / convert_wall:.2f}x (target <= 1.3), CPU {export_cpu / convert_cpu:.2f}x")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
