"""The parallel peer: what an expert user with N cores writes instead of adopting the converter.

    python bench/peer_parallel.py SRC DST --procs N [--mp4-floor]

bench/peer.py's straight-line LeRobot v3 -> one-row-per-episode Parquet loop, run in N processes
(multiprocessing, fork), the episodes split into N runs of whole data files; each process writes its own
part file and its own cut MP4s. No planning, checks, statistics or publication.
"""

from __future__ import annotations

import glob
import json
import multiprocessing
import os
import sys

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _work(args) -> int:
    src, dst, part, episodes, floor = args
    from bench.peer import _Cutter, _segment, write_part

    if not episodes:
        return 0
    info = json.load(open(f"{src}/meta/info.json"))
    write_part(src, dst, info, episodes, _Cutter() if floor else _segment, f"part-{part:05d}.parquet")
    return len(episodes)


def main() -> None:
    src, dst = sys.argv[1], sys.argv[2]
    procs = int(sys.argv[sys.argv.index("--procs") + 1]) if "--procs" in sys.argv else os.cpu_count()
    floor = "--mp4-floor" in sys.argv
    episodes = pa.concat_tables([pq.read_table(p) for p in sorted(glob.glob(f"{src}/meta/episodes/*/*.parquet"))]).to_pylist()
    by_file: dict[tuple, list] = {}
    for episode in episodes:
        by_file.setdefault((episode["data/chunk_index"], episode["data/file_index"]), []).append(episode)
    files = list(by_file.values())
    groups = [[e for f in files[i::procs] for e in f] for i in range(procs)]
    if len(files) < procs:  # fewer data files than processes: split episodes evenly instead
        groups = [episodes[i::procs] for i in range(procs)]
    os.makedirs(f"{dst}/data", exist_ok=True)
    with multiprocessing.get_context("fork").Pool(procs) as pool:
        done = sum(pool.map(_work, [(src, dst, i, g, floor) for i, g in enumerate(groups)]))
    assert done == len(episodes), (done, len(episodes))


if __name__ == "__main__":
    main()
