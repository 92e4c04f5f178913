"""One rule for unifying Arrow types across the files of a dataset, and for reading a file's
column as the unified type.

Writers leave the same feature typed differently from file to file: pandas round-trips turn
`fixed_size_list<float>[D]` into `list<float>`, pyarrow infers `null` / `list<null>` for a column
that is empty in one file, structs inferred from different rows carry different fields.
`merge_types` is the type holding both (TypeError for a real conflict: another dimension or scalar
type); `conform` rebuilds an array of one file's type as the merged type, never converting values.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from formats.errors import FormatError

__all__ = ["is_list", "is_empty_type", "merge_types", "conform", "to_ipc", "from_ipc"]


def is_list(kind: pa.DataType) -> bool:
    return pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)


def is_empty_type(kind: pa.DataType) -> bool:
    """null, list<null>, list<list<null>>...: what pyarrow infers for a column with no values."""
    while is_list(kind):
        kind = kind.value_type
    return pa.types.is_null(kind)


def merge_types(a: pa.DataType, b: pa.DataType) -> pa.DataType:
    """The type holding both; TypeError when they conflict."""
    if a == b:
        return a
    if pa.types.is_null(a):
        return b
    if pa.types.is_null(b):
        return a
    if is_list(a) and is_list(b):
        value = merge_types(a.value_type, b.value_type)
        if pa.types.is_fixed_size_list(a) and pa.types.is_fixed_size_list(b):
            if a.list_size != b.list_size:
                raise TypeError
            return pa.list_(value, a.list_size)
        return pa.large_list(value) if pa.types.is_large_list(a) or pa.types.is_large_list(b) else pa.list_(value)
    if pa.types.is_struct(a) and pa.types.is_struct(b):
        fields = {a.field(i).name: a.field(i).type for i in range(a.num_fields)}
        for i in range(b.num_fields):
            name, kind = b.field(i).name, b.field(i).type
            fields[name] = merge_types(fields[name], kind) if name in fields else kind
        return pa.struct(list(fields.items()))
    raise TypeError


def conform(array: pa.Array, kind: pa.DataType) -> pa.Array:
    """`array` as `kind` (a type `merge_types` produced from its own): nulls take the type, lists
    and structs are rebuilt around their conformed children; values are never converted."""
    if array.type == kind:
        return array
    if pa.types.is_null(array.type):
        return pa.nulls(len(array), kind)
    if is_list(array.type) and is_list(kind):
        if pa.types.is_fixed_size_list(kind) and not pa.types.is_fixed_size_list(array.type):
            raise FormatError(f"a {array.type} column cannot hold {kind}")
        array = array.cast(pa.list_(array.type.value_type)) if pa.types.is_fixed_size_list(array.type) and not pa.types.is_fixed_size_list(kind) \
            else array
        mask = array.is_null() if array.null_count else None
        if pa.types.is_fixed_size_list(kind):
            values = array.values.slice(array.offset * kind.list_size, len(array) * kind.list_size)
            return pa.FixedSizeListArray.from_arrays(conform(values, kind.value_type), kind.list_size, mask=mask)
        offsets = array.offsets.to_numpy().astype(np.int64)
        values = conform(array.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0])), kind.value_type)
        cls, width = (pa.LargeListArray, pa.int64()) if pa.types.is_large_list(kind) else (pa.ListArray, pa.int32())
        return cls.from_arrays(pa.array(offsets - offsets[0], width), values, type=kind, mask=mask)
    if pa.types.is_struct(array.type) and pa.types.is_struct(kind):
        names = {array.type.field(i).name for i in range(array.type.num_fields)}
        children = [conform(array.field(kind.field(i).name), kind.field(i).type) if kind.field(i).name in names
                    else pa.nulls(len(array), kind.field(i).type) for i in range(kind.num_fields)]
        return pa.StructArray.from_arrays(children, fields=list(kind), mask=array.is_null() if array.null_count else None)
    raise FormatError(f"a {array.type} column cannot hold {kind}")


def to_ipc(table: pa.Table) -> bytes:
    """A table as Arrow IPC stream bytes: what moves between pipeline steps and into a journal
    (bytes are sized by their length, read back without unpickling anything)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def from_ipc(blob: bytes) -> pa.Table:
    return pa.ipc.open_stream(blob).read_all()

