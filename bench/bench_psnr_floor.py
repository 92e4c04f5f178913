"""What the luma PSNR floor costs an encode: the same frames encoded with the floor off (the
baseline) and on (`encode_frames` decoding its own packets and scoring each frame), in one run.

    python bench/bench_psnr_floor.py [--frames=300] [--repeat=3] [--video=PATH]

Frames: a real camera (so100_tiny's front camera from ../shared/fixtures, 640x480) when present,
else the synthetic gradient at 640x480; decoded once, held in memory, so both sides encode the
same frames and nothing else. Prints CPU seconds (best of --repeat) per side and their ratio.
"""

from __future__ import annotations

import argparse
import io
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from formats import video  # noqa: E402
from formats.sources.lerobot_v3.sample import synthetic_frames  # noqa: E402
from formats.video import policy  # noqa: E402

FIXTURE = ROOT.parent / "shared/fixtures/lerobot_v3/so100_tiny/videos/observation.images.front/chunk-000/file-000.mp4"


def _frames(path: pathlib.Path, count: int) -> tuple[list, str]:
    if path.exists():
        frames = []
        for frame in video.iter_frames(str(path)):
            frames.append(frame.reformat(format="yuv420p"))
            if len(frames) == count:
                break
        return frames, f"{path.relative_to(ROOT.parent)} ({frames[0].width}x{frames[0].height})"
    return list(synthetic_frames(0, 0, count, 480, 640)), "synthetic gradient 640x480"


def _best(frames: list, floor: float, repeat: int) -> tuple[float, float | None]:
    best, lowest = float("inf"), None
    for _ in range(repeat):
        start = time.process_time()
        result = video.encode_frames(frames, io.BytesIO(), fps=30, options=policy.EncodeOptions(min_psnr=floor))
        best, lowest = min(best, time.process_time() - start), result.psnr_min
    return best, lowest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--video", type=pathlib.Path, default=FIXTURE)
    args = parser.parse_args()
    frames, what = _frames(args.video, args.frames)
    off, _ = _best(frames, 0, args.repeat)
    on, lowest = _best(frames, policy.MIN_PSNR, args.repeat)
    print(f"{len(frames)} frames of {what}, h264 crf {policy.DEFAULT_CRF['h264']}, best of {args.repeat}")
    print(f"floor off (baseline): {off:.2f} s CPU ({len(frames) / off:.0f} frames/s)")
    print(f"floor on:             {on:.2f} s CPU, lowest luma PSNR {lowest:.2f} dB")
    print(f"ratio on / off: {on / off:.3f}")


if __name__ == "__main__":
    main()
