"""Incremental nightly re-conversion: cost with 1% of episodes changed against a full conversion.

    python bench/bench_incremental.py [--episodes=200] [--steps=120] [--mode=reencode]

Workload: an ORTF dataset (formats/sources/ortf/sample.py) of --episodes episodes, two cameras at
160x120, 16-bit depth, audio and annotations. A full conversion is timed; then 1% of the episodes
get a re-recorded wrist video and `--incremental` is timed on the same output. Both run as
subprocesses of the CLI, as a nightly job would. Target: incremental <= 0.10 x full.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from formats.sources.lerobot_v3.sample import synthetic_frames  # noqa: E402
from formats.sources.ortf.sample import SyntheticORTF, write_dataset  # noqa: E402
from formats.video import encode_frames  # noqa: E402
from formats.video.policy import EncodeOptions  # noqa: E402


def _convert(src: pathlib.Path, dst: pathlib.Path, *extra: str) -> float:
    env = dict(os.environ, PYTHONPATH=str(ROOT), SVT_LOG="1")
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pipelines.convert", f"--input={src}", f"--output={dst}", "--progress=off", *extra],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-2000:])
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--mode", default="reencode", choices=["copy", "reencode"])
    args = parser.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="bench_incremental_"))
    try:
        src = work / "ortf"
        print(f"writing {args.episodes} ORTF episodes x {args.steps} steps ...", file=sys.stderr)
        write_dataset(str(src), SyntheticORTF(lengths=[args.steps] * args.episodes, episodes_per_chunk=25, sequential_ids=True,
                                              slow_camera=None, width=160, height=120))
        dst = work / "out"
        full = _convert(src, dst, f"--video={args.mode}")
        changed = max(1, args.episodes // 100)
        for number in range(changed):
            path = next(src.glob(f"videos/cam_wrist/chunk-*/episode_{number * 37 % args.episodes:06d}.mp4"))
            with open(path, "wb") as handle:
                encode_frames(synthetic_frames(99, number, args.steps, 120, 160), handle, fps=15, options=EncodeOptions("h264", crf=18))
        incremental = _convert(src, dst, f"--video={args.mode}", "--incremental")
        report = json.loads((dst / "mixtrain.json").read_text())["incremental"]
        print(f"\nincremental re-conversion, {args.episodes} episodes, {changed} changed, --video={args.mode}")
        print(f"full conversion      {full:8.2f} s")
        print(f"incremental run      {incremental:8.2f} s   (reused {report['reused_sequences']}, converted {report['converted_units']})")
        print(f"ratio incremental / full: {incremental / full:.3f} (target <= 0.10)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
