"""What --table_format=lance adds to a run, and how big the Lance dataset is against Parquet + files.

    python bench/bench_lance_publish.py [--episodes=60] [--repeat=2]

Workload: a LeRobot v3 dataset written here (bench/run.py's cached generator): --episodes episodes
of 300 frames, two AV1 cameras at 320x240, 6-dim state and action. Each variant is converted by
the CLI (one worker, --verify_copies=false: the copy alone) in a subprocess; the fastest of
--repeat runs counts. Baseline, same run: the standalone Parquet output (ratio 1.00).
The Lance rows today are written by the publish step from the staged shards (docs/lance.md), so
the difference in wall time is that step: rows re-read, MP4 files read once more, one commit.
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


def files_bytes(root: pathlib.Path, *, under: tuple[str, ...] = ()) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and (not under or p.relative_to(root).parts[0] in under))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=60)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    source = workload("lance", SyntheticLeRobot(lengths=[300] * args.episodes, width=320, height=240, episodes_per_video_file=20,
                                                episodes_per_data_file=50, video_variants=8))
    work = pathlib.Path(tempfile.mkdtemp(prefix="bench_lance_"))
    variants = {"parquet": [], "lance (blob videos)": ["--table_format=lance"],
                "lance (video references)": ["--table_format=lance", "--lance_videos=reference"]}
    try:
        results = {}
        for name, extra in variants.items():
            output = work / name.split()[0] / str(len(results))
            runs = []
            for _ in range(args.repeat):
                shutil.rmtree(output, ignore_errors=True)
                runs.append(measure(convert(source, output, 1, "--verify_copies=false", *extra)))
            results[name] = (min(runs), files_bytes(output), output)
        base_wall, base_total = results["parquet"][0][0], results["parquet"][1]
        base_rows_files = files_bytes(results["parquet"][2], under=("data", "files"))
        print(f"{args.episodes} episodes x 300 frames, 2 AV1 cameras 320x240; one worker; best of {args.repeat}")
        print(f"{'output':26s} {'wall s':>7s} {'vs parquet':>10s} {'peak MB':>8s} {'bytes':>12s} {'vs Parquet+files':>17s}")
        for name, ((wall, _, rss), total, _) in results.items():
            print(f"{name:26s} {wall:7.2f} {wall / base_wall:9.2f}x {rss:8.0f} {total:12d} {(total / base_rows_files - 1) * 100:+16.2f}%")
        print(f"Parquet + files = data/ and files/ of the standalone output ({base_rows_files} bytes; with its JSON files {base_total})")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
