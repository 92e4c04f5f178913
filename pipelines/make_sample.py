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
rlds: TFDS/RLDS TFRecord shards (formats/sources/rlds/sample.py), or ArrayRecord shards with
--file_format=array_record (tfds' file_format=array_record); convert it with --fps (no known rate).
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
    choices = {name: values for sample in samples.SAMPLES.values() for name, values in sample.bundled_choices.items()}
    for name, values in sorted(choices.items()):
        owners = ", ".join(sorted(s.source for s in samples.SAMPLES.values() if name in s.bundled_choices))
        parser.add_argument(f"--{name}", choices=values, help=f"--format={owners} only (default {values[0]})")
    args = parser.parse_args(argv)
    sample = samples.get(args.format)
    chosen = {name: getattr(args, name) for name in choices if getattr(args, name) is not None}
    for name in chosen:
        if name not in sample.bundled_choices:
            parser.error(f"--{name} has no effect with --format={args.format}")
    try:
        written = sample.bundled(args.output, args.episodes, **chosen)
    except ImportError as error:  # a writer's missing optional package
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"wrote {written} to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
