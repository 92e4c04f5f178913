"""Mixtrain v1.0 as this product writes it (specs/mixtrain-format-v1.0.md, ARCHITECTURE.md s3).

Rows are built into Arrow arrays straight from numpy buffers (offsets + flat values), never
through per-element Python lists. Shards are chosen by a stable digest of the sequence_id, and
rows inside a shard are sorted by sequence_id, so the same input gives the same bytes.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import math
import os
import shutil
import socket
import stat
import sys
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from formats import array_layout, storage
from formats.errors import ConversionError
from formats.sequence import FILE, SCALAR, STEPS, TIMESTAMPS, TRAJECTORY, VIDEO, ColumnSpec, DatasetMeta, Sequence

__all__ = [
    "VERSION",
    "SIDECAR",
    "STATS_FILE",
    "ERRORS_FILE",
    "shard_of",
    "shard_path",
    "video_path",
    "file_path",
    "arrow_schema",
    "sequences_to_table",
    "table_to_sequences",
    "write_shard",
    "shard_writer",
    "column_types",
    "sidecar",
    "read_sidecar",
    "publish",
    "discard_staging",
    "copy_assets",
    "published_root",
    "is_versioned",
    "claim_staging",
    "check_no_live_run",
    "STAGING_DIR",
]

VERSION = "1.0"
SIDECAR = "mixtrain.json"
STATS_FILE = "stats.json"
# Sequences a run skipped under --on_error=skip: one JSON object per line.
ERRORS_FILE = "_errors.jsonl"
DATA_DIR = "data"
# A run writes under DST/_staging/<run>/ (skipped by Parquet dataset readers as a `_` path).
STAGING_DIR = "_staging"
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
    return f"{FILES_DIR}/{column}/{sequence_id}.{extension}"


def file_path(column: str, sequence_id: str, source_name: str, several: bool) -> str:
    """Where a copied source file goes: files/<column>/<id>.<ext>, or files/<column>/<id>/<name>
    when a row holds several files in that column."""
    if several:
        return f"{FILES_DIR}/{column}/{sequence_id}/{source_name}"
    extension = source_name.rsplit(".", 1)[-1] if "." in source_name else "bin"
    return f"{FILES_DIR}/{column}/{sequence_id}.{extension}"


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


def shard_writer(handle, schema: pa.Schema) -> pq.ParquetWriter:
    """The one Parquet configuration of shards (zstd); write row groups with `write_table`.

    Dictionary encoding only for non-float leaves: on trajectories it made files 1.7x larger,
    writes 10x slower and the writer's memory 3x higher (measured on 20,000 x 64 float32).
    No statistics on binary leaves (`--array_layout=bytes` trajectory cells): min/max of raw
    values mean nothing, and Parquet would store two whole cells per page (2-3x the file size).
    """
    leaves = _leaves(schema)
    return pq.ParquetWriter(handle, schema, compression=PARQUET_COMPRESSION,
                            use_dictionary=[path for path, kind in leaves if not (pa.types.is_floating(kind) or pa.types.is_binary(kind))],
                            write_statistics=[path for path, kind in leaves if not pa.types.is_binary(kind)])


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


def sidecar(meta: DatasetMeta, *, num_sequences: int, num_timesteps: int, num_shards: int,
            converter_version: str, options: dict, created_at: str, num_skipped: int = 0,
            non_finite: dict | None = None, incremental: dict | None = None, video_notes: dict | None = None,
            skipped_units: int = 0) -> dict:
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
    return value


def _with_video_notes(types: dict[str, dict], notes: dict[str, dict]) -> dict[str, dict]:
    """A copied column some of whose files are not packet copies says so, and names them: `written_as`
    becomes "copy+lossless" when each of them is a lossless encode (every file still decodes to the
    source's pixels), "copy+retime" when some episode had to be re-timed through a near-lossless
    encode; `not_copied` maps each such sequence_id to how its file was written and why."""
    for column, by_sequence in sorted(notes.items()):
        entry = types.get(column)
        if entry is None or not by_sequence:
            continue
        if entry.get("written_as") == "copy":
            lossy = any(note.get("written_as") != "lossless" for note in by_sequence.values())
            entry["written_as"] = "copy+retime" if lossy else "copy+lossless"
            entry["lossless"] = not lossy
        entry["not_copied"] = dict(sorted(by_sequence.items()))
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
    """JSON text; NaN and infinities (stats of columns that hold them) become null, as JSON has none."""
    return json.dumps(_finite(value), indent=2, sort_keys=False, ensure_ascii=False, allow_nan=False) + "\n"


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


# Local disks: the published dataset is DST itself, real folders and files, one copy: glob
# readers (polars `**/*.parquet`, pyarrow dataset discovery), `cp -r` and uploads see each row and
# file once. A run stages the complete new dataset in a hidden sibling folder
# `.<name>.mixtrain-<run>` next to DST (same file system, invisible to readers of DST) and
# publishes it with one atomic exchange of the two folders (Linux renameat2 RENAME_EXCHANGE): a
# reader sees the previous dataset or the new one, never a mix, and a run killed at any moment
# leaves one of the two complete. The previous dataset, now in the sibling, is then removed; what a
# killed run leaves beside DST is collected by the next run.
#
# Outputs written by earlier versions of this converter (`current -> _versions/<run>` symlinks)
# are still read, and replaced whole by the next run.
VERSIONS_DIR = "_versions"
CURRENT = "current"
SIBLING_MARK = ".mixtrain-"
# Per-unit fingerprints of what a run converted: what --incremental compares against.
FINGERPRINTS_FILE = "_fingerprints.json"
PUBLISHED = (DATA_DIR, FILES_DIR, STATS_FILE, ERRORS_FILE, FINGERPRINTS_FILE, SIDECAR)


def staging_root(fs, output: str, run: str) -> str:
    """Where a run writes before it publishes: a hidden sibling of the output on a local disk
    where the output can be exchanged with it (`replaces_whole_folder`), else `DST/_staging/<run>`
    (object stores, a mount point, a parent folder we may not write), published name by name."""
    if storage.is_local(fs) and replaces_whole_folder(output):
        real = os.path.realpath(output)
        parent, name = os.path.split(real)
        return f"{parent}/.{name}{SIBLING_MARK}{run}"
    return f"{output}/{STAGING_DIR}/{run}"


def replaces_whole_folder(output: str) -> bool:
    """Whether a local output is published by exchanging the whole folder with its staged
    sibling: not when the output is a mount point (or on another device than its parent), when its
    parent folder cannot be written, or when the current directory is inside it."""
    real = os.path.realpath(output)
    parent = os.path.dirname(real) or "/"
    while not os.path.exists(parent):  # the output's missing parents are created by the run
        parent = os.path.dirname(parent)
    if not os.access(parent, os.W_OK | os.X_OK):
        return False
    try:
        here = os.getcwd()
    except FileNotFoundError:
        here = ""
    if here == real or here.startswith(real.rstrip("/") + "/"):  # the shell stands in it: keep the folder itself
        return False
    if os.path.exists(real):
        return not os.path.ismount(real) and os.stat(real).st_dev == os.stat(parent).st_dev
    return True


def foreign_entries(fs, output: str) -> list[str]:
    """What the output folder holds besides a Mixtrain dataset and our own staging."""
    if not fs.exists(output):
        return []
    names = {entry.rstrip("/").rsplit("/", 1)[-1] for entry in fs.ls(output, detail=False)}
    ours = {*PUBLISHED, STAGING_DIR}
    if is_versioned(fs, output):  # `current` and _versions/ are ours only when `current` is our symlink
        ours |= {VERSIONS_DIR, CURRENT}
    return sorted(name for name in names if name not in ours and not name.startswith(f".{CURRENT}-"))


def _siblings(output: str) -> list[str]:
    """This output's staging and replaced folders beside it (local disks)."""
    parent, name = os.path.split(os.path.realpath(output))
    prefix = f".{name}{SIBLING_MARK}"
    try:
        return [f"{parent}/{entry}" for entry in sorted(os.listdir(parent)) if entry.startswith(prefix)]
    except OSError:
        return []


def publish(fs, staging: str, output: str, sidecar_value: dict) -> None:
    """Make the staged dataset the published one, mixtrain.json last.

    On a local disk the switch is one atomic exchange of folders (see above). On object stores
    (no rename, no symlinks), and on local outputs that cannot be exchanged (a mount point, a parent
    folder we may not write), the staged entries are moved into place name by name after
    mixtrain.json is removed, so a dataset being replaced never looks finished; a run killed in
    that window leaves no mixtrain.json, and the next run completes. Entries of the output that are
    not ours are left alone there.
    """
    for name in (ERRORS_FILE, FINGERPRINTS_FILE):  # every published name exists, in every layout
        if not fs.exists(f"{staging}/{name}"):
            fs.pipe_file(f"{staging}/{name}", b"")
    if storage.is_local(fs) and not staging.startswith(f"{output}/{STAGING_DIR}/"):
        _publish_local(staging, output, sidecar_value)
        return
    sidecar_path = f"{output}/{SIDECAR}"
    if fs.exists(sidecar_path):
        fs.rm(sidecar_path)
    for name in (DATA_DIR, FILES_DIR, STATS_FILE, ERRORS_FILE, FINGERPRINTS_FILE):
        target, source = f"{output}/{name}", f"{staging}/{name}"
        if fs.exists(target):
            fs.rm(target, recursive=True)
        if fs.exists(source):
            _move(fs, source, target)
    fs.pipe_file(sidecar_path, dumps(sidecar_value).encode())
    discard_staging(fs, staging, output)
    if storage.is_local(fs):
        _collect_garbage(output)


def _publish_local(staging: str, output: str, sidecar_value: dict) -> None:
    real = os.path.realpath(output)
    if os.path.isdir(real):
        foreign = foreign_entries(storage.open_root(real)[0], real)
        if foreign:  # appeared during the run: exchanging the folder would delete them
            raise ConversionError(f"{output}: {', '.join(foreign)} appeared in the output during the run; nothing was published "
                                  "(the whole folder is replaced on publication: move them out and rerun)")
        _keep_access(real, staging)
    os.makedirs(f"{staging}/{FILES_DIR}", exist_ok=True)
    _write_atomically(f"{staging}/{SIDECAR}", dumps(sidecar_value).encode())
    if os.path.exists(f"{staging}/{OWNER_FILE}"):
        os.remove(f"{staging}/{OWNER_FILE}")
    if os.path.isdir(real):
        try:
            _exchange(staging, real)  # the publication: one atomic exchange
        except OSError as error:
            if error.errno not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise
            # No RENAME_EXCHANGE here (not Linux, or a file system without it): two renames; a
            # reader in between finds no dataset, never a mixed one.
            aside = f"{staging}{SIBLING_MARK}replaced"
            os.rename(real, aside)
            os.rename(staging, real)
            shutil.rmtree(aside, ignore_errors=True)
    else:
        os.rename(staging, real)
    shutil.rmtree(staging, ignore_errors=True)  # the previous dataset, now beside the output
    _collect_garbage(output)


def _keep_access(previous: str, staging: str) -> None:
    """The new folder takes the replaced one's mode (setgid included), owner and group: a team's
    shared output keeps its permissions across runs (best effort where we may not chown)."""
    info = os.stat(previous)
    os.chmod(staging, stat.S_IMODE(info.st_mode))
    try:
        os.chown(staging, info.st_uid, info.st_gid)
    except PermissionError:
        pass


def _exchange(first: str, second: str) -> None:
    """Swap two folders atomically (renameat2 with RENAME_EXCHANGE, Linux 3.15+)."""
    if not sys.platform.startswith("linux"):
        raise OSError(errno.ENOSYS, "no renameat2 on this platform")
    libc = ctypes.CDLL(None, use_errno=True)
    if not hasattr(libc, "renameat2"):
        raise OSError(errno.ENOSYS, "this C library has no renameat2")
    at_fdcwd, rename_exchange = -100, 2
    if libc.renameat2(at_fdcwd, os.fsencode(first), at_fdcwd, os.fsencode(second), rename_exchange) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), first)


def _write_atomically(path: str, data: bytes) -> None:
    temporary = f"{path}.tmp-{os.getpid()}"
    with open(temporary, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def _collect_garbage(output: str) -> None:
    """Remove what killed runs left beside the output (staging, a replaced dataset) and, inside
    it, their staging (`_staging/`, object-store layout) when no live run owns it."""
    for folder in _siblings(output):
        if _live_owner(folder) is None:
            shutil.rmtree(folder, ignore_errors=True)
    inside = f"{output}/{STAGING_DIR}"
    if os.path.isdir(inside):
        for name in os.listdir(inside):
            if _live_owner(f"{inside}/{name}") is None:
                shutil.rmtree(f"{inside}/{name}", ignore_errors=True)
        if not os.listdir(inside):
            os.rmdir(inside)


def is_versioned(fs, output: str) -> bool:
    """Whether the output uses the earlier symlinked layout (`current` is a symlink into _versions/)."""
    current = f"{output}/{CURRENT}"
    return storage.is_local(fs) and os.path.islink(current) and os.readlink(current).startswith(f"{VERSIONS_DIR}/")


OWNER_FILE = ".owner"


def claim_staging(fs, staging: str) -> None:
    """Mark a run's staging folder with its host and pid (local disks): other runs then neither
    collect it nor start beside it."""
    if storage.is_local(fs):
        os.makedirs(staging, exist_ok=True)
        with open(f"{staging}/{OWNER_FILE}", "w") as handle:
            handle.write(f"{socket.gethostname()} {os.getpid()}\n")


def _live_owner(folder: str) -> int | None:
    try:
        host, pid = open(f"{folder}/{OWNER_FILE}").read().split()
    except (OSError, ValueError):
        return None
    if host != socket.gethostname():
        return None
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, ValueError):
        return None
    except PermissionError:
        pass
    return int(pid) if int(pid) != os.getpid() else None


def check_no_live_run(fs, output: str) -> None:
    """One writer per output: refuse to start while another live run stages for it."""
    if not storage.is_local(fs):
        return
    inside = f"{output}/{STAGING_DIR}"
    folders = _siblings(output) + ([f"{inside}/{name}" for name in os.listdir(inside)] if os.path.isdir(inside) else [])
    for folder in folders:
        pid = _live_owner(folder)
        if pid is not None:
            raise ConversionError(f"{output}: another conversion (pid {pid}) is writing this output; wait for it to finish")


def published_root(fs, output: str) -> str:
    """The folder holding the published files themselves (the output, or the current version of
    an output in the earlier symlinked layout)."""
    current = f"{output}/{CURRENT}"
    return os.path.realpath(current) if is_versioned(fs, output) else output


def _move(fs, source: str, target: str) -> None:
    """A rename on a local disk; on object stores (no rename there) a server-side copy of every
    object, then the delete. gcsfs' own `mv` was measured at 33 s per call against the GCS
    emulator (it probes a folder-rename API first); copy + rm take milliseconds."""
    if storage.is_local(fs):
        fs.mv(source, target, recursive=True)
        return
    fs.copy(source, target, recursive=True)
    fs.rm(source, recursive=True)


def copy_assets(fs, root: str, out_fs, staging: str, meta: DatasetMeta) -> None:
    """Dataset-level files no row references (ORTF robot/ URDF and meshes), copied by the launcher
    into the staged files/_dataset/ so they are published with the rows; listed in mixtrain.json."""
    assets = meta.source.get("assets") or []
    for relative in assets:
        source = storage.resolve_inside(root, relative, what="asset", fs=fs)
        target = storage.join(staging, FILES_DIR, "_dataset", relative)
        out_fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
        out_fs.pipe_file(target, fs.cat_file(source))
    if assets:
        meta.source["assets"] = [f"{FILES_DIR}/_dataset/{relative}" for relative in assets]


def discard_staging(fs, staging: str, output: str) -> None:
    """Remove one run's staging folder, then `DST/_staging` if no other run uses it."""
    if fs.exists(staging):
        fs.rm(staging, recursive=True)
    parent = f"{output}/{STAGING_DIR}"
    if staging.startswith(parent + "/") and fs.exists(parent) and not fs.ls(parent):
        fs.rm(parent, recursive=True)
