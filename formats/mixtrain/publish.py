"""Staging and publishing a Mixtrain dataset: where a run writes, how it is made the published one,
what killed runs left behind, and one live run per output.

The rows, schema and sidecar themselves are formats/mixtrain/__init__.py; this module only moves them into place.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import re
import shutil
import signal
import socket
import stat
import sys
import threading
import time

from formats import storage
from formats.errors import ConversionError
from formats.mixtrain import DATA_DIR, ERRORS_FILE, FILES_DIR, FINGERPRINTS_FILE, QUALITY_FILE, SIDECAR, STATS_FILE, dumps

__all__ = [
    "STAGING_DIR",
    "staging_root",
    "replaces_whole_folder",
    "foreign_entries",
    "publish",
    "discard_staging",
    "copy_assets",
    "published_root",
    "published_earlier",
    "is_versioned",
    "claim_staging",
    "check_no_live_run",
    "STEPS",
    "stop_point",
    "collect_garbage",
    "interrupted_stagings",
    "staging_folders",
    "has_live_owner",
    "staging_markers",
    "beat",
    "heartbeat",
    "publishing_age",
    "PUBLISHING",
    "mark_done",
    "take_done",
    "remove_paths",
    "release_staging",
    "RUN_ID",
]

# A run writes under DST/_staging/<run>/ (skipped by Parquet dataset readers as a `_` path).
STAGING_DIR = "_staging"

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
PUBLISHED = (DATA_DIR, FILES_DIR, STATS_FILE, ERRORS_FILE, FINGERPRINTS_FILE, QUALITY_FILE, SIDECAR)


# Where a test may stop a publication, per publisher: a kill at each must leave the previous or
# the new dataset readable and the next run completing (tests/pipelines/test_publication_kills.py).
STEPS = {
    "parquet": ("staged", "exchanged", "replaced-removed"),
    "parquet-in-place": ("sidecar-removed", *(f"moved-{name}" for name in PUBLISHED[:-1]), "sidecar-written", "marker-written"),
    "iceberg": ("run-metadata-written", "table-created", "committed"),
    "delta": ("run-metadata-written", "committed"),
    "lance": ("fragments-written", "fragments-moved", "files-placed", "committed", "standalone-retired", "files-pruned"),
}
# Where a test may stop a conversion or an export before its publication (tests/pipelines/test_resume.py,
# tests/pipelines/test_export.py): the next run with the same command resumes it.
RUN_STEPS = {"conversion": ("rows-spilled", "shard-written"), "export": ("group-recorded", "file-moved", "files-moved"),
             "worker": ("forked",)}  # a local worker forked by the zygote, before it connects (pipelines/local_workers.py)
STOP_AT = "MIXTRAIN_TEST_STOP_AT"  # <publisher>:<step>: the conversion is SIGKILLed there
STEP_LOG = "MIXTRAIN_TEST_STEP_LOG"  # a file each step reached is appended to (tests check STEPS is complete)


def stop_point(publisher: str, step: str) -> None:
    """A named step of a publication, for tests only: with MIXTRAIN_TEST_STOP_AT=<publisher>:<step>
    the conversion dies there as a machine would, by SIGKILL of its process group when it leads
    one (launcher and workers; tests start it with start_new_session), else of this process."""
    wanted, log = os.environ.get(STOP_AT), os.environ.get(STEP_LOG)
    if not wanted and not log:
        return
    if step not in {**STEPS, **RUN_STEPS}[publisher]:
        raise AssertionError(f"undeclared publication step {publisher}:{step}")
    if log and publisher in STEPS:  # the publication's steps (a test checks that it reaches all of them)
        with open(log, "a") as handle:
            handle.write(f"{publisher}:{step}\n")
    if wanted == f"{publisher}:{step}":
        if os.getpgrp() == os.getsid(0):
            os.killpg(0, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)


def staging_root(fs, output: str, run: str) -> str:
    """Where a run writes before it publishes: a hidden sibling `.<name>.mixtrain-<run>` of the
    output, on a local disk where the output can be exchanged with it (`replaces_whole_folder`)
    and on object stores (published there name by name), so that no glob of the output's files
    (`DST/**/*.parquet`) ever matches a staged file, even one a killed run left; else
    `DST/_staging/<run>` (a mount point, a parent folder we may not write, a bucket's root)."""
    if storage.is_local(fs) and replaces_whole_folder(output):
        real = os.path.realpath(output)
        parent, name = os.path.split(real)
        return f"{parent}/.{name}{SIBLING_MARK}{run}"
    if not storage.is_local(fs) and (split := _store_parent(output)) is not None:
        parent, name = split
        return f"{parent}/.{name}{SIBLING_MARK}{run}"
    return f"{output}/{STAGING_DIR}/{run}"


def _store_parent(output: str) -> tuple[str, str] | None:
    """(parent, name) of an object-store output below its bucket's root; None at the root."""
    path = output.rstrip("/")
    if "/" not in path.lstrip("/"):
        return None
    parent, name = path.rsplit("/", 1)
    return parent, name


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
    stop_point("parquet-in-place", "sidecar-removed")
    for name in PUBLISHED[:-1]:
        target, source = f"{output}/{name}", f"{staging}/{name}"
        if fs.exists(target):
            _remove(fs, target)
        if fs.exists(source):
            _move(fs, source, target)
        stop_point("parquet-in-place", f"moved-{name}")
    fs.pipe_file(sidecar_path, dumps(sidecar_value).encode())
    stop_point("parquet-in-place", "sidecar-written")
    fs.pipe_file(_published_marker(staging), b"")  # until the staging is gone: a retried step then knows it has published
    stop_point("parquet-in-place", "marker-written")
    _discard_published(fs, staging, output)
    if storage.is_local(fs):
        collect_garbage(output)


# While a publication runs on an object store, the step publishing (a worker, or a launcher that
# is gone: --detach) renews this heartbeat in the staging folder: the launcher's lease went with
# the journal, and another run must not take the folder for a killed run's leftover
# (`resume.collect_leftovers`) while its objects are being copied into the output.
PUBLISHING = "_publishing"
HEARTBEAT_SECONDS = 30.0
HEARTBEAT_STALE = 150.0


def beat(fs, staging: str) -> None:
    """Write the publication's heartbeat now (object stores)."""
    if not storage.is_local(fs):
        fs.pipe_file(f"{staging}/{PUBLISHING}", json.dumps({"renewed": time.time()}).encode())


@contextlib.contextmanager
def heartbeat(fs, staging: str):
    """Renew the publication's heartbeat every HEARTBEAT_SECONDS while the block runs (object
    stores). A renewal first finds the heartbeat still there, so one after the publisher discarded
    the staging does not bring the folder back (a write racing the discard leaves an object that
    the next run collects once it is stale)."""
    if storage.is_local(fs):
        yield
        return
    beat(fs, staging)
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(HEARTBEAT_SECONDS):
            try:
                if fs.exists(f"{staging}/{PUBLISHING}"):
                    beat(fs, staging)
            except Exception:  # noqa: BLE001 - a store that failed once may answer next time
                pass

    thread = threading.Thread(target=renew, name="mixtrain-publishing", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)
        # A renewal racing the discard at the end of a publication brings back a folder holding only
        # the heartbeat, which a retried publish step would take for a staging to publish again.
        try:
            if fs.exists(f"{staging}/{PUBLISHING}") and fs.find(staging) == [f"{staging}/{PUBLISHING}"]:
                fs.rm(f"{staging}/{PUBLISHING}")
        except OSError:
            pass


def publishing_age(fs, staging: str) -> float | None:
    """Seconds since a publication in `staging` renewed its heartbeat, while it is fresh; else None."""
    return renewal_age(fs, f"{staging}/{PUBLISHING}", HEARTBEAT_STALE)


def renewal_age(fs, path: str, stale: float) -> float | None:
    """Seconds since the renewal `{"renewed": time}` at `path` (a lease, a heartbeat: object stores)
    was written, while younger than `stale`; None for an old, absent or unreadable one."""
    if storage.is_local(fs):
        return None
    try:
        renewed = json.loads(fs.cat_file(path))["renewed"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(renewed, (int, float)) or isinstance(renewed, bool):
        return None
    age = max(0.0, time.time() - renewed)
    return age if age < stale else None


DONE = "done"  # the suffix of the publish step's marker (`mark_done`)


def _done_marker(staging: str) -> str:
    """Where the publish step says it published (`mark_done`): beside the run's staging folder,
    which the publication removed (a local sibling, `DST/_staging/<run>.done`)."""
    return f"{staging}.{DONE}"


def mark_done(fs, staging: str) -> None:
    """The publish step published this run (standalone and Lance layouts; a lake table names its
    run itself): what the launcher checks (`take_done`) before it says so, whatever its runner reported."""
    marker = _done_marker(staging)
    fs.makedirs(marker.rsplit("/", 1)[0], exist_ok=True)  # DST/_staging, removed with the last staging folder in it
    fs.pipe_file(marker, b"")


def take_done(fs, staging: str, output: str) -> bool:
    """Whether this run's publish step published (its marker, removed here with an emptied `DST/_staging`)."""
    marker = _done_marker(staging)
    if not fs.exists(marker):
        return False
    fs.rm(marker)
    discard_staging(fs, staging, output)
    return True


def _published_marker(staging: str) -> str:
    return f"{staging}.published"


def _discard_published(fs, staging: str, output: str) -> None:
    """A published run's staging, then its marker, then DST/_staging if nothing else holds it."""
    discard_staging(fs, staging, output)
    fs.rm(_published_marker(staging))
    discard_staging(fs, staging, output)


def published_earlier(fs, staging: str, output: str, identity: dict) -> dict | None:
    """The published mixtrain.json when an earlier attempt of this run's publish step got as far
    as writing it (Dataflow retries a step whose worker died), else None. Publishing again would
    rebuild the dataset from a staging folder that is gone or half deleted: a dataset without its
    shards. An attempt that died while removing the staging left a marker, and this one finishes
    the removal. Without marker or staging, the published mixtrain.json must carry this run's
    `identity` (created_at and converter options): an empty staging of a first attempt (every
    sequence failed) is not taken for a publication."""
    sidecar_path = f"{output}/{SIDECAR}"
    marker = _published_marker(staging)
    marked = fs.exists(marker)
    if marked:  # written after mixtrain.json: this run's publication stands; finish removing the staging
        _discard_published(fs, staging, output)
    elif fs.exists(staging):
        return None  # the first attempt, or one that died before mixtrain.json: publish
    if not fs.exists(sidecar_path):
        return None
    with fs.open(sidecar_path, "rb") as handle:
        current = json.loads(handle.read())
    mine = current.get("created_at") == identity.get("created_at") \
        and (current.get("converter") or {}).get("options") == identity.get("options")
    return current if marked or mine else None


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
    for name in (OWNER_FILE, LOCK_FILE):
        if os.path.exists(f"{staging}/{name}"):
            os.remove(f"{staging}/{name}")
    stop_point("parquet", "staged")
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
    stop_point("parquet", "exchanged")
    shutil.rmtree(staging, ignore_errors=True)  # the previous dataset, now beside the output
    stop_point("parquet", "replaced-removed")
    collect_garbage(output)


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


def collect_garbage(output: str) -> None:
    """Remove what killed runs left beside the output (staging, a replaced dataset) and, inside
    it, their staging (`_staging/`, object-store layout) when no live run owns it."""
    for folder in _siblings(output):
        if folder.endswith(f".{DONE}") and os.path.isfile(folder):  # a launcher killed between publication and `take_done`
            os.remove(folder)
        elif _live_owner(folder) is None:
            shutil.rmtree(folder, ignore_errors=True)
    inside = f"{output}/{STAGING_DIR}"
    if os.path.isdir(inside):
        for name in os.listdir(inside):
            if name.endswith(f".{DONE}") and os.path.isfile(f"{inside}/{name}"):
                os.remove(f"{inside}/{name}")
            elif _live_owner(f"{inside}/{name}") is None:
                shutil.rmtree(f"{inside}/{name}", ignore_errors=True)
        if not os.listdir(inside):
            os.rmdir(inside)


def is_versioned(fs, output: str) -> bool:
    """Whether the output uses the earlier symlinked layout (`current` is a symlink into _versions/)."""
    current = f"{output}/{CURRENT}"
    return storage.is_local(fs) and os.path.islink(current) and os.readlink(current).startswith(f"{VERSIONS_DIR}/")


OWNER_FILE = ".owner"
_CLAIM_TRIES = 10  # tries of a claim's lock, 20 ms apart


LOCK_FILE = ".lock"
_CLAIMS: dict[str, int] = {}  # staging folder -> the descriptor holding its lock, for the life of the process


def claim_staging(fs, staging: str) -> None:
    """Mark a run's staging folder with its host and pid (local disks): other runs then neither
    collect it nor start beside it. An exclusive lock on its `.lock` file, held while this process
    lives (the kernel drops it however the process ends), makes two runs that would resume the same
    folder at once one run and one refusal."""
    if storage.is_local(fs):
        os.makedirs(staging, exist_ok=True)
        for name in (LOCK_FILE, OWNER_FILE):  # a symlink or FIFO planted in a folder a resumed run adopts: removed, never opened
            with contextlib.suppress(FileNotFoundError):
                if not stat.S_ISREG(os.lstat(f"{staging}/{name}").st_mode):
                    os.unlink(f"{staging}/{name}")
        if staging not in _CLAIMS:
            descriptor = os.open(f"{staging}/{LOCK_FILE}", os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0), 0o644)
            try:
                if not stat.S_ISREG(os.fstat(descriptor).st_mode):  # put back between the check above and the open
                    raise ConversionError(f"{staging}/{LOCK_FILE}: not a regular file; refusing to work in this staging folder")
                _lock(descriptor, staging)
            except BaseException:
                os.close(descriptor)
                raise
            _CLAIMS[staging] = descriptor
        # Non-blocking: a FIFO put there since the check above fails the open (no reader) instead of waiting for one.
        owner = os.open(f"{staging}/{OWNER_FILE}", os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0), 0o644)
        with os.fdopen(owner, "w") as handle:
            if not stat.S_ISREG(os.fstat(owner).st_mode):
                raise ConversionError(f"{staging}/{OWNER_FILE}: not a regular file; refusing to work in this staging folder")
            handle.truncate(0)
            handle.write(f"{socket.gethostname()} {os.getpid()}\n")


def _lock(descriptor: int, staging: str) -> None:
    """The claim's exclusive lock, tried for 0.2 s: another run's liveness check holds a shared lock
    on it for an instant (`_lock_held`), which is no reason to refuse."""
    import fcntl

    for attempt in range(_CLAIM_TRIES):
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if attempt + 1 < _CLAIM_TRIES:
                time.sleep(0.02)
        except OSError as error:  # no locks on this file system: nothing could say a run is live
            raise ConversionError(f"{staging}: cannot lock the staging folder ({error.strerror}); convert to a local disk "
                                  "that supports file locks") from None
    raise ConversionError(f"{staging}: another conversion is working in this staging folder (a resumption of "
                          "the same run); wait for it to finish")


def release_staging(staging: str) -> None:
    """Drop this process's lock on a staging folder (the run is over: published, removed or kept)."""
    descriptor = _CLAIMS.pop(staging, None)
    if descriptor is not None:
        os.close(descriptor)


def _live_owner(folder: str) -> int | None:
    """The pid of the live process on this machine that claimed `folder` (`claim_staging`), or
    None. Live means it still holds the folder's lock, which the kernel drops however the process
    ends: a pid since taken by another process (after a reboot; a container restarted, whose
    runs all have the same few pids) is not taken for the owner, which would refuse every later
    run of the output. Without a lock to ask (none, something planted in its place, a file system
    without locks) there is no live owner: an owner file naming a live pid is easy to plant."""
    if folder in _CLAIMS:
        return None  # this process's own
    descriptor = _open_regular(f"{folder}/{OWNER_FILE}")
    if descriptor is None:
        return None
    try:
        host, pid = os.read(descriptor, 1024).decode().split()
        owner = int(pid)
    except (OSError, ValueError):
        return None
    finally:
        os.close(descriptor)
    if host != socket.gethostname() or owner == os.getpid():
        return None
    return owner if _lock_held(f"{folder}/{LOCK_FILE}") else None


def _lock_held(path: str) -> bool:
    """Whether a process holds the exclusive lock of `path` (`claim_staging`'s): False when there is
    no such lock file to ask (none, or something else planted in its place)."""
    import fcntl

    descriptor = _open_regular(path)
    if descriptor is None:
        return False
    try:
        fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:  # no locks here (ENOLCK, EOPNOTSUPP): claim_staging could not have taken one either
        return False
    finally:
        os.close(descriptor)  # closing drops the shared lock, if it was taken
    return False


def _open_regular(path: str) -> int | None:
    """A descriptor of `path` when it is a regular file, else None: a FIFO planted in a staging
    folder (anyone who may write beside the output may make one) would block a plain open, and
    every later run of the output with it; a symlink is not followed."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        return None
    return descriptor


RUN_ID = re.compile(r"^[0-9]{8}T[0-9]{6}-[0-9a-f]{8}$")  # pipelines.session.new_run_id


def interrupted_stagings(fs, output: str) -> list[tuple[str, str]]:
    """(folder, run id) of the staging folders that runs for this output left behind and that no
    live run owns (on this machine), newest run first."""
    return [(folder, run) for folder, run in staging_folders(fs, output) if not has_live_owner(fs, folder)]


def staging_folders(fs, output: str) -> list[tuple[str, str]]:
    """(folder, run id) of every run's staging folder for this output, newest run first: the hidden
    siblings of the output (local disks, object stores) and `DST/_staging/<run>`."""
    found = []
    if storage.is_local(fs):
        mark = f".{os.path.basename(os.path.realpath(output))}{SIBLING_MARK}"
        for folder in _siblings(output):
            run = os.path.basename(folder)[len(mark):]
            if RUN_ID.match(run) and os.path.isdir(folder) and not os.path.islink(folder):  # a symlink: not a folder a run made
                found.append((folder, run))
    elif (split := _store_parent(output)) is not None:  # an object store's siblings, listed from the store
        parent, name = split
        mark = f".{name}{SIBLING_MARK}"
        fs.invalidate_cache(parent)
        for entry in fs.ls(parent, detail=True) if fs.exists(parent) else []:
            entry_name = entry["name"].rstrip("/").rsplit("/", 1)[-1]
            if entry.get("type") == "directory" and entry_name.startswith(mark) and RUN_ID.match(entry_name[len(mark):]):
                found.append((f"{parent}/{entry_name}", entry_name[len(mark):]))
    parent = f"{output}/{STAGING_DIR}"  # a mount point's, a bucket root's, and those of earlier versions
    if fs.exists(parent):
        for entry in fs.ls(parent, detail=True):
            run = entry["name"].rstrip("/").rsplit("/", 1)[-1]
            if entry.get("type") == "directory" and RUN_ID.match(run):
                found.append((f"{parent}/{run}", run))
    return sorted(found, key=lambda item: item[1], reverse=True)


def staging_markers(fs, output: str) -> list[str]:
    """The markers publications leave beside their staging folders on an object store
    (`<folder>.published`, `<folder>.done`), whether or not the folder is still there."""
    found = []
    for parent, mark in ([(f"{split[0]}", f".{split[1]}{SIBLING_MARK}")] if (split := _store_parent(output)) else []) + [
            (f"{output}/{STAGING_DIR}", "")]:
        if not fs.exists(parent):
            continue
        for entry in fs.ls(parent, detail=True):
            name = entry["name"].rstrip("/").rsplit("/", 1)[-1]
            run, _, suffix = name[len(mark):].rpartition(".")
            if entry.get("type") == "file" and name.startswith(mark) and suffix in (DONE, "published") and RUN_ID.match(run):
                found.append(f"{parent}/{name}")
    return found


def has_live_owner(fs, folder: str) -> bool:
    """Whether a live process on this machine owns a staging folder (local disks; elsewhere: no owner is known)."""
    return storage.is_local(fs) and _live_owner(folder) is not None


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


# Requests in flight while publishing on an object store. Left to itself gcsfs sends every copy
# of a folder at once (up to 1,280) and every batch of 100 deletes at once; a server that takes
# fewer connections drops the rest and the client sits in TCP retransmissions and retries: on the
# GCS emulator (one thread, a listen backlog of 5) 1,000 objects took 63 s to publish for 2 s of
# CPU on both sides. A bounded window keeps a store busy without flooding it.
IN_FLIGHT = 16
_DELETES_PER_REQUEST = 100  # GCS batch requests carry up to 100 deletes (gcsfs groups them so)


def _objects(fs, path: str) -> list[str]:
    """Every object at or under `path`, from one listing."""
    return sorted(fs.find(path)) if fs.exists(path) else []


def remove_paths(fs, files: list[str], folders: list[str] = ()) -> None:
    """Delete `files` and `folders` (with everything under them): IN_FLIGHT requests at a time on
    object stores, names holding glob characters one by one (`_delete`)."""
    if storage.is_local(fs):
        for path in [*files, *folders]:
            if fs.exists(path):
                fs.rm(path, recursive=True)
        return
    _delete(fs, sorted(files))
    for folder in folders:
        _remove(fs, folder)


def _remove(fs, path: str) -> None:
    """Delete `path` and everything under it, IN_FLIGHT requests at a time (local: one call)."""
    if storage.is_local(fs):
        fs.rm(path, recursive=True)
    else:
        _delete(fs, _objects(fs, path))
        fs.invalidate_cache(path)


def _delete(fs, objects: list[str]) -> None:
    """Delete listed objects in windows. fsspec reads a name holding `*`, `?` or `[` as a pattern
    (`mesh[1].stl` would match `mesh1.stl`, or nothing): such names are deleted one by one."""
    literal = [name for name in objects if not any(char in name for char in "*?[")]
    for name in objects:
        if name not in literal:
            fs.rm_file(name)
    window = IN_FLIGHT * _DELETES_PER_REQUEST
    for start in range(0, len(literal), window):
        fs.rm(literal[start:start + window])


def _move(fs, source: str, target: str) -> None:
    """A rename on a local disk (`target` must not exist); on object stores (no rename there)
    `move_files`. gcsfs' own `mv` was measured at 33 s per call against the GCS emulator (it
    probes a folder-rename API first)."""
    if storage.is_local(fs):
        fs.mv(source, target, recursive=True)
        return
    move_files(fs, source, target)


def move_files(fs, source: str, target: str, skip: frozenset[str] | set[str] = frozenset()) -> set[str]:
    """Every file under `source` to the same relative path under `target`, into folders that may
    already exist, but those under a top folder named in `skip`; returns the relative paths. A
    rename per file on a local disk; on object stores a server-side copy of every object listed
    once, IN_FLIGHT at a time. The staged objects are deleted with the staging folder after the
    publication is complete (`discard_staging`), not here: a publish step retried after a failure
    (Dataflow retries a bundle) then finds the staging complete and copies again, instead of
    removing the output's new files and finding nothing left to move."""
    local = storage.is_local(fs)
    root = source.rstrip("/")
    found = fs.find(source) if local else _objects(fs, source)  # a file: itself, moved to `target`
    relatives = [path[len(root):].lstrip("/") for path in found]
    pairs = [(path, relative) for path, relative in zip(found, relatives) if relative.split("/", 1)[0] not in skip]
    relatives = [relative for _, relative in pairs]
    destinations = [storage.join(target, relative) if relative else target for _, relative in pairs]
    if local:
        for (path, _), destination in zip(pairs, destinations):
            os.makedirs(os.path.dirname(destination), exist_ok=True)
            os.replace(path, destination)
    elif pairs:
        fs.copy([path for path, _ in pairs], destinations, batch_size=IN_FLIGHT)
    return set(relatives)


def copy_assets(fs, root: str, out_fs, staging: str, assets: list[str]) -> None:
    """Dataset-level files no row references (ORTF robot/ URDF and meshes), copied by the launcher
    into the staged files/_dataset/ so they are published with the rows (the plan lists them in
    mixtrain.json at those paths)."""
    for relative in assets:
        source = storage.resolve_inside(root, relative, what="asset", fs=fs)
        target = storage.join(staging, FILES_DIR, "_dataset", relative)
        out_fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
        out_fs.pipe_file(target, fs.cat_file(source))


def discard_staging(fs, staging: str, output: str) -> None:
    """Remove one run's staging folder, then `DST/_staging` if no other run uses it."""
    if fs.exists(staging):
        _remove(fs, staging)
    parent = f"{output}/{STAGING_DIR}"
    if staging.startswith(parent + "/") and fs.exists(parent) and not fs.ls(parent):
        fs.rm(parent, recursive=True)
