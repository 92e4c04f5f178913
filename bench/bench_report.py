"""The HTML report of a large dataset: build time and page size (issue: 2,000 sequences, < 30 s, < 5 MB).

    python bench/bench_report.py [--sequences=2000] [--cameras=2] [--width=640] [--height=480]
                                 [--dims=14] [--variants=0] [--keep=DIR]

Writes a synthetic LeRobot v3 dataset (H.264 cameras; sequence lengths spread over 20..199
steps, or all 120 steps with --variants=N, which encodes only N distinct videos per camera and
is much faster to write), converts it with the CLI, then times `python -m pipelines.inspect DST
--html report.html` in a subprocess (interpreter start included) and reports the page's size.
The baseline measured in the same run is the terminal summary alone (no --html).
With --keep=DIR the source and the dataset stay in DIR and are reused by the next run.
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

from formats.sources.lerobot_v3.sample import SyntheticLeRobot, write_dataset  # noqa: E402


def _timed(command: list[str]) -> float:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-2000:])
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=2000)
    parser.add_argument("--cameras", type=int, default=2)
    parser.add_argument("--width", type=int, default=640)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--dims", type=int, default=14)
    parser.add_argument("--variants", type=int, default=0, help="distinct videos per camera (0: one per episode)")
    parser.add_argument("--keep", default=None, help="folder for the source and dataset, reused when present")
    args = parser.parse_args()
    base = pathlib.Path(args.keep or tempfile.mkdtemp(prefix="bench_report_"))
    src, dst = base / "src", base / "mixtrain"
    if not (dst / "mixtrain.json").exists():
        shutil.rmtree(base, ignore_errors=True)
        lengths = (120,) * args.sequences if args.variants else tuple(20 + (i * 37) % 180 for i in range(args.sequences))
        spec = SyntheticLeRobot(lengths=lengths, codec="h264", gop=None, width=args.width, height=args.height,
                                cameras=tuple(f"observation.images.cam{i}" for i in range(args.cameras)),
                                state_dim=args.dims, action_dim=args.dims, video_variants=args.variants,
                                episodes_per_video_file=200, episodes_per_data_file=500, episodes_per_meta_file=500)
        started = time.perf_counter()
        write_dataset(str(src), spec)
        print(f"source written in {time.perf_counter() - started:.0f} s", flush=True)
        convert_s = _timed([sys.executable, "-m", "pipelines.convert", f"--input={src}", f"--output={dst}", "--progress=off"])
        print(f"converted in {convert_s:.0f} s", flush=True)
    page = base / "report.html"
    summary_s = min(_timed([sys.executable, "-m", "pipelines.inspect", str(dst)]) for _ in range(2))
    report_s = min(_timed([sys.executable, "-m", "pipelines.inspect", str(dst), f"--html={page}"]) for _ in range(2))
    size = page.stat().st_size
    videos = sum(1 for _ in (dst / "files").rglob("*.mp4"))
    print(f"{args.sequences} sequences, {videos} videos ({args.cameras} cameras {args.width}x{args.height}), {args.dims}-dim state/action")
    print(f"terminal summary (baseline): {summary_s:.2f} s")
    print(f"summary + HTML report:       {report_s:.2f} s ({report_s / summary_s:.1f}x the baseline; limit 30 s)")
    print(f"report size:                 {size / 1e6:.2f} MB (limit 5 MB)")
    if not args.keep:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
