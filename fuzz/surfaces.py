"""A dataset on disk whose metadata files the fuzzer rewrites, one input at a time.

`Surface(root, files)` keeps the original bytes of each named file (JSON, JSON lines or a Parquet
index). An input picks a file and a mode: raw (the rest of the input is the file) or structured
(jsonmut's edits of the real document, or `mutate_table`'s edits of the real rows: a cell null or
hostile, a column retyped, dropped or renamed, rows repeated or removed). `apply` writes the
mutated file; `restore` puts the original back.
"""

from __future__ import annotations

import io
import json
import os
from typing import Any

import atheris
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from fuzz import jsonmut

_INT_HOSTILE = [-1, 0, 1, 2**31 - 1, 2**31, 2**53 + 1, 2**63 - 1, -(2**63)]
_FLOAT_HOSTILE = [float("nan"), float("inf"), -float("inf"), -0.0, 1e308, -1e-308, 0.5]
_STR_HOSTILE = ["", "\x00", "\x1b[2J", "\u202e\u2028", "../../x", "/etc/passwd", "{x}", "a" * 300]


def _hostile_for(kind: pa.DataType, fdp: atheris.FuzzedDataProvider, current: Any) -> Any:
    if pa.types.is_integer(kind):
        return _INT_HOSTILE[fdp.ConsumeIntInRange(0, len(_INT_HOSTILE) - 1)]
    if pa.types.is_floating(kind):
        return _FLOAT_HOSTILE[fdp.ConsumeIntInRange(0, len(_FLOAT_HOSTILE) - 1)]
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return _STR_HOSTILE[fdp.ConsumeIntInRange(0, len(_STR_HOSTILE) - 1)]
    if pa.types.is_boolean(kind):
        return not current
    if isinstance(current, list):
        return current[: fdp.ConsumeIntInRange(0, len(current))] + current[: fdp.ConsumeIntInRange(0, 2)]
    if isinstance(current, dict):
        return jsonmut.to_python(jsonmut.mutate(current, fdp, 1))
    return None


def mutate_table(table: pa.Table, fdp: atheris.FuzzedDataProvider) -> pa.Table | None:
    """A few edits of an index table; None when the edits make no table Arrow can write."""
    try:
        for _ in range(fdp.ConsumeIntInRange(1, 3)):
            if not table.num_columns:
                return table
            index = fdp.ConsumeIntInRange(0, table.num_columns - 1)
            field = table.schema.field(index)
            column = table.column(index)
            op = fdp.ConsumeIntInRange(0, 7)
            if op <= 2 and table.num_rows:  # one cell: null or hostile
                values = column.to_pylist()
                row = fdp.ConsumeIntInRange(0, len(values) - 1)
                values[row] = None if op == 0 else _hostile_for(field.type, fdp, values[row])
                table = table.set_column(index, field.with_nullable(True), pa.array(values, field.type))
            elif op == 3:  # retyped
                target = [pa.string(), pa.float64(), pa.int32(), pa.int64(), pa.uint64(), pa.float32()][fdp.ConsumeIntInRange(0, 5)]
                table = table.set_column(index, field.with_type(target), pc.cast(column, target, safe=False))
            elif op == 4:
                table = table.remove_column(index)
            elif op == 5:
                names = table.column_names
                names[index] = fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 16))
                table = table.rename_columns(names)
            elif op == 6 and table.num_rows:  # rows repeated, reversed, or cut
                rows = list(range(table.num_rows))
                choice = fdp.ConsumeIntInRange(0, 2)
                rows = rows + rows[:1] if choice == 0 else rows[::-1] if choice == 1 else rows[: fdp.ConsumeIntInRange(0, len(rows) - 1)]
                table = table.take(pa.array(rows, pa.int64()))
            else:  # rows as Python values, edited as JSON
                rows = jsonmut.to_python(jsonmut.mutate(table.to_pylist(), fdp, 2))
                table = pa.Table.from_pylist([r for r in rows if isinstance(r, dict)]) if isinstance(rows, list) else table
        return table
    except (pa.ArrowException, ValueError, TypeError, OverflowError):
        return None


class Surface:
    """Metadata files of one dataset folder, rewritten per input and restored after."""

    def __init__(self, root: str, files: list[str]) -> None:
        self.root, self.files = root, files
        self.originals = {name: open(os.path.join(root, name), "rb").read() for name in files}

    def seeds(self) -> list[bytes]:
        """Raw-mode seeds: each original file as it is (structured inputs grow from any bytes)."""
        return [bytes([number, 0]) + self.originals[name] for number, name in enumerate(self.files)]

    def mutated(self, data: bytes) -> tuple[str, bytes] | None:
        """(file, new bytes) the input asks for; None for inputs that make no file."""
        if len(data) < 2:
            return None
        name = self.files[data[0] % len(self.files)]
        original = self.originals[name]
        if name.endswith(".parquet"):
            fdp = atheris.FuzzedDataProvider(data[1:])
            table = mutate_table(pq.read_table(io.BytesIO(original)), fdp)
            if table is None:
                return None
            out = io.BytesIO()
            try:
                pq.write_table(table, out)
            except (pa.ArrowException, ValueError, TypeError):
                return None
            return name, out.getvalue()
        if data[1] % 2 == 0:
            return name, data[2:]
        fdp = atheris.FuzzedDataProvider(data[2:])
        if name.endswith(".jsonl"):
            lines = [json.loads(line) for line in original.decode().splitlines() if line.strip()]
            if not lines:
                lines = [{}]
            edited = jsonmut.mutate(lines, fdp)
            if not isinstance(edited, list):
                return name, jsonmut.dumps(edited)
            return name, b"\n".join(jsonmut.dumps(line) for line in edited) + b"\n"
        return name, jsonmut.dumps(jsonmut.mutate(json.loads(original), fdp))

    def apply(self, name: str, content: bytes) -> None:
        with open(os.path.join(self.root, name), "wb") as handle:
            handle.write(content)

    def restore(self, name: str) -> None:
        self.apply(name, self.originals[name])
