"""What the lake table formats (Iceberg, Delta) share: the layout under the output, the `mixtrain`
property, file references, and which staged shards a commit adds or keeps.

Layout of a lake output DST (the table location):

    DST/runs/<run>/data/part-00000.parquet   the shards of one run: the table's data files
    DST/runs/<run>/files/<column>/<id>.mp4   videos and other files that run wrote
    DST/runs/<run>/stats.json, _errors.jsonl, _fingerprints.json
    DST/runs/<run>/mixtrain.json             that run's metadata (the `mixtrain` property it committed)
    DST/metadata/, DST/catalog.db            Iceberg (embedded SQLite catalog)   | DST/_delta_log/  Delta

A run writes only inside its own folder, and nothing already committed is ever rewritten: a killed
or failed run leaves a folder no snapshot references (`orphan_runs`), and every snapshot keeps
reading exactly the files it committed. File-reference columns hold paths relative to the table
location (`runs/<run>/files/video_front/episode_000003.mp4`); rows reused by --incremental keep the
path of the run that wrote their file.
"""

from __future__ import annotations

import json
import posixpath

import pyarrow as pa
import pyarrow.parquet as pq

from formats import mixtrain, storage
from formats.errors import ConversionError, FormatError
from formats.mixtrain import publish
from formats.sequence import Sequence

__all__ = ["RUNS_DIR", "run_root", "run_prefix", "with_run_prefix", "property_value", "write_run_metadata", "staged_shards",
           "same_file", "concrete_shards", "split_by_partition", "orphans", "LAKE_FORMATS"]

RUNS_DIR = "runs"
PROPERTY = "mixtrain"
SNAPSHOT_RUN = "mixtrain.run"  # snapshot summary / commit info key naming the run a snapshot committed
LAKE_FORMATS = ("iceberg", "delta")


def run_prefix(run_id: str) -> str:
    """What file references of this run start with (relative to the table location)."""
    return f"{RUNS_DIR}/{run_id}/"


def run_root(output: str, run_id: str) -> str:
    """Where a run stages and keeps its files: inside the table location, never moved."""
    return storage.join(output, RUNS_DIR, run_id)


def with_run_prefix(sequence: Sequence, prefix: str) -> Sequence:
    """File references written by this run, made relative to the table location."""
    for column, value in list(sequence.videos.items()):
        if isinstance(value, str) and "://" not in value:
            sequence.videos[column] = prefix + value
    for column, value in list(sequence.files.items()):
        if isinstance(value, str) and "://" not in value:
            sequence.files[column] = prefix + value
        elif isinstance(value, (list, tuple)):
            sequence.files[column] = [prefix + v if isinstance(v, str) and "://" not in v else v for v in value]
    return sequence


def property_value(sidecar: dict, run_id: str, table_format: str, untyped: list[str] = ()) -> dict:
    """The `mixtrain` table property: the sidecar, its file names relative to the table location
    (stats, errors; the shards are the table's business, listed for reference), and the columns
    this run left out of its files because no row gave them a type (`concrete_shards`)."""
    prefix = run_prefix(run_id)
    value = dict(sidecar)
    value["stats"] = prefix + mixtrain.STATS_FILE
    if "errors" in value:
        value["errors"] = prefix + mixtrain.ERRORS_FILE
    if "quality" in value:
        value["quality"] = prefix + mixtrain.QUALITY_FILE
    value["shards"] = [prefix + shard for shard in sidecar.get("shards", [])]
    value["table"] = {"format": table_format, "run": run_id, "file_references": "relative to the table location"}
    if untyped:
        value["table"]["untyped_columns"] = list(untyped)
    return value


def dumps(value: dict) -> str:
    """The property text: compact JSON (table properties are plain strings)."""
    return json.dumps(json.loads(mixtrain.dumps(value)), ensure_ascii=False, separators=(",", ":"))


def write_run_metadata(fs, staging: str, value: dict, sidecar: dict) -> None:
    """The run folder's own copy of the property, its shards relative to the run folder (what the
    next --incremental run reuses rows from), and every name the standalone layout has."""
    value = {**value, "shards": list(sidecar.get("shards", []))}
    for name in (mixtrain.ERRORS_FILE, mixtrain.FINGERPRINTS_FILE):
        if not fs.exists(storage.join(staging, name)):
            fs.pipe_file(storage.join(staging, name), b"")
    for name in (publish.OWNER_FILE, publish.LOCK_FILE):
        if fs.exists(storage.join(staging, name)):
            fs.rm(storage.join(staging, name))
    fs.pipe_file(storage.join(staging, mixtrain.SIDECAR), mixtrain.dumps(value).encode())


def staged_shards(fs, staging: str, sidecar: dict) -> list[str]:
    """The run's shard paths (fs paths), in shard order; each must exist."""
    shards = [storage.join(staging, shard) for shard in sidecar.get("shards", [])]
    missing = [shard for shard in shards if not fs.exists(shard)]
    if missing:
        raise ConversionError(f"{missing[0]}: staged shard is missing; nothing was committed")
    return shards


def _has_uint64(kind: pa.DataType) -> bool:
    if pa.types.is_uint64(kind):
        return True
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return _has_uint64(kind.value_type)
    if pa.types.is_struct(kind):
        return any(_has_uint64(field.type) for field in kind)
    return False


def _uint64_max(array) -> int | None:
    """The largest uint64 value anywhere inside an Arrow array (lists flattened, struct fields visited)."""
    import pyarrow.compute as pc

    kind = array.type
    if pa.types.is_uint64(kind):
        return pc.max(array).as_py()
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return _uint64_max(array.flatten())
    if pa.types.is_struct(kind):
        found = [_uint64_max(array.field(index)) for index in range(kind.num_fields)]
        return max((value for value in found if value is not None), default=None)
    return None


def unsigned_64_fit(fs, shards: list[str]) -> dict[str, bool]:
    """Per column holding uint64 values (found from the Arrow schema): whether every value fits a
    signed int64, the widest integer lake tables have. From the row groups' Parquet statistics
    when every one has them, else from the values themselves (a shard written without statistics
    proves nothing)."""
    fits: dict[str, bool] = {}
    for shard in shards:
        with fs.open(shard, "rb") as handle:
            parquet = pq.ParquetFile(handle)
            columns = [field.name for field in parquet.schema_arrow if _has_uint64(field.type)]
            metadata = parquet.metadata
            unproven = set()
            for column in columns:
                for group in range(metadata.num_row_groups):
                    for index in range(metadata.num_columns):
                        chunk = metadata.row_group(group).column(index)
                        if chunk.path_in_schema != column and not chunk.path_in_schema.startswith(column + "."):
                            continue
                        statistics = chunk.statistics
                        if statistics is None or not (statistics.has_min_max or statistics.null_count == chunk.num_values):
                            unproven.add(column)
                        elif statistics.has_min_max and isinstance(statistics.max, int) and statistics.max >= 2 ** 63:
                            fits[column] = False
            if unproven:
                table = parquet.read(columns=sorted(unproven))
                for column in unproven:
                    largest = _uint64_max(table.column(column).combine_chunks())
                    if largest is not None and largest >= 2 ** 63:
                        fits[column] = False
        for column in columns:
            fits.setdefault(column, True)
    return fits


def check_unsigned(fs, shards: list[str], schema: pa.Schema) -> None:
    """Refuse a uint64 value a lake table's int64 would wrap (uint64 columns are declared int64)."""
    if not any(_has_uint64(field.type) for field in schema):
        return
    for column, ok in unsigned_64_fit(fs, shards).items():
        if not ok:
            raise ConversionError(f"column {column}: uint64 values exceed int64, the widest integer of lake tables; nothing was "
                                  "committed (use --table_format=parquet)")


def concrete_shards(fs, shards: list[str]) -> list[str]:
    """Leave out of this run's shards the columns no row filled (Arrow null type, or lists of it):
    Iceberg v2 and Delta have no null type, and declaring one (say string) would refuse the run
    that first fills the column with another type. Such a column joins the table's schema when a
    run gives it a type (schema evolution: the rows before read null); a table column a run leaves
    out reads null in that run's rows. Returns the columns left out (recorded in the property)."""
    from formats.arrow_types import is_empty_type

    untyped: set[str] = set()
    for shard in shards:
        schema = pq.read_schema(fs.open(shard, "rb"))
        nulls = [field.name for field in schema if is_empty_type(field.type)]
        if not nulls:
            continue
        with fs.open(shard, "rb") as handle:
            table = pq.read_table(handle)
        with fs.open(shard, "wb") as handle:
            mixtrain.write_shard(table.drop_columns(nulls), handle)
        untyped.update(nulls)
    return sorted(untyped)


# Longest partition part of a shard's file name (ASCII): with `part-NNNNN.` and `.parquet` around
# it, well under the 255 bytes a file name may have.
MAX_PARTITION_NAME = 160


def _partition_name(values: dict) -> str:
    """The partition values as one file name part: each percent-encoded (no '/', '..' or control
    of the data's survives); a long one (a 200-character instruction, or 60 CJK characters, made
    the file name too long to create) cut, with a digest of the whole keeping names distinct."""
    import hashlib
    from urllib.parse import quote

    name = ".".join(f"{column}={'__null__' if value is None else quote(str(value), safe='')}" for column, value in values.items())
    if len(name) > MAX_PARTITION_NAME:
        name = f"{name[:MAX_PARTITION_NAME - 18]}~{hashlib.sha256(name.encode()).hexdigest()[:16]}"
    return name


def split_by_partition(fs, shards: list[str], columns: tuple[str, ...]) -> list[str]:
    """Each shard rewritten as one file per distinct value of the partition columns
    (`part-00000.split=train.parquet`), rows in their order: a table partitioned by identity
    registers a file only when it holds one partition. Empty shards hold no partition and go."""
    import pyarrow.compute as pc

    written = []
    for shard in shards:
        with fs.open(shard, "rb") as handle:
            table = pq.read_table(handle)
        missing = [column for column in columns if column not in table.column_names]
        if missing:
            raise ConversionError(f"--partition_by: column {missing[0]} is not in the rows ({', '.join(table.column_names)})")
        keys = table.select(list(columns)).group_by(list(columns)).aggregate([]).to_pylist() if table.num_rows else []
        for values in sorted(keys, key=lambda v: [str(v[c]) for c in columns]):
            mask = None
            for column in columns:
                match = pc.is_null(table.column(column)) if values[column] is None else pc.equal(table.column(column), values[column])
                mask = match if mask is None else pc.and_(mask, match)
            target = f"{shard[:-len('.parquet')]}.{_partition_name(values)}.parquet"
            with fs.open(target, "wb") as handle:
                mixtrain.write_shard(table.filter(mask), handle)
            written.append(target)
        fs.rm(shard)
    return written


def same_file(fs, first: str, second: str) -> bool:
    """Whether two shards hold the same bytes (same rows: shards are deterministic)."""
    try:
        if fs.size(first) != fs.size(second):
            return False
        return fs.cat_file(first) == fs.cat_file(second)
    except FileNotFoundError:
        return False


def shard_name(path: str) -> str:
    return posixpath.basename(path)


def _module(table_format: str):
    import importlib

    return importlib.import_module(f"formats.mixtrain.tables.{table_format}")


def is_lake(table_format: str) -> bool:
    return table_format in LAKE_FORMATS


def missing_library(table_format: str) -> str | None:
    """The library a lake format needs that is not installed (checked before any work is done)."""
    import importlib.util

    package = {"iceberg": "pyiceberg", "delta": "deltalake"}.get(table_format)
    return package if package and importlib.util.find_spec(package) is None else None


def _table_state(call, output_url: str, table_format: str):
    """call(), a table whose metadata cannot be read (an Iceberg metadata file cut short or
    deleted, a manifest gone) one FormatError naming the metadata folder, not the library's
    traceback (pydantic's ValidationError, pyarrow's FileNotFoundError...)."""
    errors: tuple = (OSError, ValueError)
    if table_format == "iceberg":
        from pyiceberg.exceptions import ValidationError
        errors += (ValidationError,)  # metadata JSON that does not parse (pydantic's, wrapped)
    try:
        return call()
    except ConversionError:
        raise
    except errors as error:
        folder = storage.join(storage.open_root(output_url)[1], "metadata" if table_format == "iceberg" else "_delta_log")
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise FormatError(f"{folder}: the {table_format.capitalize()} table's metadata cannot be read ({reason}); "
                          "restore the missing or damaged files from a backup") from None


def current_property(output_url: str, settings) -> dict | None:
    """The `mixtrain` property of the table's current state, or None (no table yet)."""
    return _table_state(lambda: _module(settings.format).current_property(output_url, settings), output_url, settings.format)


def current_state(output_url: str, settings) -> str:
    """The table's current snapshot id / version ("" when there is none)."""
    return _module(settings.format).current_state(output_url, settings.catalog, settings.table)


def previous_run_root(fs, output: str, output_url: str, settings) -> str | None:
    """The folder of the run the current snapshot committed: what --incremental reuses."""
    value = current_property(output_url, settings)
    run = ((value or {}).get("table") or {}).get("run")
    return run_root(output, run) if run else None


def prepare_output(fs, output: str, output_url: str, settings, replace: bool) -> None:
    """Refuse an output that holds something else than this format's lake table, or a table
    without --overwrite / --incremental (each makes a new snapshot; history is kept)."""
    if not fs.exists(output):
        return
    if not fs.isdir(output):
        raise ConversionError(f"{output}: output exists and is not a directory")
    names = {entry.rstrip("/").rsplit("/", 1)[-1] for entry in fs.ls(output, detail=False)}
    if not names:
        return
    if mixtrain.SIDECAR in names:
        raise ConversionError(f"{output}: output holds a standalone Mixtrain dataset (mixtrain.json); a {settings.format} table "
                              "needs its own --output")
    if not names <= _module(settings.format).OUTPUT_ENTRIES | {RUNS_DIR}:
        raise ConversionError(f"{output}: output is not empty and is not a Mixtrain {settings.format} table "
                              f"({', '.join(sorted(names))}); choose another --output")
    check_not_lost(fs, output, output_url, settings)
    if current_property(output_url, settings) is not None and not replace:
        raise ConversionError(f"{output}: output already holds a Mixtrain {settings.format} table; pass --incremental (commit what "
                              "changed) or --overwrite (commit every row anew) to add a snapshot")


# In a run folder from the launch until its commit landed: a folder holding mixtrain.json without
# it was committed (or written by a converter before this marker). Without its table (catalog
# entry, log), such folders are a table whose catalog or log was lost, not an empty output.
PENDING = ".pending"


def begin_run(fs, run_folder: str) -> None:
    """Mark a run's folder uncommitted (every file system; `publish.claim_staging` is local only)."""
    fs.makedirs(run_folder, exist_ok=True)
    fs.pipe_file(storage.join(run_folder, PENDING), b"")


def end_run(fs, run_folder: str) -> None:
    """The run's commit landed: its folder is now part of the table's history."""
    marker = storage.join(run_folder, PENDING)
    if fs.exists(marker):
        fs.rm(marker)


def pending_runs(fs, output: str) -> list[tuple[str, str]]:
    """(folder, run id) of the run folders whose commit never landed (`.pending`), newest first:
    what an interrupted lake run left, for the next run to resume."""
    runs = storage.join(output, RUNS_DIR)
    if not fs.exists(runs):
        return []
    names = sorted((entry.rstrip("/").rsplit("/", 1)[-1] for entry in fs.ls(runs, detail=False)), reverse=True)
    return [(storage.join(runs, name), name) for name in names if publish.RUN_ID.match(name)
            and fs.exists(storage.join(runs, name, PENDING)) and not publish.has_live_owner(fs, storage.join(runs, name))]


def committed_runs(fs, output: str) -> list[str]:
    """Run folders (relative to the table location, oldest first) whose commit landed."""
    runs = storage.join(output, RUNS_DIR)
    if not fs.exists(runs):
        return []
    names = sorted(entry.rstrip("/").rsplit("/", 1)[-1] for entry in fs.ls(runs, detail=False))
    return [f"{RUNS_DIR}/{name}" for name in names if fs.exists(storage.join(runs, name, mixtrain.SIDECAR))
            and not fs.exists(storage.join(runs, name, PENDING))]


def check_not_lost(fs, output: str, output_url: str, settings) -> None:
    """Refuse (one line, how to recover) an output whose runs were committed to a table that its
    catalog or log no longer shows: starting a new table there would orphan the whole history."""
    module = _module(settings.format)
    if module.open_table(output_url, settings.catalog, settings.table) is not None:
        return
    runs = committed_runs(fs, output)
    if runs:
        raise ConversionError(module.lost_table(fs, output, output_url, settings, runs))


def summary(output_url: str, settings) -> tuple[dict, str]:
    """(the committed property, where the table is and how to open it) for the success line."""
    module = _module(settings.format)
    return module.current_property(output_url, settings) or {}, module.describe(output_url, settings)


def detect(fs, output: str) -> str | None:
    """The lake format of an output folder laid out by this converter (embedded catalog), or None.
    An Iceberg table whose catalog lives elsewhere (--catalog) cannot be opened from its folder:
    one FormatError pointing to pyiceberg, not "mixtrain.json: not found"."""
    if fs.exists(storage.join(output, "_delta_log")):
        return "delta"
    if fs.exists(storage.join(output, "catalog.db")):
        return "iceberg"
    if fs.exists(storage.join(output, RUNS_DIR)) and fs.glob(storage.join(output, "metadata", "*.metadata.json")):
        raise FormatError(f"{output}: an Iceberg table whose catalog is not in this folder (converted with --catalog): open it "
                          "with pyiceberg, load_catalog(NAME, ...).load_table('default.dataset'), as the conversion's summary "
                          "line printed (docs/lake.md, Catalogs)")
    return None


def read_rows(output_url: str, settings, version: str | None = None):
    """Every row of the table (at snapshot id / version `version`, default the current), as Arrow."""
    return _table_state(lambda: _module(settings.format).read_rows(output_url, settings, version), output_url, settings.format)


def versions(output_url: str, settings) -> list[dict]:
    """Each committed run, oldest first: {"version": snapshot id / version, "run": run id, "timestamp_ms",
    "current"}; "current" marks the run the table reads now (after a rollback, not the newest)."""
    found = _module(settings.format).versions(output_url, settings)
    current = ((current_property(output_url, settings) or {}).get("table") or {}).get("run") if found else None
    return [{**entry, "current": entry["run"] == current} for entry in found]


def orphans(output_url: str, settings) -> list[str]:
    """Run folders (relative to the table location) no committed snapshot names: what killed or
    failed runs left. Delete them only while no conversion runs on this output."""
    fs, output = storage.open_root(output_url)
    committed = {entry["run"] for entry in versions(output_url, settings)}
    runs_dir = storage.join(output, RUNS_DIR)
    if not fs.exists(runs_dir):
        return []
    names = sorted(entry.rstrip("/").rsplit("/", 1)[-1] for entry in fs.ls(runs_dir, detail=False))
    return [f"{RUNS_DIR}/{name}" for name in names if name not in committed]


def property_of_run(fs, output: str, run_id: str) -> dict:
    """The `mixtrain` property a run committed (from its folder's copy)."""
    value = json.loads(fs.cat_file(storage.join(run_root(output, run_id), mixtrain.SIDECAR)))
    value["shards"] = [run_prefix(run_id) + shard for shard in value.get("shards", [])]
    return value


def rollback(output_url: str, settings, version: str) -> None:
    """Make an earlier run's snapshot / version current again, its `mixtrain` property with it."""
    fs, output = storage.open_root(output_url)
    found = {entry["version"]: entry["run"] for entry in versions(output_url, settings)}
    if version not in found:
        raise ConversionError(f"{output_url}: no committed run has version {version} (known: {', '.join(found)})")
    _module(settings.format).rollback(output_url, settings, version, dumps(property_of_run(fs, output, found[version])))


def is_committed(fs, run_folder: str, settings) -> bool:
    """Whether a committed version names this run (its folder must then never be removed)."""
    output = run_folder.rsplit(f"/{RUNS_DIR}/", 1)[0]
    run = run_folder.rsplit("/", 1)[-1]
    try:
        return any(entry["run"] == run for entry in versions(storage.url_for(fs, output), settings))
    except Exception:  # noqa: BLE001 - an unreadable table: keep the files rather than risk removing committed ones
        return True
