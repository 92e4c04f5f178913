"""What copy mode's verification costs: the copy alone against the default check and the full decode.

    python bench/bench_verify.py [--episodes=320] [--frames=150] [--repeat=2] [--workers=1]

Workload: synthetic LeRobot v3 datasets from the project's writer (formats/sources/lerobot_v3/sample.py),
two cameras at the writer's 64x48, --episodes episodes of --frames frames, 80 episodes per video file,
once with AV1 cameras (lerobot's default, a keyframe every 2 frames) and once with H.264 (x264's
default GOP, B-frames). Each is converted by the CLI in copy mode three times:

  --verify_copies=false  the copy alone (the baseline, ratio 1.00)
  (default)              every copied sample's framing checked, each file's first picture decoded
  --verify_copies=full   every copied picture decoded

CPU seconds are the converter subprocess's (user + system, its threads and workers); best of
--repeat by CPU. Target (issue 28): the default <= 1.5x the CPU of the copy alone (a full decode
measured 6.2x on 16 cores).
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.run import convert, measure  # noqa: E402
from formats.sources.lerobot_v3.sample import SyntheticLeRobot, write_dataset  # noqa: E402

VARIANTS = {"copy alone (false)": ["--verify_copies=false"], "default check": [], "full decode (full)": ["--verify_copies=full"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=320)
    parser.add_argument("--frames", type=int, default=150)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1, choices=(1, 2))
    args = parser.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="bench_verify_"))
    try:
        print(f"{args.episodes} episodes x {args.frames} frames x 2 cameras (64x48), {args.workers} worker(s), best of {args.repeat} "
              f"by CPU; ratios against the copy alone in the same run")
        print(f"{'codec':6s} {'verification':22s} {'wall s':>7s} {'CPU s':>7s} {'CPU ratio':>9s} {'wall ratio':>10s}")
        for codec in ("av1", "h264"):
            source = work / f"source_{codec}"
            write_dataset(str(source), SyntheticLeRobot(lengths=[args.frames] * args.episodes, codec=codec,
                                                        gop=2 if codec == "av1" else None, episodes_per_video_file=80,
                                                        episodes_per_data_file=80, video_variants=8))
            base = None
            for name, extra in VARIANTS.items():
                runs = []
                for attempt in range(args.repeat):
                    output = work / f"out_{codec}_{len(runs)}_{attempt}"
                    runs.append(measure(convert(source, output, args.workers, *extra)))
                    shutil.rmtree(output, ignore_errors=True)
                wall, cpu, _ = min(runs, key=lambda run: run[1])
                base = base or (wall, cpu)
                print(f"{codec:6s} {name:22s} {wall:7.2f} {cpu:7.2f} {cpu / base[1]:8.2f}x {wall / base[0]:9.2f}x", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
