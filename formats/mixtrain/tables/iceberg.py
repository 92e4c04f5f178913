"""Apache Iceberg tables (pyiceberg): a run's staged shards committed as one snapshot.

The shards are registered as they were written (no rewrite; Iceberg has no fixed-size list, so a
trajectory column is `list<list<float>>` in the table and its dimension stays in column_types). One
transaction per run sets the `mixtrain` property and replaces the data files: shards whose bytes are
unchanged since the current snapshot stay (the new copy is not registered), the others are swapped.
The commit is the last step of a run: a run killed before it leaves the current snapshot as it
was. Catalog: by default an embedded SQLite catalog `DST/catalog.db` (nothing to start), the table
located at DST; `--catalog` names any catalog pyiceberg can load (a name from ~/.pyiceberg.yaml or
PYICEBERG_CATALOG__* variables, or a URI: http(s):// REST, sqlite:// or postgresql:// SQL,
thrift:// Hive).
"""

from __future__ import annotations

import json
import posixpath
import re

import pyarrow as pa
import pyarrow.parquet as pq

from formats import storage
from formats.errors import ConversionError
from formats.mixtrain.publish import stop_point
from formats.mixtrain.tables import TableSettings, lake
from formats.sequence import int64_text

__all__ = ["publish", "open_table", "current_state", "catalog_properties", "DEFAULT_TABLE", "CATALOG_FILE"]

DEFAULT_TABLE = "default.dataset"
CATALOG_FILE = "catalog.db"
CATALOG_NAME = "mixtrain"
OUTPUT_ENTRIES = {CATALOG_FILE, "metadata"}  # what the embedded layout puts beside runs/


def catalog_properties(catalog: str, output_url: str) -> tuple[str, dict]:
    """(name, properties) for pyiceberg's load_catalog: the embedded default, a URI, or a name."""
    if not catalog:
        fs, root = storage.open_root(output_url)
        if not storage.is_local(fs):
            raise ConversionError(f"{output_url}: the embedded Iceberg catalog is a SQLite file and needs a local output; "
                                  "pass --catalog (a REST, SQL or Glue catalog workers can reach) for object stores")
        return CATALOG_NAME, {"type": "sql", "uri": f"sqlite:///{root}/{CATALOG_FILE}", "warehouse": storage.url_for(fs, root)}
    if catalog.startswith(("http://", "https://")):
        return CATALOG_NAME, {"type": "rest", "uri": catalog}
    if catalog.startswith("thrift://"):
        return CATALOG_NAME, {"type": "hive", "uri": catalog}
    if "://" in catalog:  # an SQLAlchemy URL: sqlite:///..., postgresql+psycopg2://...
        return CATALOG_NAME, {"type": "sql", "uri": catalog}
    return catalog, {}


def _catalog(catalog: str, output_url: str):
    from pyiceberg.catalog import load_catalog

    name, properties = catalog_properties(catalog, output_url)
    try:
        loaded = load_catalog(name, **properties)
    except Exception as error:  # noqa: BLE001 - pyiceberg raises many kinds for a bad configuration
        raise ConversionError(f"{catalog or output_url}: cannot open the Iceberg catalog: {type(error).__name__}: {error}") from error
    for key, value in store_properties(output_url).items():  # defaults: what the catalog's own configuration names wins
        loaded.properties.setdefault(key, value)
    return loaded


def store_properties(output_url: str) -> dict[str, str]:
    """FileIO properties of a table on an S3-compatible store, from the standard AWS variables:
    pyiceberg's default FileIO (PyArrowFileIO) reads neither the endpoint nor the region from the
    environment; without them it writes to AWS itself, after asking AWS for the bucket's region."""
    if not output_url.startswith("s3://"):
        return {}
    found = {"s3.endpoint": storage.s3_endpoint(), "s3.region": storage.s3_region()}
    return {key: value for key, value in found.items() if value}


def open_table(output_url: str, catalog: str = "", table: str = ""):
    """The Iceberg table of a lake output, or None when there is none yet."""
    if not catalog:  # no catalog file yet: no table, and no need to import pyiceberg (seconds) to say so
        fs, root = storage.open_root(output_url)
        if not fs.exists(storage.join(root, CATALOG_FILE)):
            return None
    from pyiceberg.exceptions import NoSuchTableError

    try:
        return _catalog(catalog, output_url).load_table(table or DEFAULT_TABLE)
    except NoSuchTableError:
        return None


def _version_number(prefix: str) -> int:
    """A metadata file's leading version number, -1 when it has none."""
    number = int64_text(prefix)
    return -1 if number is None else number


def lost_table(fs, output: str, output_url: str, settings: TableSettings, runs: list[str]) -> str:
    """The refusal for committed runs whose table the catalog does not have (an emptied or
    deleted catalog.db): how to register the newest metadata file again."""
    name = settings.table or DEFAULT_TABLE
    found = fs.glob(storage.join(output, "metadata", "*.metadata.json"))
    newest = max(found, key=lambda path: (_version_number(posixpath.basename(path).split("-", 1)[0]), path), default=None)
    where = f"the catalog {settings.catalog}" if settings.catalog else f"{storage.join(output, CATALOG_FILE)}"
    head = (f"{output}: {len(runs)} committed run(s) (latest {runs[-1]}) but {where} has no Iceberg table {name}; nothing was "
            "converted (a new table would orphan their snapshots)")
    if newest is None:
        return f"{head}; metadata/ holds no table metadata to register again: restore it, or choose another --output"
    catalog = f"load_catalog({settings.catalog!r})" if settings.catalog else \
        f"SqlCatalog('mixtrain', uri='sqlite:///{output}/{CATALOG_FILE}', warehouse='{output_url}')"
    namespace = name.rsplit(".", 1)[0]
    return (f"{head}: register it again with pyiceberg: catalog = {catalog}; catalog.create_namespace_if_not_exists('{namespace}'); "
            f"catalog.register_table('{name}', '{storage.url_for(fs, newest)}'), then rerun")


def current_state(output_url: str, catalog: str = "", table: str = "") -> str:
    """The current snapshot id ("" for no table or no snapshot): a commit refuses to land on another."""
    found = open_table(output_url, catalog, table)
    snapshot = found.current_snapshot() if found is not None else None
    return str(snapshot.snapshot_id) if snapshot is not None else ""


def current_property(output_url: str, settings: TableSettings) -> dict | None:
    found = open_table(output_url, settings.catalog, settings.table)
    if found is None or found.current_snapshot() is None or lake.PROPERTY not in found.properties:
        return None
    return json.loads(found.properties[lake.PROPERTY])


def describe(output_url: str, settings: TableSettings) -> str:
    """Where the table is and how to open it (the summary line)."""
    found = open_table(output_url, settings.catalog, settings.table)
    snapshot = found.current_snapshot().snapshot_id if found is not None and found.current_snapshot() else None
    name = settings.table or DEFAULT_TABLE
    if settings.catalog:  # the call that opens it, evaluable as printed (a URI becomes the catalog's properties)
        catalog, properties = catalog_properties(settings.catalog, output_url)
        how = f"load_catalog({', '.join([repr(catalog), *(f'{key}={value!r}' for key, value in properties.items())])})"
        how += f".load_table({name!r})"
    else:
        how = f"SqlCatalog('mixtrain', uri='sqlite:///{storage.open_root(output_url)[1]}/{CATALOG_FILE}').load_table({name!r})"
    return f"Iceberg table {name}, snapshot {snapshot} (pyiceberg: {how})"


def _type_text(kind) -> str:
    """An Iceberg type without its field ids (a new file's nested fields have none yet)."""
    return re.sub(r"-?\d+: ", "", str(kind))


def _schema_changes(table, name: str, schema: pa.Schema) -> list[str]:
    """The columns the commit must add or promote (int -> long, float -> double); a column the
    table has must otherwise keep its type (refused with one line)."""
    from pyiceberg.io.pyarrow import _ConvertToIcebergWithoutIDs, visit_pyarrow

    current = {field.name: field for field in table.schema().fields}
    changes = []
    for field in schema:
        if field.name not in current:
            changes.append(field.name)
            continue
        new_type = visit_pyarrow(field.type, _ConvertToIcebergWithoutIDs())
        old = current[field.name].field_type
        if _type_text(new_type) == _type_text(old):
            continue
        if _widens(old, new_type):
            changes.append(field.name)
        else:
            raise ConversionError(f"{name}: column {field.name} changed type from {old} to {new_type}; a table keeps its "
                                  "column types (convert to a new --output, or rename the column at the source)")
    return changes


def _widens(old, new) -> bool:
    """Iceberg's own promotions: int -> long, float -> double."""
    return (str(old), str(new)) in {("int", "long"), ("float", "double")}


def publish(fs, staging: str, output: str, sidecar: dict, settings: TableSettings) -> None:
    """Commit the staged run (already in its final place, DST/runs/<run>) as the table's next snapshot."""
    from pyiceberg.exceptions import CommitFailedException
    from pyiceberg.io.pyarrow import parquet_files_to_data_files

    output_url = storage.url_for(fs, output)
    shards = lake.staged_shards(fs, staging, sidecar)
    untyped = lake.concrete_shards(fs, shards)
    if settings.partition_by:
        shards = lake.split_by_partition(fs, shards, settings.partition_by)
        sidecar = {**sidecar, "shards": [shard[len(staging) + 1:] for shard in shards]}
    value = lake.property_value(sidecar, settings.run_id, "iceberg", untyped)
    lake.write_run_metadata(fs, staging, value, sidecar)
    stop_point("iceberg", "run-metadata-written")
    schema = pq.read_schema(fs.open(shards[0], "rb"))
    lake.check_unsigned(fs, shards, schema)  # pyiceberg declares uint64 as long
    catalog = _catalog(settings.catalog, output_url)
    name = settings.table or DEFAULT_TABLE
    table = open_table(output_url, settings.catalog, name)
    if table is None:
        if settings.base:
            raise ConversionError(f"{output_url}: the Iceberg table {name} this run started from is gone; nothing was committed")
        namespace = name.rsplit(".", 1)[0]
        catalog.create_namespace_if_not_exists(namespace)
        table = catalog.create_table(name, schema=schema, location=output_url)
        stop_point("iceberg", "table-created")
    partitioned = tuple(field.name for field in table.spec().fields)
    if table.current_snapshot() is None and partitioned != tuple(settings.partition_by):
        # A table without rows yet (new, or created by a run killed before its commit) takes this run's partitioning.
        with table.update_spec() as spec:
            for column in partitioned:
                spec.remove_field(column)
            for column in settings.partition_by:
                spec.add_identity(column)
        partitioned = tuple(field.name for field in table.spec().fields)
    if partitioned != tuple(settings.partition_by):
        raise ConversionError(f"{name}: the table is partitioned by ({', '.join(partitioned)}), this run asks for "
                              f"--partition_by={','.join(settings.partition_by)}; nothing was committed (pass the table's "
                              "partitioning, or convert to a new --output)")
    current = table.current_snapshot()
    if (str(current.snapshot_id) if current else "") != settings.base:
        raise ConversionError(f"{output_url}: another writer committed snapshot {current.snapshot_id if current else 'none'} to "
                              f"{name} after this run started; nothing was committed (rerun to convert against it)")
    changes = _schema_changes(table, name, schema)
    committed = {posixpath.basename(task.file.file_path): task.file for task in table.scan().plan_files()} if current else {}
    keep, add = [], []
    for shard in shards:
        previous = committed.get(posixpath.basename(shard))
        old_path = storage.open_root(previous.file_path)[1] if previous is not None else None
        if previous is not None and lake.same_file(fs, old_path, shard):
            keep.append(previous)
        else:
            add.append(storage.url_for(fs, shard))
    kept_paths = {data_file.file_path for data_file in keep}
    remove = [data_file for data_file in committed.values() if data_file.file_path not in kept_paths]
    summary = {lake.SNAPSHOT_RUN: settings.run_id, "mixtrain.kept-files": str(len(keep))}
    try:
        with table.transaction() as transaction:
            if changes:  # new columns (older rows null) and promotions
                with transaction.update_schema() as update:
                    update.union_by_name(schema)
            transaction.set_properties(**{lake.PROPERTY: lake.dumps(value),
                                          "schema.name-mapping.default": transaction.table_metadata.schema().name_mapping.model_dump_json()})
            with transaction.update_snapshot(snapshot_properties=summary).overwrite() as overwrite:
                for data_file in remove:
                    overwrite.delete_data_file(data_file)
                for data_file in parquet_files_to_data_files(table.io, transaction.table_metadata, iter(add)):
                    overwrite.append_data_file(data_file)
        stop_point("iceberg", "committed")
        lake.end_run(fs, staging)
    except CommitFailedException as error:
        raise ConversionError(f"{output_url}: another writer committed to {name} during this run's commit; nothing was committed "
                              f"({error})") from error


def read_rows(output_url: str, settings: TableSettings, version: str | None = None) -> pa.Table:
    found = open_table(output_url, settings.catalog, settings.table)
    if found is None:
        raise ConversionError(f"{output_url}: no Iceberg table {settings.table or DEFAULT_TABLE}")
    return found.scan(snapshot_id=int(version) if version else None).to_arrow()


def versions(output_url: str, settings: TableSettings) -> list[dict]:
    found = open_table(output_url, settings.catalog, settings.table)
    if found is None:
        return []
    return [{"version": str(snapshot.snapshot_id), "run": (snapshot.summary.additional_properties or {}).get(lake.SNAPSHOT_RUN),
             "timestamp_ms": snapshot.timestamp_ms} for snapshot in found.snapshots()]


def rollback(output_url: str, settings: TableSettings, version: str, property_text: str) -> None:
    """The snapshot made current and its run's property restored, in one commit."""
    from pyiceberg.table.update.snapshot import ManageSnapshots

    found = open_table(output_url, settings.catalog, settings.table)
    with found.transaction() as transaction:
        transaction.set_properties(**{lake.PROPERTY: property_text})
        ManageSnapshots(transaction).set_current_snapshot(int(version)).commit()
