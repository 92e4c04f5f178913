"""Training reads: every sequence's trajectories to numpy [T, D], per array layout, format and reader.

    python bench/bench_read.py [--sequences=1000] [--steps=500] [--dims=32] [--repeat=3]

The same data (a random walk per sequence and dimension, float32: smooth like robot states, two
trajectory columns `state` and `action`) is written once per variant, row groups as the
pipeline closes them (formats/mixtrain/__init__.py ROW_GROUP_ROWS / ROW_GROUP_BYTES), zstd:
  lists       list<fixed_size_list<float32, D>>, no BYTE_STREAM_SPLIT: the baseline (ratio 1.00)
  lists+bss   the same with BYTE_STREAM_SPLIT on the float leaves
  bytes       --array_layout=bytes: one binary cell of raw little-endian values per sequence
  lance/*     the lists and bytes tables written as a Lance dataset the way --table_format=lance
              writes its fragments (formats/mixtrain/tables/lance.py: file version 2.2, zstd on the leaves)
  lance2.0/*  the same with pylance's default file version (2.0: no compression), for comparison
and read back, single-threaded, by pyarrow, DuckDB and polars (Parquet) and by Lance's scanner
and DuckDB over the Lance dataset, each time into one numpy [T, D] view or array per sequence and
column (the fastest way each layout allows: offsets into the flat values, or np.frombuffer).
Every read is checked bit for bit against the generated arrays once, then timed `--repeat`
times in round robin over the variants (best kept; files are in the page cache: this measures
decoding, not the disk).
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("POLARS_MAX_THREADS", "1")  # before polars is imported

import pathlib  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from formats import mixtrain  # noqa: E402
from formats.mixtrain import array_layout  # noqa: E402
from formats.sequence import ColumnSpec, Sequence  # noqa: E402

COLUMNS = ("state", "action")


def generate(sequences: int, steps: int, dims: int, seed: int = 0) -> list[Sequence]:
    rng = np.random.default_rng(seed)
    out = []
    for index in range(sequences):
        sequence = Sequence(f"seq_{index:06d}", steps, np.arange(steps) / 30.0)
        for name in COLUMNS:
            walk = np.cumsum(rng.normal(0, 0.01, (steps, dims)), axis=0) + rng.normal(0, 1, dims)
            sequence.trajectories[name] = walk.astype(np.float32)
        out.append(sequence)
    return out


def columns(layout: str, dims: int) -> list[ColumnSpec]:
    specs = [ColumnSpec("sequence_id", "scalar", pa.string()), *(ColumnSpec.trajectory(n, np.float32, dims) for n in COLUMNS)]
    return array_layout.with_layout(specs, layout)


def table_of(data: list[Sequence], layout: str, dims: int) -> pa.Table:
    return mixtrain.sequences_to_table(data, columns(layout, dims))


def write_parquet(table: pa.Table, path: pathlib.Path, *, byte_stream_split: bool) -> None:
    rows_per_group = max(1, min(mixtrain.ROW_GROUP_ROWS, int(mixtrain.ROW_GROUP_BYTES / (table.nbytes / table.num_rows))))
    with open(path, "wb") as handle:
        if byte_stream_split:
            floats = [f"{n}.list.element.list.element" for n in COLUMNS]
            writer = pq.ParquetWriter(handle, table.schema, compression=mixtrain.PARQUET_COMPRESSION, use_dictionary=["sequence_id"],
                                      use_byte_stream_split=floats)
        else:
            writer = mixtrain.shard_writer(handle, table.schema)
        with writer:
            writer.write_table(table, row_group_size=rows_per_group)


def write_lance(table: pa.Table, path: pathlib.Path, *, as_converter: bool = True) -> None:
    import lance

    from formats.mixtrain.tables import lance as lance_table
    if not as_converter:
        lance.write_dataset(table, str(path))  # pylance's default file version
        return
    table = pa.Table.from_batches(table.to_batches(), lance_table.lance_schema(table.schema, []))
    lance.write_dataset(table, str(path), data_storage_version=lance_table.FILE_VERSION)


# --- to numpy -------------------------------------------------------------------------------------


def arrays_of(column: pa.ChunkedArray, dims: int) -> list[np.ndarray]:
    """One [T, D] float32 array per row, zero-copy views of the Arrow buffers."""
    out = []
    for chunk in column.chunks:
        if pa.types.is_binary(chunk.type) or pa.types.is_large_binary(chunk.type):
            out += [array_layout.decode(chunk, i, "float32", dims) for i in range(len(chunk))]
            continue
        offsets = chunk.offsets.to_numpy()
        offsets = offsets - offsets[0]
        flat = chunk.flatten().flatten().to_numpy()  # the rows' steps, contiguous: zero-copy
        out += [flat[offsets[i] * dims:offsets[i + 1] * dims].reshape(-1, dims) for i in range(len(chunk))]
    return out


def numpy_rows(table: pa.Table, dims: int) -> dict[str, list[np.ndarray]]:
    return {name: arrays_of(table.column(name), dims) for name in COLUMNS}


def read_pyarrow(path: pathlib.Path) -> pa.Table:
    return pq.read_table(path, columns=list(COLUMNS), use_threads=False)


def duckdb_connection():
    import duckdb
    connection = duckdb.connect()
    connection.execute("SET threads = 1")
    return connection


def read_duckdb(path: pathlib.Path) -> pa.Table:
    connection = duckdb_connection()
    table = connection.sql(f"SELECT {', '.join(COLUMNS)} FROM read_parquet('{path}')").to_arrow_table()
    connection.close()
    return table


def read_polars(path: pathlib.Path) -> pa.Table:
    import polars as pl
    return pl.read_parquet(path, columns=list(COLUMNS), use_pyarrow=False).to_arrow()


def read_lance(path: pathlib.Path) -> pa.Table:
    import lance
    return lance.dataset(str(path)).to_table(columns=list(COLUMNS))


def read_duckdb_lance(path: pathlib.Path) -> pa.Table:
    import lance
    dataset = lance.dataset(str(path))  # noqa: F841 (DuckDB's replacement scan finds it by name)
    connection = duckdb_connection()
    table = connection.sql(f"SELECT {', '.join(COLUMNS)} FROM dataset").to_arrow_table()
    connection.close()
    return table


def check(rows: dict[str, list[np.ndarray]], data: list[Sequence]) -> None:
    for name in COLUMNS:
        got = rows[name]
        if len(got) != len(data):
            raise SystemExit(f"{name}: {len(got)} rows read, {len(data)} written")
        for array, sequence in zip(got, data):
            expected = sequence.trajectories[name]
            if array.shape != expected.shape or array.tobytes() != expected.tobytes():
                raise SystemExit(f"{name}: {sequence.sequence_id} read back differently")


def size_of(path: pathlib.Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sequences", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--dims", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    data = generate(args.sequences, args.steps, args.dims)
    nbytes = sum(s.trajectories[n].nbytes for s in data for n in COLUMNS)
    work = pathlib.Path(tempfile.mkdtemp(prefix="mixtrain-bench-read-"))
    try:
        files = {
            "lists": work / "lists.parquet", "lists+bss": work / "lists_bss.parquet", "bytes": work / "bytes.parquet",
            "lance/lists": work / "lists.lance", "lance/bytes": work / "bytes.lance",
            "lance2.0/lists": work / "lists20.lance", "lance2.0/bytes": work / "bytes20.lance",
        }
        lists, raw = table_of(data, "lists", args.dims), table_of(data, "bytes", args.dims)
        write_parquet(lists, files["lists"], byte_stream_split=False)
        write_parquet(lists, files["lists+bss"], byte_stream_split=True)
        write_parquet(raw, files["bytes"], byte_stream_split=False)
        write_lance(lists, files["lance/lists"])
        write_lance(raw, files["lance/bytes"])
        write_lance(lists, files["lance2.0/lists"], as_converter=False)
        write_lance(raw, files["lance2.0/bytes"], as_converter=False)
        del lists, raw
        readers = {"pyarrow": read_pyarrow, "duckdb": read_duckdb, "polars": read_polars}
        plan = [(variant, name) for variant in ("lists", "lists+bss", "bytes") for name in readers]
        plan += [(variant, name) for variant in ("lance/lists", "lance/bytes", "lance2.0/lists", "lance2.0/bytes")
                 for name in ("lance", "duckdb")]
        lance_readers = {"lance": read_lance, "duckdb": read_duckdb_lance}
        results: dict[tuple[str, str], float] = {}
        readable = []
        for variant, name in plan:
            read = (lance_readers if variant.startswith("lance") else readers)[name]
            try:
                check(numpy_rows(read(files[variant]), args.dims), data)
                readable.append((variant, name, read))
            except Exception as error:  # a reader that cannot read a variant is a finding, not a crash
                print(f"{variant:12s} {name:8s} FAILED: {str(error).splitlines()[0][:100]}")
        # Round robin, best of --repeat: a burst of load from the machine's neighbours then slows
        # one round of every variant, not every repeat of one.
        for _ in range(args.repeat):
            for variant, name, read in readable:
                start = time.perf_counter()
                rows = numpy_rows(read(files[variant]), args.dims)
                results[variant, name] = min(results.get((variant, name), float("inf")), time.perf_counter() - start)
                del rows
        print(f"{args.sequences} sequences x {args.steps} steps x {args.dims} float32, 2 columns ({nbytes / 1e6:.0f} MB as numpy); "
              f"single-threaded, best of {args.repeat}")
        print(f"{'layout':12s} {'reader':8s} {'file MB':>8s} {'size':>6s} {'seq/s':>9s} {'GB/s':>6s} {'vs lists':>9s}")
        for variant, name in plan:
            if (variant, name) not in results:
                continue
            seconds = results[variant, name]
            baseline = results.get(("lists", "duckdb" if name == "duckdb" else "pyarrow" if name == "lance" else name))
            size = size_of(files[variant]) / size_of(files["lists"])
            print(f"{variant:12s} {name:8s} {size_of(files[variant]) / 1e6:8.1f} {size:6.2f} {args.sequences / seconds:9.0f} "
                  f"{nbytes / seconds / 1e9:6.2f} {baseline / seconds if baseline else float('nan'):8.2f}x")
        print("vs lists: time of the same reader on the lists layout (Lance rows: pyarrow's) / this row's time")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
