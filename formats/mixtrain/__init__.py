"""Mixtrain v1.0 as this product writes it (docs/format.md).

Rows are built into Arrow arrays straight from numpy buffers (offsets + flat values), never
through per-element Python lists. Shards are chosen by a stable digest of the sequence_id, and
rows inside a shard are sorted by sequence_id, so the same input gives the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import math
import posixpath
from collections.abc import Iterable
from json.encoder import encode_basestring as _json_string
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from formats import storage
from formats.errors import FormatError
from formats.mixtrain import array_layout
from formats.sequence import (
    FILE,
    SCALAR,
    STEPS,
    TIMESTAMPS,
    TRAJECTORY,
    VIDEO,
    ColumnSpec,
    DatasetMeta,
    Sequence,
    check_unique_columns,
    path_component,
)

__all__ = [
    "VERSION",
    "SIDECAR",
    "STATS_FILE",
    "ERRORS_FILE",
    "QUALITY_FILE",
    "shard_of",
    "shard_path",
    "video_path",
    "file_path",
    "check_output_names",
    "arrow_schema",
    "sequences_to_table",
    "table_to_sequences",
    "write_shard",
    "shard_writer",
    "column_types",
    "column_specs",
    "sidecar",
    "read_sidecar",
]

VERSION = "1.0"
SIDECAR = "mixtrain.json"
STATS_FILE = "stats.json"
# Sequences a run skipped under --on_error=skip: one JSON object per line.
ERRORS_FILE = "_errors.jsonl"
QUALITY_FILE = "_quality.jsonl"  # data-quality findings (formats/mixtrain/quality.py), this converter's extension
# Per-unit fingerprints of what a run converted: what --incremental compares against.
FINGERPRINTS_FILE = "_fingerprints.json"
DATA_DIR = "data"
FILES_DIR = "files"
PARQUET_COMPRESSION = "zstd"


def shard_of(sequence_id: str, num_shards: int) -> int:
    """Stable shard of a sequence: md5 of the UTF-8 id, first 8 bytes big-endian, mod N.

    Must never change between versions: it decides which file a row lands in (TFDS hashing.py).
    """
    digest = hashlib.md5(sequence_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % num_shards


def shard_path(index: int) -> str:
    return f"{DATA_DIR}/part-{index:05d}.parquet"


def video_path(column: str, sequence_id: str, extension: str = "mp4") -> str:
    return _inside_files(column, f"{path_component(sequence_id, 'sequence id')}.{extension}")


def file_path(column: str, sequence_id: str, source_name: str, several: bool) -> str:
    """Where a copied source file goes: files/<column>/<id>.<ext>, or files/<column>/<id>/<name>
    when a row holds several files in that column."""
    if several:
        return _inside_files(column, path_component(sequence_id, "sequence id"), source_name)
    extension = source_name.rsplit(".", 1)[-1] if "." in source_name else "bin"
    return _inside_files(column, f"{path_component(sequence_id, 'sequence id')}.{extension}")


def _inside_files(column: str, *names: str) -> str:
    """files/<column>/<names...>: every part is a name from the data (`path_component`), and the
    joined path is checked once more to stay below files/<column>/ (the one place output file
    paths are made, for every source and table format)."""
    path = "/".join((FILES_DIR, path_component(column, "column"), *(path_component(name, "file name") for name in names)))
    if posixpath.normpath(path) != path or not path.startswith(f"{FILES_DIR}/{column}/"):
        raise FormatError(f"output path {path!r} is not inside {FILES_DIR}/{column}/")
    return path


def check_output_names(columns: list[ColumnSpec], ids: Iterable[str | None], where: str) -> None:
    """Plan time, for every source: the names that will become output paths (video and file
    columns, each planned sequence id or unit id prefix) are refused before any worker runs,
    naming `where` (the source); `video_path` and `file_path` check them again as they are used."""
    check_unique_columns(columns)
    try:
        for spec in columns:
            if spec.kind in (VIDEO, FILE):
                path_component(spec.name, "column")
        for sequence_id in ids:
            if sequence_id is not None:
                path_component(sequence_id, "sequence id")
    except FormatError as error:
        raise FormatError(f"{where}: {error}") from None


def arrow_schema(columns: list[ColumnSpec]) -> pa.Schema:
    return pa.schema([pa.field(spec.name, spec.arrow_type, nullable=spec.name != "sequence_id") for spec in columns])


def _offsets(lengths: list[int]) -> pa.Array:
    return pa.array(np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int32), pa.int32())


def _column_array(spec: ColumnSpec, sequences: list[Sequence]) -> pa.Array:
    lengths = [s.length for s in sequences]
    if spec.kind == TIMESTAMPS:
        values = np.concatenate([s.timestamp for s in sequences]).astype(np.float64, copy=False)
        return pa.ListArray.from_arrays(_offsets(lengths), pa.array(values), type=spec.arrow_type)
    if spec.kind == TRAJECTORY and array_layout.is_bytes(spec.meta):
        return array_layout.encode([s.trajectories[spec.name] for s in sequences], spec.meta["dtype"])
    if spec.kind == TRAJECTORY:
        inner = spec.arrow_type.value_type
        arrays = [s.trajectories[spec.name] for s in sequences]
        values = np.concatenate([a.reshape(-1) for a in arrays]) if arrays else np.zeros(0)
        flat = pa.array(values)
        if flat.type != inner.value_type:
            flat = flat.cast(inner.value_type)
        steps = pa.FixedSizeListArray.from_arrays(flat, inner.list_size)
        return pa.ListArray.from_arrays(_offsets(lengths), steps, type=spec.arrow_type)
    if spec.kind == STEPS:
        value_type = spec.arrow_type.value_type
        chunks, present = [], []
        for s in sequences:
            value = s.steps.get(spec.name)
            present.append(value is not None)  # None: no value for this row (a null cell)
            if value is None:
                continue
            if len(value) != s.length:
                raise ValueError(f"{s.sequence_id}: column {spec.name} has {len(value)} steps, expected {s.length}")
            chunks.append(value if isinstance(value, pa.Array) else pa.array(value, type=value_type))
        flat = pa.concat_arrays(chunks) if chunks else pa.array([], type=value_type)
        cell_lengths = [n if ok else 0 for n, ok in zip(lengths, present)]
        mask = None if all(present) else pa.array([not ok for ok in present])
        return pa.ListArray.from_arrays(_offsets(cell_lengths), flat, type=spec.arrow_type, mask=mask)
    if spec.kind == VIDEO:
        return pa.array([s.videos.get(spec.name) for s in sequences], type=pa.string())
    if spec.kind == FILE:
        return pa.array([s.files.get(spec.name) for s in sequences], type=spec.arrow_type)
    if spec.name == "sequence_id":
        return pa.array([s.sequence_id for s in sequences], type=pa.string())
    return pa.array([_scalar(s, spec) for s in sequences], type=spec.arrow_type)


def _scalar(sequence: Sequence, spec: ColumnSpec) -> Any:
    value = sequence.scalars.get(spec.name)
    return value.item() if isinstance(value, np.generic) else value


def sequences_to_table(sequences: list[Sequence], columns: list[ColumnSpec]) -> pa.Table:
    """Rows in the given order, one per sequence, with the dataset's schema."""
    schema = arrow_schema(columns)
    return pa.Table.from_arrays([_column_array(spec, sequences) for spec in columns], schema=schema)


def table_to_sequences(table: pa.Table, columns: list[ColumnSpec]) -> list[Sequence]:
    """Rows of a published shard back into Sequences (the inverse of `sequences_to_table`): what
    an incremental run reuses without reading the source again. Videos and files keep their
    relative paths."""
    present = [spec for spec in columns if spec.name in table.column_names and spec.name != "sequence_id"]
    arrays = {spec.name: table.column(spec.name).combine_chunks() for spec in present}  # not a chunk lookup per cell
    ids, lengths = table.column("sequence_id").to_pylist(), table.column("length").to_pylist()
    sequences = []
    for row in range(table.num_rows):
        length = int(lengths[row])
        sequence = Sequence(ids[row], length, np.zeros(0))
        for spec in present:
            cell = arrays[spec.name][row]
            if spec.kind == TIMESTAMPS:
                sequence.timestamp = cell.values.to_numpy(zero_copy_only=False).astype(np.float64)
            elif spec.kind == TRAJECTORY and array_layout.is_bytes(spec.meta):
                sequence.trajectories[spec.name] = array_layout.decode(arrays[spec.name], row, spec.meta["dtype"], spec.meta["dim"])
            elif spec.kind == TRAJECTORY:
                values = cell.values.flatten().to_numpy(zero_copy_only=False)
                sequence.trajectories[spec.name] = values.reshape(length, spec.meta["dim"])
            elif spec.kind == STEPS:
                sequence.steps[spec.name] = cell.values if cell.is_valid else None
            elif spec.kind == VIDEO:
                if cell.is_valid:
                    sequence.videos[spec.name] = cell.as_py()
            elif spec.kind == FILE:
                sequence.files[spec.name] = cell.as_py()
            else:
                sequence.scalars[spec.name] = cell.as_py()
        sequences.append(sequence)
    return sequences


# A row group closes at 1,024 sequences or 8 MB of Arrow data, whichever comes first: point reads
# stay cheap, and the writer never holds more than one row group of long sequences.
ROW_GROUP_ROWS = 1024
ROW_GROUP_BYTES = 8 << 20


def shard_writer(handle, schema: pa.Schema, *, row_by_row: bool = False) -> pq.ParquetWriter:
    """The one Parquet configuration of shards (zstd); write row groups with `write_table`.

    `row_by_row`: the page size is checked after every row (write_batch_size 1, which Arrow
    extends to whole rows), which is where the pipeline's tables of 1-row chunks were cut: a
    combined table then gives the same bytes as those chunks did, for 0.74x of their CPU.

    Dictionary encoding only for non-float leaves: on trajectories it made files 1.7x larger,
    writes 10x slower and the writer's memory 3x higher (measured on 20,000 x 64 float32).
    No statistics on binary leaves (`--array_layout=bytes` trajectory cells): min/max of raw
    values mean nothing, and Parquet would store two whole cells per page (2-3x the file size).
    """
    leaves = _leaves(schema)
    return pq.ParquetWriter(handle, schema, compression=PARQUET_COMPRESSION,
                            use_dictionary=[path for path, kind in leaves if not (pa.types.is_floating(kind) or pa.types.is_binary(kind))],
                            write_statistics=[path for path, kind in leaves if not pa.types.is_binary(kind)],
                            **({"write_batch_size": 1} if row_by_row else {}))


def _leaves(schema: pa.Schema) -> list[tuple[str, pa.DataType]]:
    """Every Parquet leaf path ("a.list.element", "s.field") with its Arrow type."""
    leaves: list[tuple[str, pa.DataType]] = []

    def walk(path: str, kind: pa.DataType) -> None:
        if pa.types.is_struct(kind):
            for index in range(kind.num_fields):
                walk(f"{path}.{kind.field(index).name}", kind.field(index).type)
        elif pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
            walk(f"{path}.list.element", kind.value_type)
        elif pa.types.is_map(kind):
            walk(f"{path}.key_value.key", kind.key_type)
            walk(f"{path}.key_value.value", kind.item_type)
        else:
            leaves.append((path, kind))

    for field in schema:
        walk(field.name, field.type)
    return leaves


def write_shard(table: pa.Table, handle) -> None:
    """A whole table as one shard (empty shards, tests); the pipeline streams row groups instead."""
    with shard_writer(handle, table.schema) as writer:
        writer.write_table(table, row_group_size=ROW_GROUP_ROWS)


def column_types(columns: list[ColumnSpec]) -> dict[str, dict]:
    """mixtrain.json `column_types`: every non-scalar column, and scalars that declare a type (json...)."""
    types: dict[str, dict] = {}
    for spec in columns:
        if spec.kind == SCALAR and "type" not in spec.meta:
            continue
        kind = {TIMESTAMPS: "timestamps", TRAJECTORY: "trajectory", VIDEO: "video", STEPS: "steps", FILE: "file",
                SCALAR: "scalar"}[spec.kind]
        entry = {"type": kind, **spec.meta}
        if spec.kind == FILE:
            entry["file_reference"] = True  # paths relative to the dataset root
        if spec.kind == STEPS and entry["type"] == "steps":
            entry.setdefault("dtype", str(spec.arrow_type.value_type))
        types[spec.name] = entry
    return types


def column_specs(schema: pa.Schema, types: dict[str, dict]) -> list[ColumnSpec]:
    """The columns of written rows as `column_types` and the shard schema describe them (what a
    checker needs to recompute statistics the way the writer did); per-step kinds other than
    timestamps and trajectories (agents, flags...) are steps, anything else a scalar."""
    kinds = {"timestamps": TIMESTAMPS, "trajectory": TRAJECTORY, "steps": STEPS, "video": VIDEO, "file": FILE}
    specs = []
    for field in schema:
        entry = types.get(field.name) or {}
        kind = kinds.get(entry.get("type"), SCALAR)
        if entry.get("file_reference"):
            kind = FILE
        elif kind == SCALAR and entry and pa.types.is_list(field.type):
            kind = STEPS
        specs.append(ColumnSpec(field.name, kind, field.type, {key: value for key, value in entry.items() if key != "type"}))
    return specs


def sidecar(meta: DatasetMeta, *, num_sequences: int, num_timesteps: int, num_shards: int,
            converter_version: str, options: dict, created_at: str, num_skipped: int = 0,
            non_finite: dict | None = None, incremental: dict | None = None, video_notes: dict | None = None,
            skipped_units: int = 0, quality: bool = False) -> dict:
    value = {
        "mixtrain": VERSION,
        "column_types": _with_video_notes(column_types(meta.columns), video_notes or {}),
        "source": _jsonable(meta.source),
        "num_sequences": num_sequences,
        "num_timesteps": num_timesteps,
        "num_shards": num_shards,
        "shards": [shard_path(i) for i in range(num_shards)],
        "stats": STATS_FILE,
        "converter": {"name": "mixtrain-convert", "version": converter_version, "options": options},
        "created_at": created_at,
    }
    if non_finite:
        value["non_finite_values"] = non_finite  # NaN/inf kept in these columns, counted
    if incremental:
        value["incremental"] = incremental  # what an --incremental run reused and converted
    if num_skipped:
        value["num_skipped"] = num_skipped
    if skipped_units:  # source units skipped whole whose sequence count is unknown (not in num_skipped)
        value["num_skipped_units"] = skipped_units
    if num_skipped or skipped_units:
        value["errors"] = ERRORS_FILE
    if quality:
        value["quality"] = QUALITY_FILE  # the data-quality findings of this run's pass
    return value


def _with_video_notes(types: dict[str, dict], notes: dict[str, dict]) -> dict[str, dict]:
    """A copied column some of whose files are not packet copies says so, and names them: `written_as`
    becomes "copy+lossless" when each of them is a lossless encode (every file still decodes to the
    source's pixels), "copy+retime" when some episode had to be re-timed through a near-lossless
    encode; `not_copied` maps each such sequence_id to how its file was written and why. An encoded
    column some of whose segments needed a lower crf to keep the luma PSNR floor names them in
    `crf_lowered`, with the crf used and why."""
    for column, by_sequence in sorted(notes.items()):
        entry = types.get(column)
        if entry is None or not by_sequence:
            continue
        if entry.get("written_as") == "copy":
            lossy = any(note.get("written_as") != "lossless" for note in by_sequence.values())
            entry["written_as"] = "copy+retime" if lossy else "copy+lossless"
            entry["lossless"] = not lossy
        entry["crf_lowered" if entry.get("written_as") == "encode" else "not_copied"] = dict(sorted(by_sequence.items()))
    return types


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def dumps(value: dict) -> str:
    """JSON text; NaN and infinities (stats of columns that hold them) become null, as JSON has none.

    The text of `json.dumps(indent=2, ensure_ascii=False)`, written by `_indented`: with an indent
    the json module leaves its C encoder for a Python one, 90 ms for the 20,000 units of a
    _fingerprints.json (4.5 s at a million, in the run's serial tail). Anything it does not
    know (a key that is not a string, a type JSON has no word for) goes to the json module."""
    out: list[str] = []
    try:
        _indented(value, "\n", out)
        return "".join(out) + "\n"
    except Exception:  # noqa: BLE001, S110 - the json module says what is wrong, as it did before
        pass
    return json.dumps(_finite(value), indent=2, sort_keys=False, ensure_ascii=False, allow_nan=False) + "\n"


class _NotPlain(Exception):
    pass


def _indented(value: Any, newline: str, out: list[str]) -> None:
    """`value` as json.dumps(indent=2) writes it at the depth whose line break is `newline`."""
    if isinstance(value, str):
        out.append(_json_string(value))
    elif value is None or value is True or value is False:
        out.append("null" if value is None else "true" if value else "false")
    elif isinstance(value, int):
        out.append(int.__repr__(value))
    elif isinstance(value, float):
        if not math.isfinite(value):
            out.append("null")
        elif value != value or value == math.inf or value == -math.inf:  # the json module's own test: a subclass may differ
            raise _NotPlain
        else:
            out.append(float.__repr__(value))
    elif isinstance(value, dict):
        items = list(value.items())  # what _finite's copy would hold
        if not items:
            out.append("{}")
            return
        inner, separator = newline + "  ", "{"
        for key, item in items:
            if not isinstance(key, str):
                raise _NotPlain
            out.append(separator + inner + _json_string(key) + ": ")
            separator = ","
            _indented(item, inner, out)
        out.append(newline + "}")
    elif isinstance(value, (list, tuple)):
        items = list(value)
        if not items:
            out.append("[]")
            return
        inner, separator = newline + "  ", "["
        for item in items:
            out.append(separator + inner)
            separator = ","
            _indented(item, inner, out)
        out.append(newline + "]")
    else:
        raise _NotPlain


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def read_sidecar(fs, root: str) -> dict:
    with storage.open_input(fs, f"{root}/{SIDECAR}") as handle:
        return json.load(handle)
