"""Shard statistics: read straight from the written Arrow rows against turning them back into Sequences.

    python bench/bench_stats.py [--repeat=3]

The shard writer computes stats.json's partials and the non-finite counts of every row group it
writes. Before, it turned the row group back into Sequence objects (`mixtrain.table_to_sequences`)
and concatenated their arrays; now `formats.mixtrain.stats.table_stats` / `non_finite_counts` read the
Arrow columns directly. The baseline, measured in the same run on the same row groups, is that
earlier path, kept below as `sequences_path` (the statistics code as transforms/write.py had it).
Both must give the same stats.json bytes; the bench checks that before it reports a ratio.

Row groups, as the writer builds them (one record batch per row, closed at 1,024 rows or 8 MB):
  many     700 sequences x 100 steps (about 7 MB): two float32 trajectories (14, 7 dims),
           timestamps, int64 and float32 steps (short episodes, as workload (c) of bench/run.py)
  long     1 sequence of 20,000 steps x 64 float32 dims, action and state (a row group of its own,
           as each episode of workload (d) is)
  agents   200 frames-sequences x 50 steps, each step a list of 0-4 agent records (L5Kit-like)
"""

from __future__ import annotations

import argparse
import functools
import json
import pathlib
import sys
import time

import numpy as np
import pyarrow as pa

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from formats import mixtrain  # noqa: E402
from formats.mixtrain.stats import ColumnStats, non_finite_counts, sketch_level_for, stats_columns, summarise, table_stats  # noqa: E402
from formats.sequence import STEPS, TIMESTAMPS, TRAJECTORY, ColumnSpec, Sequence, base_columns  # noqa: E402

AGENT = pa.struct([("centroid", pa.list_(pa.float64(), 2)), ("extent", pa.list_(pa.float32(), 3)), ("yaw", pa.float32())])


def _sequence(i: int, length: int, rng, dims: tuple[int, int], agents: bool) -> Sequence:
    sequence = Sequence(f"episode_{i:06d}", length, np.arange(length) / 30.0,
                        scalars={"length": length, "duration_seconds": length / 30.0},
                        trajectories={"action": rng.normal(size=(length, dims[0])).astype(np.float32),
                                      "obs_state": rng.normal(size=(length, dims[1])).astype(np.float32)},
                        steps={"frame_index": pa.array(np.arange(length)), "reward": pa.array(rng.random(length).astype(np.float32))})
    if agents:
        counts = rng.integers(0, 5, length)
        sequence.steps["agents"] = pa.array([[{"centroid": [1.0, 2.0], "extent": [4.0, 2.0, 1.5], "yaw": 0.1}] * int(n) for n in counts],
                                            pa.list_(AGENT))
    return sequence


def workload(name: str) -> tuple[pa.Table, list[ColumnSpec]]:
    rng = np.random.default_rng(0)
    count, length, dims = {"many": (700, 100, (14, 7)), "long": (1, 20_000, (64, 64)), "agents": (200, 50, (3, 3))}[name]
    columns = base_columns() + [ColumnSpec.trajectory("action", np.float32, dims[0]), ColumnSpec.trajectory("obs_state", np.float32, dims[1]),
                                ColumnSpec.steps("frame_index", pa.int64()), ColumnSpec.steps("reward", pa.float32())]
    if name == "agents":
        columns.append(ColumnSpec.steps("agents", pa.list_(AGENT), stats_fields=["centroid", "extent", "yaw"]))
    table = mixtrain.sequences_to_table([_sequence(i, length, rng, dims, name == "agents") for i in range(count)], columns)
    return pa.Table.from_batches(table.to_batches(max_chunksize=1), schema=table.schema), columns  # one batch per row


def sequences_path(table: pa.Table, columns: list[ColumnSpec]) -> tuple[dict, dict]:
    """The baseline: statistics as transforms/write.py computed them through Sequences (0c2abd0)."""
    sequences = mixtrain.table_to_sequences(table, columns)
    stats = {}
    for spec in stats_columns(columns):
        if spec.kind == TIMESTAMPS:
            values = np.concatenate([s.timestamp for s in sequences])
        elif spec.kind == TRAJECTORY:
            values = np.concatenate([s.trajectories[spec.name] for s in sequences])
        else:
            cells = [np.asarray(s.steps[spec.name]) for s in sequences if s.steps.get(spec.name) is not None]
            if not cells:
                continue
            values = np.concatenate(cells)
        stats[spec.name] = ColumnStats.of(values)
    for spec in columns:
        for field in spec.meta.get("stats_fields") or ():
            records = [s.steps[spec.name].flatten() for s in sequences if s.steps.get(spec.name) is not None]
            if not records or not sum(len(r) for r in records):
                continue
            values = pa.concat_arrays([r.field(field) for r in records])
            if pa.types.is_fixed_size_list(values.type):
                values = values.flatten()
            data = values.to_numpy(zero_copy_only=False).astype(np.float64).reshape(sum(len(r) for r in records), -1)
            stats[f"{spec.name}.{field}"] = ColumnStats.of(data, sketch_level=sketch_level_for(len(data)))
    counts = {}
    for spec in columns:
        if spec.kind == TRAJECTORY:
            arrays = [s.trajectories[spec.name] for s in sequences]
        elif spec.kind == TIMESTAMPS:
            arrays = [s.timestamp for s in sequences]
        elif spec.kind == STEPS:
            arrays = [np.asarray(s.steps[spec.name]) for s in sequences if s.steps.get(spec.name) is not None]
        else:
            continue
        total = sum(int(np.count_nonzero(~np.isfinite(a))) for a in arrays if a.dtype.kind == "f")
        if total:
            counts[spec.name] = total
    return stats, counts


def arrow_path(table: pa.Table, columns: list[ColumnSpec]) -> tuple[dict, dict]:
    return table_stats(table, columns), non_finite_counts(table, columns)


def _best(function, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs of each path; the fastest counts")
    args = parser.parse_args()
    print(f"{'row group':<10} {'rows':>6} {'MB':>7} {'sequences s':>12} {'arrow s':>9} {'ratio':>7}")
    for name in ("many", "long", "agents"):
        table, columns = workload(name)
        before, after = sequences_path(table, columns), arrow_path(table, columns)
        same = json.dumps(summarise([before[0]])) == json.dumps(summarise([after[0]])) and before[1] == after[1]
        if not same:
            raise SystemExit(f"{name}: the two paths disagree; the stats.json bytes would change")
        old = _best(functools.partial(sequences_path, table, columns), args.repeat)
        new = _best(functools.partial(arrow_path, table, columns), args.repeat)
        print(f"{name:<10} {table.num_rows:>6} {table.nbytes / 1e6:7.1f} {old:12.3f} {new:9.3f} {old / new:6.1f}x")
    print("ratio: the Sequence path's time over the Arrow path's (same row group, same stats.json bytes)")


if __name__ == "__main__":
    main()
