"""Write a bundled synthetic sample dataset (no download): `python -m pipelines.make_sample DST [--format=F]`.

Every registered sample writer (formats/samples/) can write one, for example:
lerobot_v3 (default): written the way lerobot 0.4.4 writes (formats/sources/lerobot_v3/sample.py): AV1
cameras joined per file by stream copy, several data files, video files and chunk folders.
lerobot_v2: LeRobot v2.1 as lerobot 0.3.x writes it (formats/sources/lerobot_v2/sample.py): one data file
and one H.264 MP4 per camera per episode, chunk folders of 5 episodes, jsonl metadata.
ortf: ORTF v0.2 as the spec lays it out (formats/sources/ortf/sample.py): chunks, two cameras (one at
half rate), 16-bit depth, audio, annotations.
l5kit: a zarr v2 group laid out as l5kit writes it (formats/sources/l5kit/sample.py): several chunks per
array, partial last chunks, frames without agents.
rlds: TFDS/RLDS TFRecord shards (formats/sources/rlds/sample.py); convert it with --fps (no known rate).
"""

from __future__ import annotations

import argparse
import sys

from formats import samples

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("output", help="where to write the sample dataset")
    parser.add_argument("--format", default="lerobot_v3", choices=sorted(samples.SAMPLES))
    parser.add_argument("--episodes", type=int, default=12, help="episodes (scenes for l5kit)")
    args = parser.parse_args(argv)
    try:
        written = samples.get(args.format).bundled(args.output, args.episodes)
    except ImportError as error:  # a writer's missing optional package
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"wrote {written} to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
