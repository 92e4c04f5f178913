"""Storage edge: turn what a user passes (path, file://, gs://, memory://) into (fs, root) once.

Inner code only ever sees an fsspec filesystem and a root path inside it (zarr's
`normalize_store_arg` idea), and opens files with `fs.open(join(root, rel))`.
"""

from __future__ import annotations

import functools
import json
import os
import posixpath
from typing import Any

import fsspec
import pyarrow.parquet as pq
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

from formats.errors import FormatError

__all__ = ["open_root", "join", "url_for", "resolve_inside", "local_path", "is_local", "open_input", "read_json", "parquet_footer"]


def open_root(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """Return (filesystem, root path without trailing slash) for a URL or local path.

    A local path (no `://`) or a file:// URL is taken as it is: fsspec would read `::` in it as a
    chain of protocols (`a::b` -> "Protocol not known: a")."""
    if "://" not in url or url.startswith("file://"):
        path = os.path.abspath(url[len("file://"):] if url.startswith("file://") else url)
        return LocalFileSystem(), path.rstrip("/") or "/"
    fs, root = url_to_fs(url)
    return fs, root.rstrip("/") or "/"


def join(root: str, *parts: str) -> str:
    return posixpath.join(root, *parts)


def url_for(fs: fsspec.AbstractFileSystem, path: str) -> str:
    """A URL that `open_root` maps back to the same (fs, path): what crosses process boundaries."""
    return fs.unstrip_protocol(path)


def resolve_inside(root: str, relative: str, *, what: str, fs: fsspec.AbstractFileSystem | None = None) -> str:
    """Join a path read from metadata to root, refusing one that escapes the dataset root:
    absolute paths, `../`, and (on a local disk, given `fs`) symlinks that lead outside it."""
    if relative.startswith("/") or "://" in relative:
        raise FormatError(f"{what} {relative!r} is absolute; paths in metadata must be inside the dataset")
    normalized = posixpath.normpath(relative)
    if normalized == ".." or normalized.startswith("../"):
        raise FormatError(f"{what} {relative!r} escapes the dataset root")
    path = posixpath.join(root, normalized)
    if fs is not None and local_path(fs, path) is not None:
        real_root = os.path.realpath(root)
        real = os.path.realpath(path)
        if real != real_root and not real.startswith(real_root.rstrip("/") + "/"):
            raise FormatError(f"{what} {relative!r} is a symlink to {real}, outside the dataset root")
    return path


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    """Whether `fs` is this machine's disk (renames, symlinks and OS paths are available)."""
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    return bool({"file", "local"} & set(protocols))


def local_path(fs: fsspec.AbstractFileSystem, path: str) -> str | None:
    """The OS path when `fs` is the local disk, else None. PyAV reads and writes an OS path
    natively; a Python file object costs a Python callback per read (measured: bench/)."""
    return path if is_local(fs) else None


def read_json(fs: fsspec.AbstractFileSystem, path: str, *, missing: str | None = None, want_object: bool = True) -> Any:
    """A metadata file's JSON, malformed text a FormatError naming the file. An absent file is
    None, or the FormatError `missing` when the format requires it."""
    if not fs.exists(path):
        if missing is None:
            return None
        raise FormatError(f"{path}: {missing}")
    try:
        value = json.loads(fs.cat_file(path))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise FormatError(f"{path}: malformed JSON: {error}") from error
    if want_object and not isinstance(value, dict):
        raise FormatError(f"{path}: expected a JSON object, found {type(value).__name__}")
    return value


@functools.lru_cache(maxsize=64)
def parquet_footer(fs: fsspec.AbstractFileSystem, path: str, plan_id: str) -> pq.FileMetaData:
    """A Parquet file's footer, read once per worker, file and plan: many episodes share one data
    file, and a dataset rewritten in place gets a new plan (so never an earlier plan's footer)."""
    with open_input(fs, path) as handle:
        return pq.ParquetFile(handle).metadata


def open_input(fs: fsspec.AbstractFileSystem, path: str):
    """Open a source file for reading. On object stores with a plain read-ahead cache: gcsfs'
    default ("adaptive", a background prefetcher) leaves pending tasks behind on every close and
    is the suspect of a rare failed read against the GCS emulator; our reads are ranged anyway."""
    if local_path(fs, path) is not None:
        return fs.open(path, "rb")
    return fs.open(path, "rb", cache_type="readahead")
