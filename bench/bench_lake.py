"""What a lake commit costs against the conversion it ends (issue 18 target: under 5 %).

    python bench/bench_lake.py [--episodes=2000] [--steps=200] [--cameras=0]

Workload: a LeRobot v3 dataset (formats/sources/lerobot_v3/sample.py) of --episodes episodes x --steps
steps, trajectories only by default (the conversion is then shortest, so the commit's share is
largest). Measured in this run, each command a subprocess of the CLI as a nightly job runs it:
  standalone    --table_format=parquet (the baseline)
  iceberg       --table_format=iceberg (embedded SQLite catalog)
  delta         --table_format=delta
and, in-process on the run folder the iceberg / delta conversion left, the commit alone
(`formats.mixtrain.tables.publish` on a copy of the run), first and incremental with nothing changed (every
shard compared with the committed one and kept), after the library was imported; the import
itself (once per process: launcher and publishing worker) is reported on its own line.
Conversions alternate between formats, --repeat times, and the median is reported: the machine
is shared, and one slow run says nothing.
"""

from __future__ import annotations

import argparse
import json
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

from formats.sources.lerobot_v3.sample import SyntheticLeRobot, write_dataset  # noqa: E402


def _convert(src: pathlib.Path, dst: pathlib.Path, *extra: str) -> float:
    env = dict(os.environ, PYTHONPATH=str(ROOT), SVT_LOG="1")
    shutil.rmtree(dst, ignore_errors=True)
    os.sync()
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pipelines.convert", f"--input={src}", f"--output={dst}", "--progress=off",
                           "--direct_num_workers=1", *extra], cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-2000:])
    return time.perf_counter() - started


def _commit_alone(lake_dst: pathlib.Path, table_format: str, work: pathlib.Path) -> tuple[float, float]:
    """(first commit s, incremental commit s) of the run the conversion left, replayed on a copy."""
    from fsspec.implementations.local import LocalFileSystem

    from formats.mixtrain import tables
    from formats.mixtrain.tables import lake

    run = next((lake_dst / "runs").iterdir())
    sidecar = json.loads((run / "mixtrain.json").read_text())
    for key in ("table",):
        sidecar.pop(key, None)
    sidecar["stats"] = "stats.json"
    target = work / f"replay_{table_format}"
    shutil.rmtree(target, ignore_errors=True)
    times = []
    for number, base in ((1, None), (2, "current")):
        staging = target / "runs" / f"r{number}"
        shutil.copytree(run, staging)
        state = lake.current_state(f"file://{target}", tables.TableSettings(format=table_format)) if base else ""
        settings = tables.TableSettings(format=table_format, run_id=f"r{number}", incremental=number > 1, base=state)
        os.sync()
        started = time.perf_counter()
        tables.publish(LocalFileSystem(), str(staging), str(target), sidecar, settings)
        times.append(time.perf_counter() - started)
    return times[0], times[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--cameras", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="bench_lake_"))
    try:
        src = work / "src"
        cameras = tuple(f"observation.images.cam{i}" for i in range(args.cameras))
        print(f"writing {args.episodes} episodes x {args.steps} steps, {len(cameras)} cameras ...", file=sys.stderr)
        write_dataset(str(src), SyntheticLeRobot(lengths=[args.steps] * args.episodes, cameras=cameras, state_dim=32, action_dim=32,
                                                 codec="h264", gop=None, video_variants=2 if cameras else 0))
        times: dict[str, list[float]] = {"parquet": [], "iceberg": [], "delta": []}
        for _ in range(args.repeat):
            for name in times:
                times[name].append(_convert(src, work / name, f"--table_format={name}"))
        rows = {name: statistics.median(values) for name, values in times.items()}
        shards = sum(p.stat().st_size for p in (work / "parquet" / "data").glob("*.parquet"))
        print(f"workload: {args.episodes} episodes x {args.steps} steps, {shards / 1e6:.1f} MB of shards "
              f"({len(list((work / 'parquet' / 'data').glob('*.parquet')))} files)")
        print(f"{'run':<34} {'wall s':>8} {'x standalone':>13}")
        for name, seconds in rows.items():
            print(f"{name + ' conversion':<34} {seconds:8.2f} {seconds / rows['parquet']:13.3f}")
        for name, modules in (("iceberg", "pyiceberg.catalog.sql pyiceberg.io.pyarrow pyiceberg.table"), ("delta", "deltalake")):
            probe = f"import time, pyarrow.parquet; t = time.perf_counter(); import {', '.join(modules.split())}; print(time.perf_counter() - t)"
            imported = float(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout)
            print(f"{name + ' library import':<34} {imported:8.3f} {imported / rows['parquet']:13.3f}")
            for module in modules.split():
                __import__(module)
            first, again = _commit_alone(work / name, name, work)
            print(f"{name + ' commit alone, first':<34} {first:8.3f} {first / rows['parquet']:13.3f}")
            print(f"{name + ' commit alone, all kept':<34} {again:8.3f} {again / rows['parquet']:13.3f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
