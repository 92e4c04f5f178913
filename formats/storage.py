"""Storage edge: turn what a user passes (path, file://, gs://, s3://, memory://) into (fs, root) once.

Inner code only ever sees an fsspec filesystem and a root path inside it (zarr's
`normalize_store_arg` idea), and opens files with `fs.open(join(root, rel))`. What this product
knows of each object store (how to advise on credentials, how the lake libraries that do not go
through fsspec reach it) is in the protocol table `STORES`, one entry per protocol.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import json
import os
import posixpath
import stat
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

from formats.errors import FormatError, MissingPackageError

__all__ = ["open_root", "holds_entries", "STORES", "object_store_options", "s3_endpoint", "s3_region", "open_reachable", "join", "url_for", "shown",
           "resolve_inside", "check_regular", "local_path", "is_local", "open_input", "arrow_input", "ArrowInput", "arrow_held",
           "wait_for_arrow", "read_json", "parse_json", "ParquetFooters",
           "footer_signature", "parquet_file", "read_parquet", "check_parquet_footer", "MAX_PARQUET_FOOTER_BYTES",
           "template_problem", "read_small", "text_lines", "MAX_JSON_BYTES", "MAX_SIDECAR_BYTES", "MAX_LINE_BYTES"]

# The largest Parquet footer read: a footer of 500 row groups is about 1.5 MB (`ParquetFooters`), and
# pyarrow reads the length the file's last 8 bytes claim into memory before parsing it (a 4 GB claim
# in a sparse file: 3.9 GB peak RSS, 20 s, then "Couldn't deserialize thrift").
MAX_PARQUET_FOOTER_BYTES = 64 << 20
MAX_NAME_BYTES = 255  # a file or folder name's limit on every file system we write to (NAME_MAX)


def open_root(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """Return (filesystem, root path without trailing slash) for a URL or local path.

    A local path (no `://`) or a file:// URL is taken as it is: fsspec would read `::` in it as a
    chain of protocols (`a::b` -> "Protocol not known: a"); a leading `~` is the home folder, as
    in a shell (a training script's `open_dataset("~/data/ds")`, `validate "~/ds"`)."""
    if "://" not in url or url.startswith("file://"):
        path = os.path.abspath(os.path.expanduser(url[len("file://"):] if url.startswith("file://") else url))
        return LocalFileSystem(), path.rstrip("/") or "/"
    try:
        fs, root = url_to_fs(url)
    except ImportError as error:
        raise _missing_package(url, error) from None
    return fs, root.rstrip("/") or "/"


def _missing_package(url: str, error: ImportError) -> MissingPackageError:
    """One line naming the package to install, for the first protocol of `url` (a chain such as
    filecache::s3://... too) whose implementation cannot be imported."""
    import importlib.util

    from fsspec.registry import known_implementations

    for part in url.split("::"):
        protocol = fsspec.core.split_protocol(part)[0] or "file"
        package = known_implementations.get(protocol, {}).get("class", "").split(".")[0]
        if package and importlib.util.find_spec(package) is None:
            install = f"'mixtrain-convert[{EXTRAS[package]}]'" if package in EXTRAS else package
            return MissingPackageError(f"{url}: this protocol needs a package that is not installed: pip install {install}")
    return MissingPackageError(f"{url}: this protocol needs a package that is not installed ({error})")


# Filesystem packages this product installs as an extra (setup.py): named by the extra.
EXTRAS = {"huggingface_hub": "hub", "s3fs": "s3"}


def parse_url(url: str) -> tuple[type, str]:
    """The filesystem class and root `open_root(url)` would give, without opening the filesystem
    (which, for a cloud store, looks for credentials over the network). Raises ValueError for an
    unknown protocol, MissingPackageError (an ImportError) when its package is missing."""
    if "://" not in url or url.startswith("file://"):
        return LocalFileSystem, open_root(url)[1]
    try:
        cls = fsspec.get_filesystem_class(fsspec.core.split_protocol(url)[0])
    except ImportError as error:
        raise _missing_package(url, error) from None
    return cls, cls._strip_protocol(url).rstrip("/") or "/"


def join(root: str, *parts: str) -> str:
    return posixpath.join(root, *parts)


def url_for(fs: fsspec.AbstractFileSystem, path: str) -> str:
    """A URL that `open_root` maps back to the same (fs, path): what crosses process boundaries."""
    return fs.unstrip_protocol(path)


def shown(fs: fsspec.AbstractFileSystem, path: str) -> str:
    """A path as messages name it: a local one as it is, on a store its URL (s3://bucket/...),
    which a user can look at (the store's path without its scheme is not)."""
    return path if is_local(fs) else url_for(fs, path)


def resolve_inside(root: str, relative: str, *, what: str, fs: fsspec.AbstractFileSystem | None = None) -> str:
    """Join a path read from metadata to root, refusing one that escapes the dataset root:
    absolute paths, `../`, and (on a local disk, given `fs`) symlinks that lead outside it; and
    names no file system can hold (a NUL, an unpaired surrogate from a JSON `\\ud800` escape),
    which os.stat would answer with ValueError / UnicodeEncodeError."""
    if "\x00" in relative or not relative.isascii() and not _encodable(relative):
        raise FormatError(f"{what} {relative!r} is not a valid file name (a NUL or an unpaired surrogate)")
    if relative.startswith("/") or "://" in relative:
        raise FormatError(f"{what} {relative!r} is absolute; paths in metadata must be inside the dataset")
    normalized = posixpath.normpath(relative)
    if normalized == ".." or normalized.startswith("../"):
        raise FormatError(f"{what} {relative!r} escapes the dataset root")
    if any(len(part.encode()) > MAX_NAME_BYTES for part in normalized.split("/")):  # ENAMETOOLONG from open
        shown = repr(relative) if len(relative) <= 60 else f"{relative[:60]!r}... ({len(relative)} characters)"
        raise FormatError(f"{what} {shown} is not a valid file name (a part longer than {MAX_NAME_BYTES} bytes)")
    path = posixpath.join(root, normalized)
    if fs is not None and local_path(fs, path) is not None:
        real = _real_path(root, normalized)
        if not any(real == allowed or real.startswith(allowed.rstrip("/") + "/") for allowed in _allowed_roots(root)):
            raise FormatError(f"{what} {relative!r} is a symlink to {real}, outside the dataset root")
        kind = _special_kind(path)
        if kind:
            raise FormatError(f"{what} {relative!r} is a {kind}, not a regular file; refused without opening it")
    return path


def _encodable(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


_SPECIAL = ((stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket"))


def _special_kind(local: str) -> str | None:
    """What a local path is when it is neither a regular file nor a folder (None otherwise or if absent)."""
    try:
        mode = os.stat(local).st_mode
    except OSError:
        return None  # absent or unreadable: the caller's own open reports it
    return next((name for test, name in _SPECIAL if test(mode)), None)


def check_regular(fs: fsspec.AbstractFileSystem, path: str) -> None:
    """Refuse, without opening it, a local path that is a FIFO, device or socket: opening a FIFO
    blocks until a writer appears (a hung launcher), a device never ends. Object stores hold none.
    And a folder: metadata naming one (a shard listed as ".") got IsADirectoryError from open."""
    local = local_path(fs, path)
    kind = _special_kind(local) if local is not None else None
    if kind:
        raise FormatError(f"{path}: is a {kind}, not a regular file; refused without opening it")
    if local is not None and os.path.isdir(local):
        raise FormatError(f"{path}: is a folder, not a file")


def _real_path(root: str, relative: str) -> str:
    """os.path.realpath(root/relative), with the root's real path resolved once (`_allowed_roots`)
    and only the components below it looked at (one lstat each, every call): resolving every
    component of every path cost 93,000 lstat calls (0.8 s) on 3,200 episodes. A symlink below the
    root is resolved whole, as before. (The root's real path is remembered for the process's life:
    a root symlink repointed mid-run is not noticed.)"""
    current = _allowed_roots(root)[0]
    for part in relative.split("/"):
        if part in ("", "."):
            continue
        current = os.path.join(current, part)
        if os.path.islink(current):
            return os.path.realpath(posixpath.join(root, relative))
    return current


@functools.lru_cache(maxsize=64)
def _allowed_roots(root: str) -> tuple[str, ...]:
    """Where a dataset's files may really live: under its root, and for a Hugging Face hub cache
    snapshot (`.../datasets--org--name/snapshots/<revision>`, every file a symlink to
    `../../blobs/<hash>`) in that same repository's `blobs/` folder."""
    real_root = os.path.realpath(root)
    allowed = [real_root]
    parent = os.path.dirname(real_root)
    if os.path.basename(parent) == "snapshots" and os.path.isdir(os.path.join(os.path.dirname(parent), "blobs")):
        allowed.append(os.path.realpath(os.path.join(os.path.dirname(parent), "blobs")))
    return tuple(allowed)


def _s3_bucket_missing(fs: fsspec.AbstractFileSystem, bucket: str) -> bool:
    """Whether the S3 store says `bucket` does not exist (404). Any other answer, a 403 among them
    (a key allowed objects under a prefix but not the bucket itself), proves nothing: False."""
    try:
        fs.call_s3("head_bucket", Bucket=bucket)
    except FileNotFoundError:
        return True
    except Exception:  # noqa: BLE001 - not a proof of absence; a real failure shows on the first read or write
        return False
    return False


@dataclasses.dataclass(frozen=True)
class Store:
    """What this product knows of one object store protocol.

    advice: what the user should check when the store cannot be reached (ends an `error:` line).
    bucket_missing: (fs, bucket) -> whether the store says the bucket does not exist, asked when a
      URL's root is absent, so that an output in a missing bucket is refused before any work.
    """

    advice: str
    bucket_missing: Callable[[fsspec.AbstractFileSystem, str], bool] | None = None


# Object store protocols by fsspec name. s3:// is AWS S3 and every S3-compatible store (MinIO,
# Ceph): an endpoint other than AWS's comes from AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL, which s3fs
# (botocore) reads itself and `object_store_options` hands to the libraries that do not.
STORES = {
    "gs": Store("the credentials (gcloud auth application-default login)"),
    "s3": Store("the endpoint (AWS_ENDPOINT_URL for MinIO or Ceph) and the credentials (AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE)", bucket_missing=_s3_bucket_missing),
    "hf": Store("the token (huggingface-cli login) for a private repository"),
}
_DEFAULT_STORE = Store("the credentials")


def s3_endpoint() -> str | None:
    """The S3 endpoint the standard AWS variables name (the S3-specific one first, as botocore
    reads them), or None for AWS itself."""
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


def s3_region() -> str | None:
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None


def object_store_options(url: str) -> dict[str, str]:
    """`storage_options` for the libraries that reach object stores through Rust's object_store
    rather than fsspec (delta-rs, Lance): for s3:// the endpoint and region the standard AWS
    variables give (object_store reads AWS_ENDPOINT_URL but not AWS_ENDPOINT_URL_S3) and, for an
    http:// endpoint (a MinIO on the local network), leave to use it, which object_store refuses
    by default. Keys and secrets they read from the environment themselves. {} elsewhere."""
    if not url.startswith("s3://"):
        return {}
    options = {}
    endpoint, region = s3_endpoint(), s3_region()
    if endpoint:
        options["aws_endpoint"] = endpoint
        if endpoint.startswith("http://"):
            options["aws_allow_http"] = "true"
    if region:
        options["aws_region"] = region
    return options


REACH_SECONDS = 5.0  # a store that has not answered by then is unreachable (offline, gcsfs looks for credentials and retries for ~50 s)


def open_reachable(url: str) -> tuple[fsspec.AbstractFileSystem, str, bool]:
    """`open_root(url)` and whether its root exists, but a store that cannot be reached (no
    network, a name that does not resolve, credentials missing or refused, a bucket that does not
    exist) is one FormatError naming the URL and what to do within REACH_SECONDS, instead of the
    client's credential probing and retries (a minute offline) and their traceback. An unknown
    protocol (ValueError) or a missing package (ImportError) is raised as it is, before anything
    is contacted."""
    if "://" not in url or url.startswith(("file://", "memory://")):
        fs, root = open_root(url)
        return fs, root, fs.exists(root)
    parse_url(url)
    store = STORES.get(url.split("://", 1)[0], _DEFAULT_STORE)
    outcome: list = []

    def attempt() -> None:
        try:
            fs, root = open_root(url)
            exists = fs.exists(root)
            bucket = root.split("/", 1)[0]
            if not exists and store.bucket_missing is not None and bucket != root and store.bucket_missing(fs, bucket):
                raise FormatError(f"{url}: the bucket {bucket} does not exist, or these credentials cannot see it; check the URL "
                                  f"and {store.advice}")
            outcome.append((fs, root, exists))
        except Exception as error:  # noqa: BLE001 - handed to the caller's thread below
            outcome.append(error)

    # A daemon thread: a client still retrying after the deadline must not hold the process at exit.
    worker = threading.Thread(target=attempt, name="reach", daemon=True)
    worker.start()
    worker.join(REACH_SECONDS)
    if not outcome:
        raise FormatError(f"{url}: the store did not answer in {REACH_SECONDS:g} s; check the network (a proxy or a firewall) "
                          f"and {store.advice}, then retry")
    if isinstance(outcome[0], FormatError):
        raise outcome[0]
    if isinstance(outcome[0], Exception):
        error = outcome[0]
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise FormatError(f"{url}: cannot reach the store ({reason}); check the network, the URL and {store.advice}") from None
    return outcome[0]


def is_local(fs: fsspec.AbstractFileSystem | type) -> bool:
    """Whether `fs` (or a filesystem class) is this machine's disk (renames, symlinks and OS paths are available)."""
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    return bool({"file", "local"} & set(protocols))


def holds_entries(fs: fsspec.AbstractFileSystem, folder: str) -> bool:
    """Whether `folder` exists and holds anything (an unreadable one: no)."""
    try:
        return fs.exists(folder) and bool(fs.ls(folder, detail=False))
    except OSError:
        return False


def local_path(fs: fsspec.AbstractFileSystem, path: str) -> str | None:
    """The OS path when `fs` is the local disk, else None. PyAV reads and writes an OS path
    natively; a Python file object costs a Python callback per read (measured: bench/)."""
    return path if is_local(fs) else None


def read_json(fs: fsspec.AbstractFileSystem, path: str, *, missing: str | None = None, want_object: bool = True,
              limit: int | None = None) -> Any:
    """A metadata file's JSON, malformed text a FormatError naming the file. An absent file is
    None, or the FormatError `missing` when the format requires it."""
    if not fs.exists(path):
        if missing is None:
            return None
        raise FormatError(f"{path}: {missing}")
    value = parse_json(read_small(fs, path, "a JSON metadata file", limit or MAX_JSON_BYTES), path)
    if want_object and not isinstance(value, dict):
        raise FormatError(f"{path}: expected a JSON object, found {type(value).__name__}")
    return value


def parse_json(text: str | bytes, where: str) -> Any:
    """JSON text parsed, anything the parser refuses a FormatError naming `where`: malformed text
    and bad UTF-8, but also what json.loads raises beyond JSONDecodeError on hostile input: an
    integer of more than 4,300 digits (ValueError) and nesting past the recursion limit
    (RecursionError; `[` * 100,000 is 100 kB)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise FormatError(f"{where}: malformed JSON: nested too deeply") from None
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError, the integer digit limit
        raise FormatError(f"{where}: malformed JSON: {error}") from error


def footer_signature(metadata: pq.FileMetaData) -> str:
    """A short identity of a Parquet footer: a file rewritten in place gets another one."""
    return f"{metadata.serialized_size}:{metadata.num_rows}:{metadata.num_row_groups}:{metadata.num_columns}"


class ParquetFooters:
    """Parquet footers (and what is derived from them), each read once per holder: a source's
    reader on a worker, where many episodes share one data file, or one plan. A holder lives no
    longer than its plan, so a dataset rewritten in place is never read through an old footer."""

    # Entries remembered (about 8 files: a footer, a schema and up to six small entries the readers
    # derive from them each), the least recently used forgotten first. A worker loads a file's
    # episodes one after another (read groups), so a few files suffice; 64 footers kept each worker
    # growing with the files it had visited (a footer of 500 row groups is about 1.5 MB): 417 MB
    # against 337 MB per worker at 50,000 episodes.
    LIMIT = 8 * 8

    def __init__(self, fs: fsspec.AbstractFileSystem):
        self._fs = fs
        self._memo: collections.OrderedDict = collections.OrderedDict()
        self.signatures: dict[str, str] = {}  # path -> `footer_signature` of every footer read (kept)

    def memo(self, key: Any, compute: Callable[[], Any]) -> Any:
        """compute(), once per key while it stays among the LIMIT most recently used."""
        if key in self._memo:
            self._memo.move_to_end(key)
            return self._memo[key]
        value = compute()
        self._memo[key] = value
        while len(self._memo) > self.LIMIT:
            self._memo.popitem(last=False)
        return value

    def _read_footer(self, path: str) -> pq.FileMetaData:
        with arrow_input(self._fs, path) as handle:
            metadata = parquet_file(handle, path).metadata
        self.signatures[path] = footer_signature(metadata)
        return metadata

    def footer(self, path: str) -> pq.FileMetaData:
        return self.memo(("footer", path), lambda: self._read_footer(path))

    def schema(self, path: str) -> Any:
        """The file's Arrow schema (pa.Schema)."""
        return self.memo(("schema", path), lambda: self.footer(path).schema.to_arrow_schema())

    def schemas(self, paths: list[str], threads: int = 16) -> Iterator[tuple[str, Any]]:
        """(path, its Arrow schema or the OSError / ArrowException reading it gave) for each of
        `paths`, in order, footers read `threads` at a time and not kept (signatures are): one
        after another, a dataset of a file per episode on an object store waited 2-3 requests per
        episode while planning."""
        def read(path: str) -> Any:
            try:
                return self._read_footer(path).schema.to_arrow_schema()
            except (OSError, pa.ArrowException) as error:
                return error
        with concurrent.futures.ThreadPoolExecutor(max(1, min(threads, len(paths)))) as pool:
            yield from zip(paths, pool.map(read, paths))


def check_parquet_footer(handle: Any, where: str | None = None) -> None:
    """Refuse, before pyarrow reads it, a Parquet file whose footer length (its last 8 bytes: the
    length, then PAR1) is larger than the file or than MAX_PARQUET_FOOTER_BYTES. Other damage is
    left to pyarrow's own message. The handle is left at offset 0."""
    where = where or str(getattr(handle, "path", None) or getattr(handle, "name", "Parquet file"))
    handle.seek(0, os.SEEK_END)
    size = handle.tell()
    if size >= 12:
        handle.seek(size - 8)
        tail = handle.read(8)
        claimed = int.from_bytes(tail[:4], "little")
        if tail[4:] == b"PAR1" and (claimed > size - 12 or claimed > MAX_PARQUET_FOOTER_BYTES):
            handle.seek(0)
            limit = "the file" if claimed > size - 12 else f"the {MAX_PARQUET_FOOTER_BYTES >> 20} MiB this reader allows"
            raise FormatError(f"{where}: its Parquet footer claims {claimed:,} bytes, more than {limit} "
                              f"({size:,} bytes in the file): damaged or not a Parquet file; nothing read")
    handle.seek(0)


def parquet_file(source: Any, where: str | None = None, **options: Any) -> pq.ParquetFile:
    """`pq.ParquetFile` for a source file, verifying page checksums (CRC32) where the writer
    recorded them: a flipped bit is then an OSError ("CRC checksum verification failed"), not a
    silently different value. Pages without a checksum are read as before. The footer's claimed
    length is checked first (`check_parquet_footer`) unless its metadata is given."""
    if options.get("metadata") is None and hasattr(source, "seek"):
        check_parquet_footer(source, where)
    return pq.ParquetFile(source, page_checksum_verification=True, **options)


def read_parquet(fs: fsspec.AbstractFileSystem, path: str, **options: Any) -> Any:
    """A whole source Parquet file as a pyarrow Table, page checksums verified (`parquet_file`)."""
    with arrow_input(fs, path) as handle:
        check_parquet_footer(handle, path)
        return pq.read_table(handle, page_checksum_verification=True, **options)


def open_input(fs: fsspec.AbstractFileSystem, path: str):
    """Open a source file for reading (never a FIFO or device: `check_regular`). On object stores
    with a plain read-ahead cache: gcsfs' default ("adaptive", a background prefetcher) leaves
    pending tasks behind on every close and is the suspect of a rare failed read against the GCS
    emulator; our reads are ranged anyway."""
    check_regular(fs, path)
    if local_path(fs, path) is not None:
        return fs.open(path, "rb")
    return fs.open(path, "rb", cache_type="readahead")


class ArrowInput:
    """A remote file handed to Arrow, which a process ending normally (a training script) waits
    for at exit until Arrow has let go of it and of every buffer it read.

    Arrow reads a Python file object on its own threads (pre-buffering, scans) and keeps what it
    read as Python buffers; some are released on those threads after `read_table` returned (seen
    in 6 of 40 reads from S3, after a `gc.collect()`). A release that comes once the interpreter
    is finalizing needs a GIL that no longer exists: the thread is ended inside a C++ destructor,
    "terminate called without an active exception", exit status 134 after the script's work was
    done (apache/arrow#39162). An exit handler waits, at most EXIT_WAIT_SECONDS, for what Arrow
    still holds: while the interpreter is whole, those threads finish their releases. Local files
    reach Arrow as its own files (`pa.OSFile`) and need none of this."""

    def __init__(self, handle: Any):
        self._handle = handle
        _track(self)

    def read_buffer(self, size: int = -1) -> Any:
        """What Arrow's reads take (PythonFile prefers it to `read`): a buffer it may keep, counted."""
        import numpy as np

        data = np.frombuffer(self._handle.read(size), dtype=np.uint8)
        _track(data)
        return data

    def read(self, size: int = -1) -> bytes:
        return self._handle.read(size)

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._handle.seek(offset, whence)

    def tell(self) -> int:
        return self._handle.tell()

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    @property
    def closed(self) -> bool:
        return self._handle is None or self._handle.closed

    @property
    def size(self) -> Any:
        return getattr(self._handle, "size", None)

    @property
    def path(self) -> Any:
        return getattr(self._handle, "path", None)

    def close(self) -> None:
        """Closed and let go here: freeing this object on an Arrow thread then runs no Python code
        (a file object's own clean-up), during which that thread could hand the GIL to an exit."""
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.close()

    def __enter__(self) -> ArrowInput:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()


EXIT_WAIT_SECONDS = 1.0  # Arrow's threads let go within a millisecond of a read (at most 0.1 ms in 40 reads from S3)
_held_changed = threading.Condition()
_exit_wait_registered = False
_watched: dict = {}  # a weak reference to each ArrowInput and buffer alive, by the reference's id


def _track(obj: Any) -> None:
    global _exit_wait_registered
    with _held_changed:
        if not _exit_wait_registered:
            import atexit

            atexit.register(_wait_at_exit)
            _exit_wait_registered = True
        # Counted down when freed, wherever that happens: a plain weak reference, not
        # weakref.finalize, whose own exit handler stops every finalizer that has not run yet.
        reference = weakref.ref(obj, _released)
        _watched[id(reference)] = reference  # kept by identity: a weak reference hashes as what it refers to


def _released(reference: weakref.ref) -> None:
    with _held_changed:
        _watched.pop(id(reference), None)
        _held_changed.notify_all()


def _forget_after_fork() -> None:
    """A forked child (a DataLoader worker) counts afresh: the parent's Arrow threads do not exist
    in it, and the lock may have been held by one of them at the fork."""
    global _held_changed, _watched
    _held_changed, _watched = threading.Condition(), {}


os.register_at_fork(after_in_child=_forget_after_fork)


def arrow_held() -> int:
    """How many remote files and buffers read through them Arrow (or anyone) still holds."""
    with _held_changed:
        return len(_watched)


def wait_for_arrow(timeout: float = EXIT_WAIT_SECONDS) -> bool:
    """Wait until nothing read through an `ArrowInput` is held (what the exit handler waits for;
    see `ArrowInput`); False when `timeout` passed first (something the program itself keeps,
    released as before)."""
    with _held_changed:
        return _held_changed.wait_for(lambda: not _watched, timeout)


def _wait_at_exit() -> None:
    """The exit handler: an error left uncaught keeps the frames that read, and so their files,
    alive until the interpreter's teardown: they are let go of first (it was printed already, and
    an interactive session or a post-mortem debugger is done by now), then what is garbage is
    collected, all within EXIT_WAIT_SECONDS."""
    deadline = time.monotonic() + EXIT_WAIT_SECONDS
    if _watched:
        for name in ("last_traceback", "last_exc", "last_value", "last_type"):
            if getattr(sys, name, None) is not None:
                setattr(sys, name, None)
        import gc

        gc.collect()
    wait_for_arrow(max(0.0, deadline - time.monotonic()))


def arrow_input(fs: fsspec.AbstractFileSystem, path: str) -> Any:
    """A file for Arrow to read: a local one as Arrow's own file (no Python object on its threads),
    a remote one as an `ArrowInput`. Checked as `open_input` checks (never a FIFO or device)."""
    local = local_path(fs, path)
    if local is not None:
        check_regular(fs, path)
        try:
            return pa.OSFile(os.fsencode(local), "rb")  # bytes: a name that is not UTF-8 opens too
        except OSError as error:  # said as the OS says it, as fs.open did ("Permission denied: PATH")
            if error.errno:
                raise type(error)(error.errno, os.strerror(error.errno), local) from None
            raise
    return ArrowInput(open_input(fs, path))


# What a metadata file may claim: its size on disk is not what it holds (a sparse info.json of
# 4 KB on disk claimed 2.5 GB, read whole), so a JSON file is read only up to MAX_JSON_BYTES (its
# objects take up to about 23 times its bytes once parsed) and a JSON Lines file a block at a
# time, no line longer than MAX_LINE_BYTES held.
MAX_JSON_BYTES = 64 << 20
MAX_SIDECAR_BYTES = 256 << 20  # mixtrain.json: per-sequence notes (crf_lowered, not_copied) make it grow with the dataset
MAX_LINE_BYTES = 16 << 20
_BLOCK = 1 << 20


def read_small(fs: fsspec.AbstractFileSystem, path: str, what: str, limit: int = MAX_JSON_BYTES) -> bytes:
    """A metadata file's bytes, refused in one line when it claims or holds more than `limit`
    (never more than `limit` + 1 bytes read, whatever a listing said of its size)."""
    check_regular(fs, path)
    size = fs.size(path)
    if size is not None and size > limit:
        raise FormatError(f"{path}: {size} bytes is not plausible for {what} (at most {limit})")
    if size == 0:  # a range of an empty object is unsatisfiable to S3 and GCS
        return b""
    # A read of N bytes allocates N first (Python's file read): ask for what the file says it holds.
    data = fs.cat_file(path, start=0, end=(limit if size is None else min(size, limit)) + 1)
    if size is not None and size < len(data) <= limit:  # it holds more than its listing said (a stale cache)
        data = fs.cat_file(path, start=0, end=limit + 1)
    if len(data) > limit:
        raise FormatError(f"{path}: more than {limit} bytes is not plausible for {what}")
    return data


def text_lines(fs: fsspec.AbstractFileSystem, path: str) -> Iterator[tuple[int, bytes]]:
    """(line number from 1, line) of a text file read a block at a time (lines end at \n, \r\n
    or \r); a line longer than MAX_LINE_BYTES is refused before it is held whole."""
    number, pending = 0, b""
    with open_input(fs, path) as handle:
        while block := handle.read(_BLOCK):
            pending += block
            *complete, pending = pending.split(b"\n")
            for piece in complete:
                for line in piece.splitlines() or [b""]:
                    number += 1
                    yield number, line
            if len(pending) > MAX_LINE_BYTES:
                raise FormatError(f"{path}: line {number + 1} is longer than {MAX_LINE_BYTES} bytes: not a line of text")
    for line in pending.splitlines():
        number += 1
        yield number, line


MAX_FIELD_WIDTH = 255  # a path template's widest field: `{episode_index:06d}` is 6
MAX_TEMPLATE_CHARS = 1024  # a path template's length: with fields of at most MAX_FIELD_WIDTH, what it fills stays small


def template_problem(template: str) -> str | None:
    """Why a str.format path template from a dataset's metadata must not be filled, or None. Its
    format specs are checked before any filling: a width is an allocation (`{episode_index:0>300000000d}`
    made a string of 300 million characters, 1.9 GB, before anything noticed), and a nested field
    (`{x:{y}}`) is a spec the data chooses."""
    import re
    import string

    if len(template) > MAX_TEMPLATE_CHARS:
        return f"{len(template)} characters (a path template has at most {MAX_TEMPLATE_CHARS})"
    try:
        fields = list(string.Formatter().parse(template))
    except ValueError as error:
        return str(error)
    for _, name, spec, _ in fields:
        if name is None or not spec:
            continue
        if "{" in spec or "}" in spec:
            return f"the field {name!r} has a nested format spec"
        # Every run of digits, ASCII or not (str.format takes a width in Arabic-Indic digits too),
        # judged by its length first (int() refuses more than 4,300 digits).
        if any(len(digits.lstrip("0")) > 3 or int(digits) > MAX_FIELD_WIDTH for digits in re.findall(r"\d+", spec)):
            return f"the field {name!r} asks for a width of more than {MAX_FIELD_WIDTH} characters"
    return None

