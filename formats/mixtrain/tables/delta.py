"""Delta Lake tables: DST is the table root, each run ONE commit (one `_delta_log` entry).

The run's shards are added as they were written (no rewrite), replaced shards removed, unchanged
ones kept, in one log entry that also carries the metadata (the `mixtrain` property, a new
column) and, in its commit info, the run id and the same JSON. The entry is written here, put-if-absent
as the Delta protocol commits: delta-rs's write transaction carries no table configuration, and
setting the property in a second commit left a window where a reader saw new rows under the
previous run's property. Reading (and RESTORE) goes through deltalake (delta-rs) as before.

Delta has no unsigned integers: such columns are declared one size wider (uint8 -> short ...),
so values read back exactly; uint64 as long, after every value was seen to fit (else refused).
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import re
import time
import uuid

import pyarrow as pa
import pyarrow.parquet as pq

from formats import storage
from formats.errors import ConversionError, FormatError
from formats.mixtrain.publish import stop_point
from formats.mixtrain.tables import TableSettings, lake

__all__ = ["publish", "open_table", "current_state", "current_property", "describe", "table_schema", "committed_files"]

LOG_DIR = "_delta_log"
OUTPUT_ENTRIES = {LOG_DIR}
CHECKPOINT_INTERVAL = 100  # delta.checkpointInterval's default
# uint64 -> int64 once `lake.check_unsigned` has seen every value fit.
_WIDER = {pa.uint8(): pa.int16(), pa.uint16(): pa.int32(), pa.uint32(): pa.int64(), pa.uint64(): pa.int64()}


def open_table(output_url: str, catalog: str = "", table: str = ""):
    """The Delta table at the output, or None when there is none yet."""
    fs, root = storage.open_root(output_url)
    if not fs.exists(storage.join(root, LOG_DIR)):
        return None
    _check_newest_entry(fs, storage.join(root, LOG_DIR))
    return _load(output_url)


def _load(output_url: str, version: int | None = None):
    """DeltaTable(output_url, version), a log that cannot be replayed (an entry cut short or
    deleted, every entry gone) one FormatError naming the log: delta-rs raises DeltaError whose
    text carries a Rust backtrace when RUST_BACKTRACE is set."""
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError

    try:
        return DeltaTable(output_url, version=version, storage_options=storage.object_store_options(output_url) or None)
    except (DeltaError, OSError) as error:
        fs, root = storage.open_root(output_url)
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        at = "" if version is None else f" at version {version}"
        raise FormatError(f"{storage.join(root, LOG_DIR)}: the Delta log cannot be read{at} ({reason}); "
                          "restore the missing or damaged log entries from a backup") from None


def _check_newest_entry(fs, log: str) -> None:
    """The newest commit of the log must be whole (commits are written put-if-absent, complete):
    an emptied or cut one would otherwise read as a commit without actions, its run silently lost."""
    entries = sorted(path for path in fs.glob(storage.join(log, "*.json"))  # a "²" is a digit to isdigit: not an entry's
                     if posixpath.basename(path)[:20].isascii() and posixpath.basename(path)[:20].isdigit())
    if not entries:
        return
    text = fs.cat_file(entries[-1])
    try:
        whole = bool(text.strip()) and all(isinstance(json.loads(line), dict) for line in text.splitlines() if line.strip())
    except ValueError:
        whole = False
    if not whole:
        raise FormatError(f"{log}: the Delta log cannot be read (its newest entry {posixpath.basename(entries[-1])} is cut: "
                          f"{len(text)} bytes); nothing was changed: restore it from a backup (or, if its commit never completed, "
                          "remove it)")


def lost_table(fs, output: str, output_url: str, settings: TableSettings, runs: list[str]) -> str:
    """The refusal for committed runs without a _delta_log (deleted): nothing can rebuild it."""
    return (f"{storage.join(output, LOG_DIR)}: not found, but {len(runs)} committed run(s) are in the table (latest {runs[-1]}); "
            "nothing was converted (a new table would orphan them): restore _delta_log from a backup, or choose another --output")


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
    options = storage.object_store_options(output_url)  # what the reader must pass too (an S3-compatible store's endpoint)
    if "aws_endpoint" in options:  # printed: never a user or password written into the endpoint's URL
        options = {**options, "aws_endpoint": re.sub(r"//[^/@]*@", "//", options["aws_endpoint"])}
    how = f"DeltaTable({output_url!r}" + (f", storage_options={options!r})" if options else ")")
    return f"Delta table, version {found.version() if found is not None else None} (deltalake: {how})"


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


def _schema_json(table, schema: pa.Schema, added: list[pa.Field]) -> str:
    """The Delta schemaString: a new table's from the Arrow schema; an existing table's own, new
    columns (nullable: older rows read null) appended."""
    from deltalake import Schema

    if table is None:
        return Schema.from_arrow(schema).to_json()
    current = json.loads(table.schema().to_json())
    current["fields"] += json.loads(Schema.from_arrow(pa.schema([field.with_nullable(True) for field in added])).to_json())["fields"]
    return json.dumps(current, separators=(",", ":"))


def _metadata_action(table, schema_string: str, property_text: str, now: int) -> dict:
    """The metaData action of the commit: the table's own (id, partitioning, configuration) with
    the new schema and the `mixtrain` property; a fresh one for a new table."""
    if table is None:
        identity, name, description, partitions, created, configuration = str(uuid.uuid4()), None, None, [], now, {}
    else:
        found = table.metadata()
        identity, name, description = found.id, found.name, found.description
        partitions, created, configuration = list(found.partition_columns), found.created_time, dict(found.configuration)
    return {"id": identity, "name": name, "description": description, "format": {"provider": "parquet", "options": {}},
            "schemaString": schema_string, "partitionColumns": partitions, "createdTime": created,
            "configuration": {**configuration, lake.PROPERTY: property_text}}


def _put_if_absent(fs, path: str, data: bytes) -> bool:
    """Write `path` only if it does not exist, atomically (the Delta log's commit rule): a hard
    link of a fully written temporary file on a local disk, a create-only write elsewhere.
    False when the entry exists (another writer took this version)."""
    if storage.is_local(fs):
        temporary = f"{posixpath.dirname(path)}/.tmp-{uuid.uuid4().hex}.json"
        with open(temporary, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(temporary, path)
        except FileExistsError:
            return False
        finally:
            os.unlink(temporary)
        return True
    if fs.exists(path):
        return False
    try:
        fs.pipe_file(path, data, mode="create")
    except FileExistsError:
        return False
    return True


def publish(fs, staging: str, output: str, sidecar: dict, settings: TableSettings) -> None:
    """Commit the staged run (already in its final place, DST/runs/<run>) as the table's next
    version: ONE log entry `_delta_log/<version>.json` (put-if-absent, as the Delta protocol
    commits) holding the commit info, the metadata with the `mixtrain` property and the new
    schema, and the files added and removed. delta-rs cannot do this in one commit (its write
    transaction carries no configuration), so the entry is written here."""
    output_url = storage.url_for(fs, output)
    shards = lake.staged_shards(fs, staging, sidecar)
    untyped = lake.concrete_shards(fs, shards)
    value = lake.property_value(sidecar, settings.run_id, "delta", untyped)
    lake.write_run_metadata(fs, staging, value, sidecar)
    stop_point("delta", "run-metadata-written")
    file_schema = pq.read_schema(fs.open(shards[0], "rb"))
    lake.check_unsigned(fs, shards, file_schema)
    schema = table_schema(file_schema)
    table = open_table(output_url)
    if table is None and settings.base:
        raise ConversionError(f"{output_url}: the Delta table this run started from is gone; nothing was committed")
    if table is not None and str(table.version()) != settings.base:
        raise ConversionError(f"{output_url}: another writer committed version {table.version()} after this run started; "
                              "nothing was committed (rerun to convert against it)")
    added = list(schema)
    if table is not None:
        current_schema = pa.schema(table.schema().to_arrow())
        _check_schema(current_schema, schema, output_url)
        added = [field for field in schema if current_schema.get_field_index(field.name) < 0]
    committed = {posixpath.basename(path): path for path in committed_files(table)} if table is not None else {}
    now = int(time.time() * 1000)
    actions, kept = [], set()
    for shard in shards:
        name = posixpath.basename(shard)
        previous = committed.get(name)
        if previous is not None and lake.same_file(fs, storage.join(output, previous), shard):
            kept.add(previous)
            continue
        rows = pq.ParquetFile(fs.open(shard, "rb")).metadata.num_rows
        actions.append({"add": {"path": shard[len(output) + 1:], "partitionValues": {}, "size": fs.size(shard), "modificationTime": now,
                                "dataChange": True, "stats": json.dumps({"numRecords": rows})}})
    for path in committed.values():
        if path not in kept:
            actions.append({"remove": {"path": path, "deletionTimestamp": now, "dataChange": True, "extendedFileMetadata": True,
                                       "partitionValues": {}, "size": fs.size(storage.join(output, path))}})
    property_text = lake.dumps(value)
    info = {"timestamp": now, "operation": "WRITE", "operationParameters": {"mode": "Append", "partitionBy": "[]"},
            "engineInfo": "mixtrain-convert", lake.SNAPSHOT_RUN: settings.run_id, lake.PROPERTY: property_text}
    entries = [{"commitInfo": info}]
    if table is None:
        entries.append({"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}})
    entries.append({"metaData": _metadata_action(table, _schema_json(table, schema, added if table is not None else []),
                                                 property_text, now)})
    _commit(fs, output, output_url, 0 if table is None else table.version() + 1, entries + actions)
    stop_point("delta", "committed")
    lake.end_run(fs, staging)


def _commit(fs, output: str, output_url: str, version: str | int, entries: list[dict]) -> None:
    """Write the log entry of `version` (one JSON action a line), refused if another writer took it."""
    version = int(version)
    log = storage.join(output, LOG_DIR)
    fs.makedirs(log, exist_ok=True)
    data = "".join(json.dumps(entry, separators=(",", ":")) + "\n" for entry in entries).encode()
    if not _put_if_absent(fs, storage.join(log, f"{version:020d}.json"), data):
        raise ConversionError(f"{output_url}: another writer committed version {version} during this run's commit; nothing was "
                              "committed (rerun to convert against it)")
    if version and version % CHECKPOINT_INTERVAL == 0:  # what delta-rs's own commits do: keep the log's replay short
        try:
            open_table(output_url).create_checkpoint()
        except Exception as error:  # noqa: BLE001 - a checkpoint is an optimisation; the commit stands without it
            logging.getLogger(__name__).warning("%s: version %d is committed, its checkpoint was not written (readers replay the log "
                                                "instead): %s: %s", output_url, version, type(error).__name__, error, exc_info=error)


def read_rows(output_url: str, settings: TableSettings, version: str | None = None) -> pa.Table:
    from deltalake.exceptions import DeltaError

    found = _load(output_url, int(version) if version else None)
    try:
        return found.to_pyarrow_table()
    except (DeltaError, OSError, pa.ArrowException) as error:
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise FormatError(f"{storage.open_root(output_url)[1]}: the Delta table's data cannot be read ({reason})") from None


def versions(output_url: str, settings: TableSettings) -> list[dict]:
    """The WRITE commits: each is its run's version. (Tables written before runs committed in one
    log entry have the property set by the next commit: that version is then the run's.)"""
    found = open_table(output_url)
    if found is None:
        return []
    history = found.history()
    operations = {entry["version"]: entry.get("operation") for entry in history}
    writes = [entry for entry in history if entry.get(lake.SNAPSHOT_RUN)]
    return [{"version": str(entry["version"] + (operations.get(entry["version"] + 1) == "SET TBLPROPERTIES")),
             "run": entry[lake.SNAPSHOT_RUN], "timestamp_ms": entry["timestamp"]}
            for entry in sorted(writes, key=lambda e: e["version"])]


def rollback(output_url: str, settings: TableSettings, version: str, property_text: str) -> None:
    """Delta's RESTORE in one log entry, the property of the run with it: that version's files
    added back, the current ones it did not have removed, its schema, the run's `mixtrain`."""
    fs, output = storage.open_root(output_url)
    current, target = open_table(output_url), _load(output_url, int(version))
    files = {name: target.get_add_actions(flatten=True).column(name).to_pylist() for name in ("path", "size_bytes", "num_records")}
    restored = dict(zip(files["path"], zip(files["size_bytes"], files["num_records"])))
    now = int(time.time() * 1000)
    actions = [{"add": {"path": path, "partitionValues": {}, "size": size, "modificationTime": now, "dataChange": True,
                        **({"stats": json.dumps({"numRecords": rows})} if rows is not None else {})}}
               for path, (size, rows) in restored.items() if path not in set(committed_files(current))]
    actions += [{"remove": {"path": path, "deletionTimestamp": now, "dataChange": True, "extendedFileMetadata": True,
                            "partitionValues": {}, "size": fs.size(storage.join(output, path))}}
                for path in committed_files(current) if path not in restored]
    info = {"timestamp": now, "operation": "RESTORE", "operationParameters": {"version": int(version)},
            "engineInfo": "mixtrain-convert"}
    metadata = _metadata_action(current, target.schema().to_json(), property_text, now)
    _commit(fs, output, output_url, current.version() + 1, [{"commitInfo": info}, {"metaData": metadata}, *actions])
