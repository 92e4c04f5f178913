"""L5Kit per-scene load: time and memory against reading the same bytes, in the same run.

    python bench/bench_l5kit.py [--scenes=6] [--frames=2500] [--agents=120]

Workload: a zarr dataset written as l5kit writes it (formats/sources/l5kit/sample.py) with long scenes
and dense agents (0..--agents per frame, about half that on average), agents in 20,000-row
chunks as in the Lyft data. For each scene, in one process:

  floor      decompress exactly the chunks the scene touches into numpy (frames, agents, faces):
             what any reader must do;
  load       `formats.sources.l5kit.load` plus the scene's Arrow row (`mixtrain.sequences_to_table`):
             what a worker does per scene.

Prints per-scene milliseconds, the ratio load / floor, and peak memory of the load (numpy via
tracemalloc plus Arrow's pool) against the size of the scene's records.
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pyarrow as pa  # noqa: E402

from formats import mixtrain, storage  # noqa: E402
from formats.sources import l5kit  # noqa: E402
from formats.sources.l5kit.sample import SyntheticL5Kit, write_dataset  # noqa: E402
from formats.sources.l5kit.zarr_v2 import ZarrArray  # noqa: E402


def _floor(fs, root: str, ref, truth) -> int:
    """Decode the scene's chunks with fresh readers; return the bytes of its records."""
    frames = ZarrArray(fs, storage.join(root, "frames")).read(ref.frame_start, ref.frame_end)
    total = frames.nbytes
    for name, field in (("agents", "agent_index_interval"), ("traffic_light_faces", "traffic_light_faces_index_interval")):
        low, high = int(frames[field][0, 0]), int(frames[field][-1, 1])
        total += ZarrArray(fs, storage.join(root, name)).read(low, high).nbytes
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenes", type=int, default=6)
    parser.add_argument("--frames", type=int, default=2500)
    parser.add_argument("--agents", type=int, default=120)
    args = parser.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="bench_l5kit_"))
    try:
        path = work / "ds.zarr"
        print(f"writing {args.scenes} scenes x {args.frames} frames, 0..{args.agents} agents a frame ...", file=sys.stderr)
        truth = write_dataset(str(path), SyntheticL5Kit(scene_lengths=[args.frames] * args.scenes, max_agents_per_frame=args.agents,
                                                        frames_chunk=10_000, agents_chunk=20_000, faces_chunk=10_000, scenes_chunk=10_000))
        fs, root = storage.open_root(str(path))
        meta, refs = l5kit.plan(fs, root)
        floors, loads, peaks, sizes = [], [], [], []
        for ref in refs:
            started = time.perf_counter()
            size = _floor(fs, root, ref, truth)
            floors.append(time.perf_counter() - started)
            pool = pa.default_memory_pool()
            arrow_before = pool.bytes_allocated()
            tracemalloc.start()
            started = time.perf_counter()
            sequence = l5kit.load(fs, root, ref, meta)
            table = mixtrain.sequences_to_table([sequence], meta.columns)
            loads.append(time.perf_counter() - started)
            _, numpy_peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            peaks.append(numpy_peak + pool.bytes_allocated() - arrow_before)
            sizes.append(size)
            del sequence, table
        agents = len(truth["agents"]) / args.scenes
        print(f"\nL5Kit per-scene load: {args.scenes} scenes x {args.frames} frames, {agents:,.0f} agents a scene on average")
        print(f"{'':<8} {'ms/scene (median)':>18}")
        print(f"{'floor':<8} {1000 * statistics.median(floors):18.1f}")
        print(f"{'load':<8} {1000 * statistics.median(loads):18.1f}")
        print(f"ratio load / floor: {statistics.median(loads) / statistics.median(floors):.2f}")
        print(f"scene records {statistics.median(sizes) / 1e6:.1f} MB; load peak (numpy + Arrow) "
              f"{statistics.median(peaks) / 1e6:.1f} MB = {statistics.median(peaks) / statistics.median(sizes):.2f}x the records")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
