"""Load: many short episodes and a few very long ones, peak memory and time.

    python bench/bench_load.py [--short=10000] [--long=3] [--long_steps=20000] [--dims=64]

Workloads (LeRobot v3 written as lerobot does, trajectories only):
  short  --short episodes of 10 steps (6-dim state and action);
  long   --long episodes of --long_steps steps with --dims-dim state and action.
Each is converted by the CLI in a subprocess (in-process runner, one worker). The baseline
measured in the same run is the same interpreter importing the pipeline and exiting: the memory
every run pays before touching data. Reports wall time, peak RSS, and for `long` the peak
against the size of one episode's arrays (state + action + timestamps).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from formats.samples.lerobot_v3 import SyntheticLeRobot, write_dataset  # noqa: E402


def _peak(command: list[str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB) of one subprocess (the only child alive at a time)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    wrapper = [sys.executable, "-c",
               "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True); "
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)", *command]
    started = time.perf_counter()
    done = subprocess.run(wrapper, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-2000:])
    return time.perf_counter() - started, int(done.stdout.strip().splitlines()[-1]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--short", type=int, default=10_000)
    parser.add_argument("--long", type=int, default=3)
    parser.add_argument("--long_steps", type=int, default=20_000)
    parser.add_argument("--dims", type=int, default=64)
    args = parser.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="bench_load_"))
    convert = [sys.executable, "-m", "pipelines.convert", "--progress=off", "--direct_num_workers=1"]
    try:
        _, floor = _peak([sys.executable, "-c", "import pipelines.conversion"])
        print(f"writing {args.short} short episodes and {args.long} x {args.long_steps}-step episodes ...", file=sys.stderr)
        write_dataset(str(work / "short"), SyntheticLeRobot(lengths=[10] * args.short, cameras=(), episodes_per_data_file=1000,
                                                             episodes_per_meta_file=1000))
        write_dataset(str(work / "long"), SyntheticLeRobot(lengths=[args.long_steps] * args.long, cameras=(), state_dim=args.dims,
                                                            action_dim=args.dims))
        rows = []
        for name in ("short", "long"):
            wall, peak = _peak([*convert, f"--input={work / name}", f"--output={work / (name + '_out')}"])
            rows.append((name, wall, peak))
        episode_mb = args.long_steps * (2 * args.dims * 4 + 8) / 1e6
        print(f"\nload: {args.short} x 10-step episodes; {args.long} x {args.long_steps} steps x {args.dims} dims")
        print(f"{'':<10} {'wall s':>8} {'peak RSS MB':>12} {'over import MB':>15}")
        print(f"{'import':<10} {'':>8} {floor:12.1f} {0.0:15.1f}")
        for name, wall, peak in rows:
            print(f"{name:<10} {wall:8.2f} {peak:12.1f} {peak - floor:15.1f}")
        long_peak = rows[1][2] - floor
        print(f"long: one episode's arrays {episode_mb:.1f} MB; peak over the import floor {long_peak:.1f} MB "
              f"= {long_peak / episode_mb:.1f}x one episode (all {args.long} episodes share one shard)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
