"""How trajectory cells are stored: `lists` (list<fixed_size_list<dtype, D>>, the default) or
`bytes` (one binary cell per sequence: the [T, D] array's raw little-endian values).

Why `bytes`: a list<fixed_size_list> cell costs Parquet a repetition and a definition level per
value and Arrow an offsets array per sequence; a binary cell is one length and one contiguous
run of values, which a reader turns into a numpy [T, D] view without copying (bench/bench_read.py
measured 2x+ faster reads to numpy with pyarrow and DuckDB). What it costs: the Parquet schema no
longer says the dtype and D, so column_types does: `layout: "bytes"`, `dtype`, `dim`,
`byte_order: "little"` and `cell_shape: [-1, D]` (-1: the row's `length`). A column_types entry
without `layout` is the `lists` layout.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from formats.sequence import TRAJECTORY, ColumnSpec

__all__ = ["LISTS", "BYTES", "LAYOUTS", "with_layout", "is_bytes", "cell_type", "encode", "decode", "column_values", "cell_steps"]

LISTS, BYTES = "lists", "bytes"
LAYOUTS = (LISTS, BYTES)


def with_layout(columns: list[ColumnSpec], layout: str) -> list[ColumnSpec]:
    """The dataset's columns with every trajectory stored in `layout`."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown array layout {layout!r}; choose one of {', '.join(LAYOUTS)}")
    if layout == LISTS:
        return list(columns)
    return [ColumnSpec(spec.name, TRAJECTORY, pa.binary(),
                       {**spec.meta, "layout": BYTES, "byte_order": "little", "cell_shape": [-1, int(spec.meta["dim"])]})
            if spec.kind == TRAJECTORY else spec for spec in columns]


def is_bytes(entry: dict) -> bool:
    """Whether a column_types entry (or a ColumnSpec's meta) describes a `bytes` trajectory."""
    return entry.get("type", TRAJECTORY) == TRAJECTORY and entry.get("layout") == BYTES


def cell_type(entry: dict) -> pa.DataType:
    """The Arrow type of a trajectory cell its column_types entry describes."""
    if is_bytes(entry):
        return pa.binary()
    return pa.list_(pa.list_(pa.from_numpy_dtype(np.dtype(entry["dtype"])), int(entry["dim"])))


def _little(dtype: np.dtype) -> np.dtype:
    return np.dtype(dtype).newbyteorder("<")


def encode(arrays: list[np.ndarray], dtype: str) -> pa.BinaryArray:
    """One binary cell per [T, D] array: its values in C order, little-endian `dtype`."""
    little = _little(dtype)
    flat = [np.ascontiguousarray(array, dtype=little).reshape(-1) for array in arrays]
    sizes = np.array([a.nbytes for a in flat], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
    if offsets[-1] != sizes.sum():  # more than 2 GiB of one column in one batch
        raise ValueError("trajectory cells of one batch exceed 2 GiB; write fewer sequences per batch")
    data = np.concatenate(flat).view(np.uint8) if flat else np.zeros(0, np.uint8)
    return pa.Array.from_buffers(pa.binary(), len(flat), [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def decode(array: pa.Array, index: int, dtype: str, dim: int) -> np.ndarray | None:
    """Row `index` of a binary trajectory array as a [T, D] view of Arrow's buffer (no
    copy; a copy only on big-endian machines). None for a null cell."""
    if array.null_count and not array[index].is_valid:
        return None
    little = _little(dtype)
    offsets = np.frombuffer(array.buffers()[1], np.int32 if pa.types.is_binary(array.type) else np.int64,
                            count=len(array) + 1, offset=array.offset * (4 if pa.types.is_binary(array.type) else 8))
    start, stop = int(offsets[index]), int(offsets[index + 1])
    if (stop - start) % (little.itemsize * dim):
        raise ValueError(f"a trajectory cell of {stop - start} bytes is not a whole number of {dim} x {little} steps")
    values = np.frombuffer(array.buffers()[2], little, count=(stop - start) // little.itemsize, offset=start)
    values = values.reshape(-1, dim)
    return values if little == np.dtype(dtype).newbyteorder("=") else values.astype(np.dtype(dtype).newbyteorder("="))


def column_values(array: pa.Array, dtype: str, dim: int) -> np.ndarray:
    """Every step of every cell of a binary trajectory array, in row order: [steps, D] (a view;
    what statistics read, the same numbers as the cells' arrays concatenated)."""
    little = _little(dtype)
    wide = not pa.types.is_binary(array.type)
    offsets = np.frombuffer(array.buffers()[1], np.int64 if wide else np.int32, count=len(array) + 1,
                            offset=array.offset * (8 if wide else 4))
    start, stop = (int(offsets[0]), int(offsets[-1])) if len(array) else (0, 0)
    data = array.buffers()[2]
    values = np.frombuffer(data, little, count=(stop - start) // little.itemsize, offset=start) if data is not None and stop > start \
        else np.zeros(0, little)
    values = values.reshape(-1, dim)
    return values if little == np.dtype(dtype).newbyteorder("=") else values.astype(np.dtype(dtype).newbyteorder("="))


def cell_steps(array: pa.Array, entry: dict) -> pa.Array:
    """Steps per cell of a trajectory column in either layout (what validate compares with `length`)."""
    if is_bytes(entry):
        step_bytes = np.dtype(entry["dtype"]).itemsize * int(entry["dim"])
        sizes = pc.binary_length(array).to_numpy(zero_copy_only=False)
        return pa.array(np.where(sizes % step_bytes == 0, sizes // step_bytes, -1))  # -1: a partial step
    return pc.list_value_length(array)
