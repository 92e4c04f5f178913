"""Parquet encoding of a shard's row groups: tables of 1-row chunks against one combined table
written row by row.

    python bench/bench_shard_write.py [--repeat=3]

The shard writer (transforms/write.py) gets its rows as 1-row record batches. It used to write
them as they came (a table of 1-row chunks per row group): Parquet then checks the page size
after every row, and the shards' bytes follow from that. It now combines each row group into one
chunk per column and writes it with `shard_writer(row_by_row=True)` (a write batch of one row),
which cuts the pages after the same rows. The baseline, measured in the same run on the same row
groups, is the 1-row-chunk path; the bench checks that both give the same bytes before it reports
a ratio. CPU seconds (the process's, both threads of Arrow's encoder included), fastest of
`--repeat`.

Row groups: bench/bench_stats.py's `many` (700 x 100 steps), `long` (1 x 20,000 steps x 64 dims)
and `agents` (L5Kit-like structs), plus `traj`: 20 row groups of 1,024 sequences x 50 steps x
(6, 6) float32, the 20,000-episode trajectory shard of bench/bench_scaling.py.

Then the whole shard step (transforms/write.py `_WriteShardFn`: spilled rows read back in id
order, encoded, statistics on their thread) on `traj`'s sequences spilled by two "workers" into
files of 8 MB, by 2 to 1,024 bundles (a file each: Dataflow's many bundles give many files): spill
files of one row per record batch (as before, a read per row) against the default
SPILL_BATCH_ROWS, the same shard bytes checked. CPU and wall seconds, fastest of `--repeat`.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import pathlib
import shutil
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_stats import _sequence, workload  # noqa: E402
from formats import mixtrain, storage  # noqa: E402
from formats.sequence import ColumnSpec, Sequence, base_columns  # noqa: E402

TRAJ_COLUMNS = base_columns() + [ColumnSpec.trajectory("action", np.float32, 6), ColumnSpec.trajectory("obs_state", np.float32, 6),
                                 ColumnSpec.steps("frame_index", pa.int64()), ColumnSpec.steps("reward", pa.float32())]


def _traj_sequences() -> list[Sequence]:
    rng = np.random.default_rng(1)
    return [_sequence(i, 50, rng, (6, 6), False) for i in range(20 * 1024)]


def _traj() -> list[pa.Table]:
    table = mixtrain.sequences_to_table(_traj_sequences(), TRAJ_COLUMNS)
    return [pa.Table.from_batches(table.slice(start, 1024).to_batches(max_chunksize=1), schema=table.schema)
            for start in range(0, table.num_rows, 1024)]


def _shard_step(sequences: list[Sequence], batch_rows: int, bundles: int, repeat: int) -> tuple[float, float, bytes]:
    """(CPU s, wall s, shard bytes) of the shard writer on `sequences` spilled by `bundles`
    bundles (a spill file each) with `batch_rows` rows per record batch; the spilling itself (on
    the workers) is not counted."""
    from transforms import write

    best, data = (float("inf"), float("inf")), b""
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as folder:
            staging = storage.url_for(*storage.open_root(folder))
            spill, records = write._SpillRowsFn(staging, TRAJ_COLUMNS, num_shards=1, shard_rows=len(sequences)), []
            spill.setup()
            saved, write.SPILL_BATCH_ROWS = write.SPILL_BATCH_ROWS, batch_rows
            try:
                for bundle in (sequences[k::bundles] for k in range(bundles)):  # the workers' bundles, ids interleaved
                    spill.start_bundle()
                    records += [record for sequence in bundle for record in spill.process(sequence)]
                    records += [value.value for value in spill.finish_bundle()]
            finally:
                write.SPILL_BATCH_ROWS = saved
            shard = write._WriteShardFn(staging, TRAJ_COLUMNS)
            shard.setup()
            cpu, wall = time.process_time(), time.perf_counter()
            list(shard.process((0, [spilled for _, spilled in records])))
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            best = min(best, (cpu, wall))
            data = pathlib.Path(folder, mixtrain.shard_path(0)).read_bytes()
            shutil.rmtree(folder, ignore_errors=True)
    return best[0], best[1], data


def _write(groups: list[pa.Table], combined: bool) -> bytes:
    buffer = io.BytesIO()
    with mixtrain.shard_writer(buffer, groups[0].schema, row_by_row=combined) as writer:
        for group in groups:
            writer.write_table(group.combine_chunks() if combined else group, row_group_size=max(1, group.num_rows))
    return buffer.getvalue()


def _cpu(groups: list[pa.Table], combined: bool, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.process_time()
        _write(groups, combined)
        times.append(time.process_time() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs of each path; the fastest counts")
    args = parser.parse_args()
    print(f"{'row groups':<10} {'rows':>6} {'MB':>7} {'1-row chunks s':>15} {'combined s':>11} {'ratio':>7}")
    for name in ("many", "long", "agents", "traj"):
        groups = _traj() if name == "traj" else [workload(name)[0]]
        before, after = _write(groups, combined=False), _write(groups, combined=True)
        if before != after:
            raise SystemExit(f"{name}: the two paths give different bytes ({hashlib.sha256(before).hexdigest()[:12]} "
                             f"!= {hashlib.sha256(after).hexdigest()[:12]}); the shards would change")
        old, new = _cpu(groups, False, args.repeat), _cpu(groups, True, args.repeat)
        rows, size = sum(g.num_rows for g in groups), sum(g.nbytes for g in groups) / 1e6
        print(f"{name:<10} {rows:>6} {size:7.1f} {old:15.3f} {new:11.3f} {old / new:6.2f}x")
    print("ratio: CPU of writing 1-row chunks over CPU of writing the combined row groups row by row (same bytes)")
    from transforms import write

    sequences = _traj_sequences()
    print(f"\nshard step, {len(sequences)} sequences     batches of 1 row (CPU / wall s)   default batches   ratio CPU / wall")
    for bundles in (2, 64, 256, 1024):  # spill files: Dataflow's many bundles give many
        one_cpu, one_wall, one = _shard_step(sequences, 1, bundles, args.repeat)
        many_cpu, many_wall, many = _shard_step(sequences, write.SPILL_BATCH_ROWS, bundles, args.repeat)
        if one != many:
            raise SystemExit(f"shard step, {bundles} spill files: the spill batch size changed the shard's bytes")
        print(f"  {bundles:>4} spill files            {one_cpu:6.3f} / {one_wall:6.3f}               {many_cpu:6.3f} / {many_wall:6.3f}"
              f"     {one_cpu / many_cpu:.2f}x / {one_wall / many_wall:.2f}x")
    print("ratio: the shard step on spill files of 1-row batches (a read per row, as before) over the default (same shard bytes)")


if __name__ == "__main__":
    main()
