"""Load: many short episodes and a few very long ones, peak memory and time; episode rows read
alone or by read group.

    python bench/bench_load.py [--workload=all|cli|rows] [--short=10000] [--long=3] [--long_steps=20000] [--dims=64]
                               [--files=40] [--per_file=80] [--steps=50] [--repeat=3]

Workloads (LeRobot v3 written as lerobot does, trajectories only):
  short  --short episodes of 10 steps (6-dim state and action);
  long   --long episodes of --long_steps steps with --dims-dim state and action.
Each is converted by the CLI in a subprocess (in-process runner, one worker). The baseline
measured in the same run is the same interpreter importing the pipeline and exiting: the memory
every run pays before touching data. Reports wall time, peak RSS, and for `long` the peak
against the size of one episode's arrays (state + action + timestamps).

  rows   in this process, no pipeline: --files data files of --per_file episodes of --steps steps,
         each file one row group (as pandas rewrites them: lerobot's merge and modify_tasks tools).
         Every episode is loaded through the LeRobot reader (a) alone, the reader's kept row groups
         dropped before each episode: the whole row group decoded per episode, as before read
         groups; (b) by read group, in plan order, one reader: each row group decoded once. Prints
         the medians of --repeat alternated runs and the ratio a / b.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from formats import storage  # noqa: E402
from formats.sources import lerobot_v3, parquet_rows  # noqa: E402
from formats.sources.lerobot_v3.sample import SyntheticLeRobot, write_dataset  # noqa: E402


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


def _load_all(fs, root: str, meta, refs, alone: bool) -> float:
    """Seconds to load every ref with one reader; `alone`: its kept row groups dropped before each."""
    reader = lerobot_v3.Reader(fs, root, meta)
    started = time.perf_counter()
    for ref in refs:
        if alone:
            reader.decoded = parquet_rows.DecodedRowGroups()
        reader.load(ref)
    return time.perf_counter() - started


def rows(args) -> None:
    work = pathlib.Path(tempfile.mkdtemp(prefix="bench_rows_"))
    try:
        episodes = args.files * args.per_file
        print(f"writing {episodes} episodes x {args.steps} steps in {args.files} data files of one row group ...", file=sys.stderr)
        write_dataset(str(work / "rows"), SyntheticLeRobot(lengths=[args.steps] * episodes, cameras=(), episodes_per_data_file=args.per_file,
                                                           episodes_per_meta_file=1000, data_row_group_rows=args.per_file * args.steps))
        fs, root = storage.open_root(str(work / "rows"))
        meta, refs = lerobot_v3.plan(fs, root)
        groups = len({ref.read_group for ref in refs})
        _load_all(fs, root, meta, refs[: args.per_file], alone=False)  # warm: imports, page cache
        times: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.repeat):
            for alone in (True, False):  # alternated, so drift hits both
                times[alone].append(_load_all(fs, root, meta, refs, alone))
        alone, grouped = (statistics.median(times[key]) for key in (True, False))
        print(f"\nrows: {episodes} episodes x {args.steps} steps, {args.files} data files of one row group, {groups} read groups; "
              f"median of {args.repeat}")
        print(f"{'':<28} {'s':>8} {'ms/episode':>11}")
        print(f"{'a: alone (row group/episode)':<28} {alone:8.2f} {1000 * alone / episodes:11.3f}")
        print(f"{'b: by read group, in order':<28} {grouped:8.2f} {1000 * grouped / episodes:11.3f}")
        print(f"speed-up a / b: {alone / grouped:.1f}x")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=["all", "cli", "rows"], default="all")
    parser.add_argument("--short", type=int, default=10_000)
    parser.add_argument("--long", type=int, default=3)
    parser.add_argument("--long_steps", type=int, default=20_000)
    parser.add_argument("--dims", type=int, default=64)
    parser.add_argument("--files", type=int, default=40)
    parser.add_argument("--per_file", type=int, default=80)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if args.workload in ("all", "rows"):
        rows(args)
    if args.workload in ("all", "cli"):
        cli(args)


def cli(args) -> None:
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
