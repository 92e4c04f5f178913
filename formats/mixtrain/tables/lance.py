"""Mixtrain v1.0 as one Lance dataset (`--table_format=lance`): the standalone rows with the videos inside.

The dataset at the output has one row per sequence with the same columns, Arrow types and
column_types as the Parquet shards (fixed-size lists kept; `bytes` cells kept), and in its schema
metadata the Mixtrain JSON (`mixtrain.json`), `stats.json` and `_errors.jsonl`. A video column is,
by default, a Lance blob column holding each MP4 file's bytes verbatim (`Dataset.take_blobs`
gives them back as a file-like object, byte for byte the standalone file); with
`--lance_videos=reference` it stays the relative path of the standalone layout, and the files are
published under `files/` beside the dataset's own folders. Files that are not videos (audio,
URDF assets...) are always published under `files/`.

Publication: the run stages the finished standalone layout as usual; the worker that wrote a
shard writes its rows as Lance fragments (`stage_shard`: file version 2.2, zstd on every leaf but
the blobs), and `publish` commits all of them as ONE new version with `LanceDataset.commit`: a
reader sees the previous version or the new one. Every run adds a version; earlier ones stay
readable (time travel) until cleaned up. The version's metadata also keeps the run's fingerprints,
from which --incremental reuses unchanged sequences (`reusable`, `reused_rows`).
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from formats import mixtrain, storage
from formats.errors import ConversionError, FormatError
from formats.mixtrain import fingerprint
from formats.mixtrain import publish as standalone  # this module's own `publish` commits a Lance version

__all__ = ["reusable", "reused_rows", "FRAGMENT_PART",
           "BLOB", "REFERENCE", "VIDEO_STORAGE", "SIDECAR_KEY", "STATS_KEY", "ERRORS_KEY", "QUALITY_KEY", "is_dataset", "publish", "publish_table",
           "read_metadata", "read_quality", "read_sidecar", "lance_schema", "lance_uri", "open_dataset", "storage_options"]

BLOB, REFERENCE = "blob", "reference"
VIDEO_STORAGE = (BLOB, REFERENCE)
SIDECAR_KEY, STATS_KEY, ERRORS_KEY = mixtrain.SIDECAR, mixtrain.STATS_FILE, mixtrain.ERRORS_FILE
QUALITY_KEY = mixtrain.QUALITY_FILE
FINGERPRINTS_KEY = mixtrain.FINGERPRINTS_FILE  # what the next --incremental run compares with
FRAGMENT_PART = "lance-fragment:"  # a previous version's fragment, as --incremental reuse names it: lance-fragment:<version>:<id>
BLOB_METADATA = {"lance-encoding:blob": "true"}
# Lance file version of the fragments. 2.0 (pylance 14's default) applies no general compression at
# all; 2.1+ honours `lance-encoding:compression` on a leaf field (a primitive, string or binary
# field, not the list around it). 2.2 is what pylance 14 calls "stable". Fixed-size lists stay
# uncompressed in every version (Lance's miniblock encoder stores them as plain values).
FILE_VERSION = "2.2"
COMPRESSION_METADATA = {"lance-encoding:compression": "zstd"}
VERSIONS = "_versions"
LANCE_STAGING = "_lance"  # in a run's staging folder: the workers' fragments until publication
BATCH_ROWS = 16  # rows (and their videos) held in memory while a fragment is written


def is_dataset(fs, root: str) -> bool:
    """Whether `root` holds a Lance dataset (a `_versions/` folder of manifests)."""
    return bool(fs.exists(storage.join(root, VERSIONS)) and fs.glob(storage.join(root, VERSIONS, "*.manifest")))


def _video_columns(sidecar: dict) -> list[str]:
    return [name for name, entry in sidecar["column_types"].items() if entry.get("type") == "video"]


def _compressed(field: pa.Field) -> pa.Field:
    """`field` with zstd asked for on every leaf (where Lance reads the setting): the rows compress
    as in zstd Parquet, except fixed-size lists, which Lance 14 never compresses."""
    kind = field.type
    if pa.types.is_struct(kind):
        return field.with_type(pa.struct([_compressed(child) for child in kind]))
    if pa.types.is_fixed_size_list(kind):
        return field.with_type(pa.list_(_compressed(kind.value_field), kind.list_size))
    if pa.types.is_large_list(kind):
        return field.with_type(pa.large_list(_compressed(kind.value_field)))
    if pa.types.is_list(kind):
        return field.with_type(pa.list_(_compressed(kind.value_field)))
    if pa.types.is_null(kind) or pa.types.is_dictionary(kind) or pa.types.is_map(kind):
        return field
    return field.with_metadata({**(field.metadata or {}), **{k.encode(): v.encode() for k, v in COMPRESSION_METADATA.items()}})


def lance_schema(schema: pa.Schema, blobs: list[str]) -> pa.Schema:
    """The Parquet schema with the `blobs` video columns as blob columns (large_binary with Lance's
    blob encoding: the MP4 bytes verbatim, never compressed) and zstd on every other leaf."""
    return pa.schema([pa.field(f.name, pa.large_binary(), nullable=True, metadata=BLOB_METADATA) if f.name in blobs
                      else _compressed(f) for f in schema])


def _batches(fs, staging: str, shard: str, schema: pa.Schema, blobs: list[str]) -> Iterator[pa.RecordBatch]:
    """A staged shard's rows, BATCH_ROWS at a time, video paths replaced by the files' bytes."""
    with storage.open_input(fs, storage.join(staging, shard)) as handle:
        for batch in pq.ParquetFile(handle).iter_batches(batch_size=BATCH_ROWS):
            arrays = []
            for field in schema:
                column = batch.column(field.name)
                if field.name in blobs:
                    column = pa.array([None if path is None else fs.cat_file(storage.join(staging, path))
                                       for path in column.to_pylist()], pa.large_binary())
                arrays.append(column)
            yield pa.RecordBatch.from_arrays(arrays, schema=schema)


def _staged(staging: str, shard: str, *parts: str) -> str:
    """Where a shard's Lance fragments (and, with ".json", their metadata) wait for publication."""
    stem = shard.rsplit("/", 1)[-1].rsplit(".", 1)[0]
    return storage.join(staging, LANCE_STAGING, stem + "".join(parts))


def _lance():
    os.environ.setdefault("LANCE_LOG", "error")  # not a warning on stderr for "no dataset yet, creating it"
    import lance  # pylance: only this output format needs it
    return lance


def _write_fragments(fs, staging: str, shard: str, blobs: list[str]) -> None:
    """One staged shard's rows as Lance fragments under staging/_lance/<shard>/data/, their
    metadata and Lance's schema in staging/_lance/<shard>.json (nothing for an empty shard)."""
    lance = _lance()
    with storage.open_input(fs, storage.join(staging, shard)) as handle:
        info = pq.ParquetFile(handle)
        parquet_schema, rows = info.schema_arrow, info.metadata.num_rows
    if not rows:
        return
    schema = lance_schema(parquet_schema, blobs)
    reader = pa.RecordBatchReader.from_batches(schema, _batches(fs, staging, shard, schema, blobs))
    uri = lance_uri(fs, _staged(staging, shard))
    written = lance.fragment.write_fragments(reader, uri, schema, mode="overwrite", return_transaction=True,
                                             data_storage_version=FILE_VERSION, storage_options=storage_options(uri))
    record = {"fragments": [fragment.to_json() for fragment in written.operation.fragments],
              # Lance's own schema (blob columns as Lance stores them): the one the commit must name.
              "schema": base64.b64encode(written.operation.new_schema.to_pyarrow().serialize().to_pybytes()).decode()}
    fs.pipe_file(_staged(staging, shard, ".json"), json.dumps(record).encode())


def stage_shard(fs, staging: str, shard: str, video_columns: list[str], settings) -> None:
    """The worker step of formats.mixtrain.tables for `lance`: the shard it just wrote becomes Lance fragments,
    written in parallel with the other workers' and committed by `publish`."""
    _write_fragments(fs, staging, shard, video_columns if (settings.video_storage or BLOB) == BLOB else [])


def publish(fs, staging: str, output: str, sidecar: dict, *, videos: str = BLOB) -> None:
    """Commit the standalone layout staged at `staging` as ONE new version of the Lance dataset at
    `output` (created if absent), then remove the staging folder. The fragments the workers wrote
    (`stage_shard`) are moved into the dataset's data/; a shard without them is written here."""
    lance = _lance()
    from lance import LanceOperation
    from lance.fragment import FragmentMetadata

    if videos not in VIDEO_STORAGE:
        raise ValueError(f"unknown video storage {videos!r}")
    scheme = storage.url_for(fs, output).split("://", 1)[0]
    if scheme not in ("file", "gs", "s3"):  # where Lance itself can write
        raise ConversionError(f"{storage.url_for(fs, output)}: a Lance dataset can be written to a local disk, gs:// or s3://, "
                              f"not {scheme}://")
    blobs = _video_columns(sidecar) if videos == BLOB else []
    shards = list(sidecar.get("shards") or [])
    sidecar = dict(sidecar, table_format="lance", num_shards=0, shards=[])
    sidecar["column_types"] = {name: dict(entry, **({"stored_as": "blob"} if name in blobs else {}))
                               for name, entry in sidecar["column_types"].items()}
    metadata = {SIDECAR_KEY: mixtrain.dumps(sidecar), STATS_KEY: _text(fs, staging, mixtrain.STATS_FILE) or "{}",
                ERRORS_KEY: _text(fs, staging, mixtrain.ERRORS_FILE), FINGERPRINTS_KEY: _text(fs, staging, mixtrain.FINGERPRINTS_FILE)}
    if fs.exists(storage.join(staging, mixtrain.QUALITY_FILE)):
        metadata[QUALITY_KEY] = _text(fs, staging, mixtrain.QUALITY_FILE)
    fragments, schema = [], None
    for shard in shards:
        if not fs.exists(_staged(staging, shard, ".json")):
            _write_fragments(fs, staging, shard, blobs)
        if not fs.exists(_staged(staging, shard, ".json")):
            continue  # an empty shard
        record = json.loads(fs.cat_file(_staged(staging, shard, ".json")))
        fragments += [FragmentMetadata.from_json(json.dumps(fragment)) for fragment in record["fragments"]]
        schema = schema or pa.ipc.read_schema(pa.py_buffer(base64.b64decode(record["schema"])))
    standalone.stop_point("lance", "fragments-written")
    # Everything the new version references is put in place before the commit that makes it
    # current: its fragments (unique names) and the files its rows name by path (over same-named
    # ones; the previous version's other files stay until after the commit). A run killed at any
    # step leaves the previous version whole, or the new one.
    for shard in shards:
        if fs.exists(_staged(staging, shard, "/data")):
            standalone.move_files(fs, _staged(staging, shard, "/data"), storage.join(output, "data"))  # unique names: no clash
    standalone.stop_point("lance", "fragments-moved")
    staged_files, published_files = storage.join(staging, mixtrain.FILES_DIR), storage.join(output, mixtrain.FILES_DIR)
    placed = standalone.move_files(fs, staged_files, published_files, skip=set(blobs)) if fs.exists(staged_files) else set()
    standalone.stop_point("lance", "files-placed")
    uri = lance_uri(fs, output)
    previous = open_dataset(fs, output).version if is_dataset(fs, output) else None
    lance.LanceDataset.commit(uri, LanceOperation.Overwrite(schema.with_metadata(metadata), fragments), read_version=previous,
                              commit_message=f"mixtrain-convert {sidecar.get('created_at', '')}", storage_options=storage_options(uri))
    standalone.stop_point("lance", "committed")
    if fs.exists(storage.join(output, mixtrain.SIDECAR)):  # a standalone dataset replaced by a Lance one: its mixtrain.json first
        fs.rm(storage.join(output, mixtrain.SIDECAR))
        retired = [storage.join(output, name) for name in (mixtrain.STATS_FILE, mixtrain.ERRORS_FILE, mixtrain.FINGERPRINTS_FILE,
                                                           mixtrain.QUALITY_FILE)]
        for path in [path for path in retired if fs.exists(path)] + fs.glob(storage.join(output, mixtrain.DATA_DIR, "*.parquet")):
            fs.rm(path)
        standalone.stop_point("lance", "standalone-retired")
    _prune(fs, published_files, placed)  # the files only earlier versions named
    standalone.stop_point("lance", "files-pruned")
    standalone.discard_staging(fs, staging, output)
    if storage.is_local(fs):
        standalone.collect_garbage(output)  # what killed runs left beside the output


def _prune(fs, root: str, keep: set[str]) -> None:
    """Remove the files under `root` whose relative path is not in `keep`, and folders left empty."""
    if not fs.exists(root):
        return
    for path in fs.find(root):
        if path[len(root.rstrip("/")) + 1:] not in keep:
            fs.rm(path)
    if storage.is_local(fs):
        for folder, _, _ in sorted(os.walk(root), reverse=True):
            if not os.listdir(folder):
                os.rmdir(folder)


def publish_table(fs, staging: str, output: str, sidecar: dict, settings) -> None:
    """The `lance` entry of formats.mixtrain.tables (`--lance_videos` in settings.video_storage)."""
    publish(fs, staging, output, sidecar, videos=settings.video_storage or BLOB)


def _text(fs, root: str, name: str) -> str:
    path = storage.join(root, name)
    return fs.cat_file(path).decode() if fs.exists(path) else ""


def read_sidecar(fs, root: str) -> dict:
    """The Mixtrain JSON of the Lance dataset at `root`."""
    return read_metadata(open_dataset(fs, root))[0]


def read_quality(dataset) -> str | None:
    """The _quality.jsonl text a Lance version holds in its metadata, or None."""
    text = (dataset.schema.metadata or {}).get(QUALITY_KEY.encode())
    return None if text is None else text.decode(errors="replace")


def read_metadata(dataset) -> tuple[dict, dict, str]:
    """(mixtrain.json, stats.json, _errors.jsonl text) of an opened lance.LanceDataset."""
    metadata = dataset.schema.metadata or {}
    if SIDECAR_KEY.encode() not in metadata:
        raise FormatError(f"{dataset.uri}: a Lance dataset without Mixtrain metadata (no {SIDECAR_KEY} in its schema metadata)")
    try:
        sidecar = json.loads(metadata[SIDECAR_KEY.encode()])
        stats = json.loads(metadata.get(STATS_KEY.encode(), b"{}") or b"{}")
    except ValueError as error:
        raise FormatError(f"{dataset.uri}: its Mixtrain metadata is malformed JSON: {error}") from None
    return sidecar, stats, metadata.get(ERRORS_KEY.encode(), b"").decode()


# --- --incremental: the previous version's rows -------------------------------------------------

def lance_uri(fs, root: str) -> str:
    return os.path.realpath(root) if storage.is_local(fs) else storage.url_for(fs, root)


def storage_options(uri: str) -> dict[str, str] | None:
    """What Lance needs beside the URI to reach its store (an S3-compatible endpoint), None for nothing."""
    return storage.object_store_options(uri) or None


def open_dataset(fs, root: str, version: int | None = None):
    """The Lance dataset at `root` (`version`, default the latest): every opening goes through here."""
    uri = lance_uri(fs, root)
    return _lance().dataset(uri, version=version, storage_options=storage_options(uri))


def reusable(fs, root: str, units: list, current: dict, context: str | None = None) -> dict | None:
    """formats.mixtrain.fingerprint.reusable on a Lance dataset: the units whose fingerprint (kept in the
    latest version's metadata) did not change, the ids of their sequences, and that version's
    fragments as the parts to read them from (`reused_rows`). None when nothing was recorded."""
    dataset = open_dataset(fs, root)
    sidecar = read_metadata(dataset)[0]
    text = (dataset.schema.metadata or {}).get(FINGERPRINTS_KEY.encode(), b"").decode()
    if not text:
        return None
    same, owns, context_changed = fingerprint.unchanged(units, current, json.loads(text), context)
    ids = set(filter(owns, dataset.to_table(columns=["sequence_id"]).column("sequence_id").to_pylist()))
    parts = [f"{FRAGMENT_PART}{dataset.version}:{fragment.fragment_id}" for fragment in dataset.get_fragments()]
    return {"units": same, "ids": ids, "shards": parts, "root_url": storage.url_for(fs, root),
            "created_at": sidecar.get("created_at"), "version": dataset.version, "context_changed": context_changed}


def reused_rows(fs, root: str, part: str, keep: frozenset, out_fs, staging: str) -> pa.Table:
    """The rows of sequences `keep` in one fragment of the previous version (`part`, from
    `reusable`), as a staged shard holds them: each blob video written verbatim to the standalone
    path under `staging` (files/<column>/<id>.mp4) and the cell that relative path, so the shard
    writer puts the same bytes back into the new version."""
    version, fragment_id = (int(value) for value in part[len(FRAGMENT_PART):].split(":"))
    dataset = open_dataset(fs, root, version)
    sidecar = read_metadata(dataset)[0]
    blobs = [name for name, entry in sidecar["column_types"].items() if entry.get("stored_as") == "blob"]
    plain = [field.name for field in dataset.schema if field.name not in blobs]
    fragment = dataset.get_fragment(fragment_id)
    table = fragment.to_table(columns=plain, with_row_address=True)
    table = table.filter(pc.is_in(table.column("sequence_id"), pa.array(sorted(keep), pa.string())))
    addresses = table.column("_rowaddr").to_pylist()
    ids = table.column("sequence_id").to_pylist()
    for name in blobs:
        paths = []
        files = dataset.take_blobs(name, addresses=addresses) if addresses else []
        for sequence_id, blob in zip(ids, files):
            data = blob.readall() if blob is not None else None
            if data is None:
                paths.append(None)
                continue
            relative = mixtrain.video_path(name, sequence_id)
            target = storage.join(staging, relative)
            out_fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
            out_fs.pipe_file(target, data)
            paths.append(relative)
        table = table.append_column(name, pa.array(paths, pa.string()))
    return table.drop_columns(["_rowaddr"])
