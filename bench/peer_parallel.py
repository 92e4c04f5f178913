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

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _work(args) -> int:
    src, dst, part, episodes, floor = args
    from bench.peer import _Cutter, _segment

    segment = _Cutter() if floor else _segment
    info = json.load(open(f"{src}/meta/info.json"))
    fps = info["fps"]
    vectors = [k for k, v in info["features"].items() if v["dtype"] in ("float32", "float64") and v["shape"] != [1]]
    cameras = [k for k, v in info["features"].items() if v["dtype"] == "video"]
    columns: dict[str, list] = {"sequence_id": [], "length": [], "timestamp": [], **{k: [] for k in vectors}, **{c: [] for c in cameras}}
    cache: dict[str, pa.Table] = {}
    for episode in episodes:
        path = f"{src}/" + info["data_path"].format(chunk_index=episode["data/chunk_index"], file_index=episode["data/file_index"])
        if path not in cache:
            cache.clear()
            cache[path] = pq.read_table(path)
        table = cache[path]
        first = int(np.searchsorted(table.column("index").to_numpy(), episode["dataset_from_index"]))
        rows = table.slice(first, episode["length"])
        sequence_id = f"episode_{episode['episode_index']:06d}"
        columns["sequence_id"].append(sequence_id)
        columns["length"].append(episode["length"])
        timestamp = rows.column("timestamp").to_numpy().astype(np.float64)
        columns["timestamp"].append(timestamp - timestamp[0])
        for key in vectors:
            columns[key].append(rows.column(key).combine_chunks())
        for camera in cameras:
            prefix = f"videos/{camera}/"
            source = f"{src}/" + info["video_path"].format(video_key=camera, chunk_index=episode[prefix + "chunk_index"],
                                                           file_index=episode[prefix + "file_index"])
            relative = f"files/{camera}/{sequence_id}.mp4"
            os.makedirs(os.path.dirname(f"{dst}/{relative}"), exist_ok=True)
            segment(source, f"{dst}/{relative}", episode[prefix + "from_timestamp"], episode[prefix + "to_timestamp"], fps)
            columns[camera].append(relative)
    if not episodes:
        return 0
    lengths = np.array(columns["length"])
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    arrays = {"sequence_id": pa.array(columns["sequence_id"]), "length": pa.array(lengths),
              "timestamp": pa.ListArray.from_arrays(offsets, pa.array(np.concatenate(columns["timestamp"])))}
    for key in vectors:
        arrays[key] = pa.ListArray.from_arrays(offsets, pa.concat_arrays(columns[key]))
    for camera in cameras:
        arrays[camera] = pa.array(columns[camera])
    pq.write_table(pa.table(arrays), f"{dst}/data/part-{part:05d}.parquet", compression="zstd")
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
