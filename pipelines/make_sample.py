"""Write a bundled synthetic sample dataset (no download): `python -m pipelines.make_sample DST [--format=F]`.

lerobot_v3 (default): written the way lerobot 0.4.4 writes (formats/lerobot_v3_writer.py): AV1
cameras joined per file by stream copy, several data files, video files and chunk folders.
ortf: ORTF v0.2 as the spec lays it out (formats/ortf_writer.py): chunks, two cameras (one at
half rate), 16-bit depth, audio, annotations.
l5kit: a zarr v2 group laid out as l5kit writes it (formats/l5kit_writer.py): several chunks per
array, partial last chunks, frames without agents.
"""

from __future__ import annotations

import argparse
import sys

from formats import l5kit_writer, ortf_writer
from formats.lerobot_v3_writer import SyntheticLeRobot, write_dataset

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("output", help="where to write the sample dataset")
    parser.add_argument("--format", default="lerobot_v3", choices=["lerobot_v3", "l5kit", "ortf"])
    parser.add_argument("--episodes", type=int, default=12, help="episodes (scenes for l5kit)")
    args = parser.parse_args(argv)
    if args.format == "ortf":
        lengths = tuple(20 + (11 * i) % 17 for i in range(args.episodes))
        ortf_writer.write_dataset(args.output, ortf_writer.SyntheticORTF(lengths=lengths, episodes_per_chunk=5))
        print(f"wrote an ortf sample with {args.episodes} episodes ({sum(lengths)} steps) to {args.output}")
        return 0
    if args.format == "l5kit":
        lengths = tuple(40 + (13 * i) % 37 for i in range(args.episodes))
        l5kit_writer.write_dataset(args.output, l5kit_writer.SyntheticL5Kit(scene_lengths=lengths, scenes_chunk=5))
        print(f"wrote an l5kit sample with {args.episodes} scenes ({sum(lengths)} frames) to {args.output}")
        return 0
    lengths = tuple(30 + (7 * i) % 23 for i in range(args.episodes))
    spec = SyntheticLeRobot(lengths=lengths, episodes_per_data_file=5, episodes_per_video_file=4,
                            episodes_per_meta_file=6, chunks_size=2, multi_task_episodes=(3,))
    write_dataset(args.output, spec)
    print(f"wrote a {args.format} sample with {args.episodes} episodes ({sum(lengths)} frames) to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
