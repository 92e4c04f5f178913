"""Delta Lake tables (deltalake / delta-rs): DST is the table root, each run one WRITE commit.

The run's shards are added as they were written (AddAction: no rewrite), replaced shards removed
(RemoveAction), unchanged ones kept, in one commit whose commit info carries the `mixtrain` JSON
and the run id. The table property `mixtrain` is set right after, in a second commit: delta-rs
refuses a property outside `delta.` at table creation and its write transactions carry no
configuration. A reader that needs the metadata of exactly one version reads it from that
version's commit info (docs/lake.md); the property is always the newest run's.

Delta has no unsigned integers: such columns are declared one size wider (uint8 -> short ...),
so values read back exactly; uint64 as long, after every value was seen to fit (else refused).
"""

from __future__ import annotations

import json
import posixpath
import time

import pyarrow as pa
import pyarrow.parquet as pq

from formats import storage
from formats.errors import ConversionError
from formats.tables import TableSettings, lake

__all__ = ["publish", "open_table", "current_state", "current_property", "describe", "table_schema", "committed_files"]

OUTPUT_ENTRIES = {"_delta_log"}
# uint64 -> int64 once `lake.check_unsigned` has seen every value fit.
_WIDER = {pa.uint8(): pa.int16(), pa.uint16(): pa.int32(), pa.uint32(): pa.int64(), pa.uint64(): pa.int64()}


def open_table(output_url: str, catalog: str = "", table: str = ""):
    """The Delta table at the output, or None when there is none yet."""
    from deltalake import DeltaTable

    fs, root = storage.open_root(output_url)
    if not fs.exists(storage.join(root, "_delta_log")):
        return None
    return DeltaTable(output_url)


def current_state(output_url: str, catalog: str = "", table: str = "") -> str:
    found = open_table(output_url)
    return str(found.version()) if found is not None else ""


def current_property(output_url: str, settings: TableSettings) -> dict | None:
    found = open_table(output_url)
    if found is None:
        return None
    text = found.metadata().configuration.get(lake.PROPERTY)
    return json.loads(text) if text else None


def describe(output_url: str, settings: TableSettings) -> str:
    found = open_table(output_url)
    return f"Delta table, version {found.version() if found is not None else None} (deltalake: DeltaTable({output_url!r}))"


def committed_files(table) -> list[str]:
    """Paths (relative to the table root) of the data files of the loaded version."""
    return [str(path) for path in table.get_add_actions(flatten=True).column("path").to_pylist()]


def _widened(kind: pa.DataType) -> pa.DataType:
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return pa.list_(pa.field(kind.value_field.name, _widened(kind.value_type), kind.value_field.nullable))
    if pa.types.is_struct(kind):
        return pa.struct([pa.field(f.name, _widened(f.type), f.nullable) for f in kind])
    return _WIDER.get(kind, kind)


def table_schema(schema: pa.Schema) -> pa.Schema:
    """The Delta schema of the shards' Arrow schema: lists for fixed-size lists, unsigned widened."""
    return pa.schema([pa.field(field.name, _widened(field.type), field.nullable) for field in schema])


def _check_schema(current: pa.Schema, new: pa.Schema, output_url: str) -> None:
    for field in new:
        index = current.get_field_index(field.name)
        if index >= 0 and not current.field(index).type.equals(field.type):
            raise ConversionError(f"{output_url}: column {field.name} changed type from {current.field(index).type} to {field.type}; "
                                  "a table keeps its column types (convert to a new --output, or rename the column at the source)")


def publish(fs, staging: str, output: str, sidecar: dict, settings: TableSettings) -> None:
    """Commit the staged run (already in its final place, DST/runs/<run>) as the table's next version."""
    from deltalake import DeltaTable
    from deltalake.exceptions import CommitFailedError
    from deltalake.transaction import AddAction, CommitProperties, RemoveAction

    output_url = storage.url_for(fs, output)
    shards = lake.staged_shards(fs, staging, sidecar)
    untyped = lake.concrete_shards(fs, shards)
    value = lake.property_value(sidecar, settings.run_id, "delta", untyped)
    lake.write_run_metadata(fs, staging, value, sidecar)
    file_schema = pq.read_schema(fs.open(shards[0], "rb"))
    lake.check_unsigned(fs, shards, file_schema)
    schema = table_schema(file_schema)
    table = open_table(output_url)
    if table is None:
        if settings.base:
            raise ConversionError(f"{output_url}: the Delta table this run started from is gone; nothing was committed")
        table = DeltaTable.create(output_url, schema=schema)
    elif str(table.version()) != settings.base:
        raise ConversionError(f"{output_url}: another writer committed version {table.version()} after this run started; "
                              "nothing was committed (rerun to convert against it)")
    current_schema = pa.schema(table.schema().to_arrow())
    _check_schema(current_schema, schema, output_url)
    added = [field for field in schema if current_schema.get_field_index(field.name) < 0]
    if added:  # a new feature: a nullable column, null in the rows of earlier versions (its own commit)
        from deltalake import Field

        table.alter.add_columns([Field.from_arrow(field.with_nullable(True)) for field in added])
        table = open_table(output_url)
    merged = pa.schema(list(current_schema) + added)
    committed = {posixpath.basename(path): path for path in committed_files(table)} if settings.base else {}
    actions, kept = [], set()
    now = int(time.time() * 1000)
    for shard in shards:
        name = posixpath.basename(shard)
        previous = committed.get(name)
        if previous is not None and lake.same_file(fs, storage.join(output, previous), shard):
            kept.add(previous)
            continue
        relative = shard[len(output) + 1:]
        rows = pq.ParquetFile(fs.open(shard, "rb")).metadata.num_rows
        actions.append(AddAction(relative, fs.size(shard), {}, now, True, json.dumps({"numRecords": rows})))
    for path in committed.values():
        if path not in kept:
            actions.append(RemoveAction(path, True, now, fs.size(storage.join(output, path)), {}))
    info = {lake.SNAPSHOT_RUN: settings.run_id, lake.PROPERTY: lake.dumps(value)}
    try:
        table.create_write_transaction(actions, mode="append", schema=merged,
                                       commit_properties=CommitProperties(custom_metadata=info, max_commit_retries=0))
    except CommitFailedError as error:
        raise ConversionError(f"{output_url}: another writer committed to the table during this run's commit; nothing was "
                              f"committed ({error})") from error
    # The property follows the data (delta-rs retries a conflicting commit of it itself); if it
    # fails, the data version stands, its commit info holds the metadata, and the run folder stays.
    DeltaTable(output_url).alter.set_table_properties({lake.PROPERTY: lake.dumps(value)}, raise_if_not_exists=False)


def read_rows(output_url: str, settings: TableSettings, version: str | None = None) -> pa.Table:
    from deltalake import DeltaTable

    return DeltaTable(output_url, version=int(version) if version else None).to_pyarrow_table()


def versions(output_url: str, settings: TableSettings) -> list[dict]:
    """The WRITE commits (each followed by the commit setting the property: that version is the run's)."""
    found = open_table(output_url)
    if found is None:
        return []
    writes = [entry for entry in found.history() if entry.get(lake.SNAPSHOT_RUN)]
    return [{"version": str(entry["version"] + 1), "run": entry[lake.SNAPSHOT_RUN], "timestamp_ms": entry["timestamp"]}
            for entry in sorted(writes, key=lambda e: e["version"])]


def rollback(output_url: str, settings: TableSettings, version: str, property_text: str) -> None:
    """Delta's RESTORE to that version, then the property of its run (a second commit)."""
    found = open_table(output_url)
    found.restore(int(version))
    open_table(output_url).alter.set_table_properties({lake.PROPERTY: property_text}, raise_if_not_exists=False)
