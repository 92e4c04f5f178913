"""What the data-quality checks cost (issue 44): the same conversion with --quality=true and
--quality=false, in one run, on the trajectory and copy workloads of bench/bench_scaling.py.

    python bench/bench_quality.py [--only=traj,copy] [--scale=1] [--repeat=3] [--workers=2] [--work=DIR]

At --scale=1 on 2 cores: traj 20,000 episodes x 50 steps (state and action float32[6]); copy 3,200
episodes x 150 frames x 2 AV1 cameras, unverified. The runs alternate (on, off, on, off...) so
that the machine's drift falls on both; CPU is user + system of the conversion's whole process
tree (the launcher and its workers), the median of --repeat runs each; the peak resident set is the
largest process's (bench/run.py's measure). Printed: CPU and wall of
each, and the ratio on / off (target: CPU <= 1.05).
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import statistics
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_scaling import workloads  # noqa: E402
from bench.run import convert, measure  # noqa: E402
from formats.sources.lerobot_v3.sample import write_dataset  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="traj,copy")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--work", default="")
    args = parser.parse_args()
    work = pathlib.Path(args.work or tempfile.mkdtemp(prefix="bench_quality_"))
    lines = []
    try:
        for name in args.only.split(","):
            spec, extra = workloads(args.scale)[name]
            src = work / f"{name}_{args.scale:g}"
            if not src.exists():
                write_dataset(str(src), spec)
            runs: dict[str, list[tuple[float, float, float]]] = {"on": [], "off": []}
            for _ in range(args.repeat):
                for label in ("on", "off"):
                    dst = work / f"{name}_out"
                    shutil.rmtree(dst, ignore_errors=True)
                    runs[label].append(measure(convert(src, dst, args.workers, *extra, f"--quality={str(label == 'on').lower()}")))
            median = {label: tuple(statistics.median(run[i] for run in found) for i in range(3)) for label, found in runs.items()}
            for label, (wall, cpu, rss) in median.items():
                print(f"  ({name}) quality {label:<3}  wall {wall:6.2f} s  CPU {cpu:6.2f} s  peak RSS {rss:6.0f} MB", flush=True)
            lines.append(f"({name}) quality on / off: CPU {median['on'][1] / median['off'][1]:.3f}x (target <= 1.05), "
                         f"wall {median['on'][0] / median['off'][0]:.3f}x")
        print("\n".join(lines))
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
