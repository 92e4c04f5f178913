"""The hand-written peer: what a user writes instead of adopting mixtrain-convert.

    python bench/peer.py SRC DST [--mp4-floor]

A straight-line, single-process LeRobot v3 -> one-row-per-episode Parquet conversion with pyarrow
and PyAV only: read the episode index, each data file once, slice each episode's rows into
list<fixed_size_list> cells, cut each camera's segment out of its MP4 by packet remux, write one
zstd Parquet file. No planning, checks, statistics, staging or publication: a fair floor for
what the framework adds, not a strawman (it reads each data file once and never decodes video).

`--mp4-floor` is the one-process floor instead: each source MP4's moov parsed once and every cut
written as a valid MP4 with one kernel copy of its samples (formats/video/mp4.py, what the pipeline's
copy path uses), plus per-column statistics: the least work that writes the same files.
"""

from __future__ import annotations

import glob
import json
import os
import sys

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def _segment(source: str, target: str, start: float, end: float, fps: float) -> None:
    container = av.open(source)
    stream = container.streams.video[0]
    half = 0.5 / fps
    low, high = int(round((start - half) / stream.time_base)), int(round((end - half) / stream.time_base))
    if low > 0:
        container.seek(low, stream=stream, backward=True)
    output = av.open(target, "w", format="mp4")
    out_stream = output.add_stream_from_template(stream, opaque=True)
    out_stream.time_base = stream.time_base
    origin = None
    for packet in container.demux(stream):
        if packet.size == 0 or packet.pts is None:
            continue
        if packet.dts is not None and packet.dts >= high:
            break
        if low <= packet.pts < high:
            origin = packet.pts if origin is None else origin
            packet.pts -= origin
            if packet.dts is not None:
                packet.dts -= origin
            packet.stream = out_stream
            output.mux(packet)
    output.close()
    container.close()


class _Cutter:
    """Cuts by sample table, each source file's table parsed once (files are visited in order)."""

    def __init__(self):
        self._path, self._table = None, None

    def __call__(self, source: str, target: str, start: float, end: float, fps: float) -> None:
        from fractions import Fraction

        from formats.video import mp4

        if source != self._path:
            with open(source, "rb") as handle:
                self._path, self._table = source, mp4.read_sample_table(handle)
        scale, half = Fraction(self._table.timescale), 0.5 / fps
        cut = mp4.plan_cut(self._table, int(round((start - half) * scale)), int(round((end - half) * scale)))
        with open(source, "rb") as handle, open(target, "wb") as out:
            mp4.write_cut(cut, handle, out)


def _stats(table: pa.Table) -> dict:
    """Per-dimension mean, std, min and max of every list column, as stats.json holds them."""
    stats = {}
    for name in table.column_names:
        column = table.column(name)
        if pa.types.is_list(column.type) and pa.types.is_fixed_size_list(column.type.value_type):
            steps = column.combine_chunks().flatten()
            values = steps.flatten().to_numpy().reshape(len(steps), column.type.value_type.list_size)
            stats[name] = [values.mean(0), values.std(0), values.min(0), values.max(0)]
    return stats


def write_part(src: str, dst: str, info: dict, episodes: list[dict], segment, name: str = "part-00000.parquet") -> pa.Table:
    """The straight-line loop over `episodes` (rows of the episode index), one zstd Parquet file
    `dst/data/<name>` and each camera's cut MP4s; returns the table written (bench/peer_parallel.py
    runs it in N processes over runs of whole data files)."""
    fps = info["fps"]
    vectors = [k for k, v in info["features"].items() if v["dtype"] in ("float32", "float64") and v["shape"] != [1]]
    cameras = [k for k, v in info["features"].items() if v["dtype"] == "video"]
    os.makedirs(f"{dst}/data", exist_ok=True)
    columns: dict[str, list] = {"sequence_id": [], "length": [], "timestamp": [], **{k: [] for k in vectors}, **{c: [] for c in cameras}}
    data_cache: dict[str, pa.Table] = {}
    for episode in episodes:
        path = f"{src}/" + info["data_path"].format(chunk_index=episode["data/chunk_index"], file_index=episode["data/file_index"])
        if path not in data_cache:
            data_cache.clear()
            data_cache[path] = pq.read_table(path)
        table = data_cache[path]
        index = table.column("index").to_numpy()
        first = int(np.searchsorted(index, episode["dataset_from_index"]))
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
    lengths = np.array(columns["length"])
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    arrays = {
        "sequence_id": pa.array(columns["sequence_id"]),
        "length": pa.array(lengths),
        "timestamp": pa.ListArray.from_arrays(offsets, pa.array(np.concatenate(columns["timestamp"]))),
    }
    for key in vectors:
        arrays[key] = pa.ListArray.from_arrays(offsets, pa.concat_arrays(columns[key]))
    for camera in cameras:
        arrays[camera] = pa.array(columns[camera])
    table = pa.table(arrays)
    pq.write_table(table, f"{dst}/data/{name}", compression="zstd")
    return table


def main(src: str, dst: str, floor: bool = False) -> None:
    info = json.load(open(f"{src}/meta/info.json"))
    episodes = pa.concat_tables([pq.read_table(p) for p in sorted(glob.glob(f"{src}/meta/episodes/*/*.parquet"))]).to_pylist()
    table = write_part(src, dst, info, episodes, _Cutter() if floor else _segment)
    if floor:
        _stats(table)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], floor="--mp4-floor" in sys.argv[3:])
