"""Check a Mixtrain dataset against the contract this product writes.

    python -m pipelines.validate DST

Checks: mixtrain.json present and well-formed; every shard's schema matches column_types;
sequence_ids unique across shards; T consistent across `length`, timestamps, trajectories and
per-step columns; every referenced file exists and holds T frames; counts match the sidecar.
Exit status 0 when clean, 1 with one finding per line otherwise.
"""

from __future__ import annotations

import json
import sys

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from formats import mixtrain, storage, video
from formats.errors import ConversionError

__all__ = ["validate", "main"]


def _expected_type(entry: dict) -> pa.DataType | None:
    kind = entry.get("type")
    if kind == "timestamps":
        return pa.list_(pa.float64())
    if kind == "trajectory":
        return pa.list_(pa.list_(pa.from_numpy_dtype(entry["dtype"]), int(entry["dim"])))
    if kind == "video":
        return pa.string()
    return None


def validate(url: str) -> list[str]:
    """Return the findings (empty when the dataset is valid)."""
    fs, root = storage.open_root(url)
    sidecar_path = storage.join(root, mixtrain.SIDECAR)
    if not fs.exists(sidecar_path):
        return [f"{sidecar_path}: missing (not a finished Mixtrain dataset)"]
    try:
        sidecar = json.loads(fs.cat_file(sidecar_path))
    except json.JSONDecodeError as error:
        return [f"{sidecar_path}: malformed JSON: {error}"]
    findings: list[str] = []
    if not isinstance(sidecar, dict) or sidecar.get("mixtrain") != mixtrain.VERSION:
        return [f"{sidecar_path}: 'mixtrain' must be {mixtrain.VERSION!r}"]
    column_types = sidecar.get("column_types", {})
    if not isinstance(column_types, dict):
        return [f"{sidecar_path}: column_types must be an object"]
    shards = sidecar.get("shards") or sorted(
        p[len(root) + 1:] for p in fs.glob(storage.join(root, mixtrain.DATA_DIR, "*.parquet"))
    )
    if not shards:
        findings.append(f"{root}: no data shards")
    seen_ids: dict[str, str] = {}
    sequences = timesteps = 0
    for shard in shards:
        path = storage.join(root, shard)
        if not fs.exists(path):
            findings.append(f"{path}: listed in mixtrain.json but missing")
            continue
        with fs.open(path, "rb") as handle:
            table = pq.read_table(handle)
        findings += _check_schema(path, table.schema, column_types)
        if "sequence_id" not in table.column_names:
            continue
        for sequence_id in table.column("sequence_id").to_pylist():
            if sequence_id in seen_ids:
                findings.append(f"{path}: sequence_id {sequence_id!r} also in {seen_ids[sequence_id]}")
            seen_ids[sequence_id] = shard
        sequences += table.num_rows
        findings += _check_lengths(path, table, column_types)
        findings += _check_files(fs, root, path, table, column_types)
        if "length" in table.column_names:
            timesteps += pc.sum(table.column("length")).as_py() or 0
    if sidecar.get("num_sequences") not in (None, sequences):
        findings.append(f"{sidecar_path}: num_sequences {sidecar['num_sequences']} but the shards hold {sequences}")
    if sidecar.get("num_timesteps") not in (None, timesteps):
        findings.append(f"{sidecar_path}: num_timesteps {sidecar['num_timesteps']} but the shards hold {timesteps}")
    stats = sidecar.get("stats")
    if stats and not fs.exists(storage.join(root, stats)):
        findings.append(f"{storage.join(root, stats)}: named in mixtrain.json but missing")
    return findings


def _check_schema(path: str, schema: pa.Schema, column_types: dict) -> list[str]:
    findings = []
    if schema.names[:1] != ["sequence_id"]:
        findings.append(f"{path}: first column must be sequence_id, found {schema.names[:1]}")
    for name, entry in column_types.items():
        if schema.get_field_index(name) < 0:
            findings.append(f"{path}: column {name!r} is in column_types but not in the shard")
            continue
        expected = _expected_type(entry)
        actual = schema.field(name).type
        if expected is not None and actual != expected:
            findings.append(f"{path}: column {name!r} is {actual}, column_types says {expected}")
        if entry.get("type") == "steps" and not pa.types.is_list(actual):
            findings.append(f"{path}: per-step column {name!r} is {actual}, expected a list")
    return findings


def _check_lengths(path: str, table: pa.Table, column_types: dict) -> list[str]:
    findings = []
    if "length" not in table.column_names:
        return [f"{path}: no length column"]
    lengths = table.column("length").combine_chunks()
    for name, entry in column_types.items():
        if entry.get("type") not in ("timestamps", "trajectory", "steps") or name not in table.column_names:
            continue
        cells = pc.list_value_length(table.column(name).combine_chunks())
        mismatch = pc.not_equal(cells, lengths)
        if pc.any(mismatch).as_py():
            row = pc.index(mismatch, True).as_py()
            sequence_id = table.column("sequence_id")[row].as_py()
            findings.append(f"{path}: {sequence_id}: column {name!r} has {cells[row].as_py()} steps, length is {lengths[row].as_py()}")
    return findings


def _check_files(fs, root: str, path: str, table: pa.Table, column_types: dict) -> list[str]:
    findings = []
    for name, entry in column_types.items():
        if entry.get("type") != "video" or name not in table.column_names:
            continue
        for sequence_id, relative, length in zip(table.column("sequence_id").to_pylist(),
                                                 table.column(name).to_pylist(), table.column("length").to_pylist()):
            if relative is None:
                continue
            file_path = relative if "://" in relative else storage.join(root, relative)
            if not fs.exists(file_path):
                findings.append(f"{path}: {sequence_id}: {name} file {relative} is missing")
                continue
            try:
                with fs.open(file_path, "rb") as handle:
                    frames = video.probe(handle).frames
            except ConversionError as error:
                findings.append(f"{file_path}: {sequence_id}: {error}")
                continue
            if frames != length:
                findings.append(f"{file_path}: {sequence_id}: {frames} frames, length is {length}")
    return findings


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: python -m pipelines.validate DST", file=sys.stderr)
        return 2
    findings = validate(args[0])
    for finding in findings:
        print(finding)
    if findings:
        print(f"{len(findings)} finding(s): {args[0]} is not a valid Mixtrain dataset", file=sys.stderr)
        return 1
    print(f"ok: {args[0]} is a valid Mixtrain dataset")
    return 0


if __name__ == "__main__":
    sys.exit(main())
