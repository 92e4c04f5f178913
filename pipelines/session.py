"""What one `convert` process sets up around a run so that its terminal shows only our lines.

- The log: file descriptor 2 is pointed at a log file, so Beam's logging, the workers (forked or
  cold, they inherit it), libraries writing to C stderr (SVT-AV1, FFmpeg, "terminate called ...")
  and any traceback land there. Our own lines go to `console`, a copy of the original stderr.
  `--verbose` also copies the log to the console.
- A private temporary folder (TMPDIR) for everything the run and its workers create, removed at
  the end whatever happened: Beam leaves `beam-pipeline-temp*` folders behind otherwise.
- SIGINT and SIGTERM raise `Interrupted`, so a run unwinds through the same clean-up as a failure.
"""

from __future__ import annotations

import logging
import os
import pathlib
import shutil
import signal
import sys
import tempfile
import threading
from typing import TextIO

from pipelines.local_workers import WorkerDied

__all__ = ["Interrupted", "LogError", "Session", "default_log_dir", "interrupted_by", "new_run_id", "remember_failed_log"]

# Default logs are kept by age and size, never by count (20 counted every run of the user, and a
# running conversion's own log was deleted under it): older than KEEP_DAYS, or past KEEP_BYTES
# together (oldest first), but never one a live run holds (a shared lock while it runs) nor the one
# the last `error:` line named (LAST_ERROR).
KEEP_DAYS = 14
KEEP_BYTES = 500 << 20
LAST_ERROR = ".last-error"
EXIT_SIGNALS = {signal.SIGINT: 130, signal.SIGTERM: 143}


class LogError(Exception):
    """--log_file names a place where no log can be written (a bad command line, exit 2)."""


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived: not an Exception, so no `except Exception` in Beam swallows it."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.exit_code = EXIT_SIGNALS[signum]

    def message(self) -> str:
        """The run's one line for it (after "error: "), wherever the interrupt unwound to."""
        return f"interrupted ({self}): the output was left as it was"


def new_run_id() -> str:
    """This run's name: its log, its staging folder and its temporary folder carry it."""
    import time
    import uuid

    return time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:8]


def default_log_dir() -> pathlib.Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "mixtrain-convert" / "logs"


_RECEIVED: list[int] = []  # the signals this process was interrupted by (`interrupted_by`)


def _raise_interrupted(signum, _frame):
    _RECEIVED.append(signum)
    raise Interrupted(signum)


def interrupted_by(error: BaseException) -> Interrupted | None:
    """The interrupt behind a failure: Beam's in-process runner wraps the Interrupted raised in a
    DoFn into a RuntimeError ("pipelines.session.Interrupted: SIGINT"), which is still the user's
    Ctrl-C (exit 130 and its one line), not a failed conversion."""
    seen, wrapped = set(), False
    while error is not None and id(error) not in seen:
        if isinstance(error, Interrupted):
            return error
        # A worker the same signal stopped (the whole process group gets a Ctrl-C) died of it.
        wrapped = wrapped or "session.Interrupted" in str(error) or isinstance(error, WorkerDied)
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return Interrupted(_RECEIVED[-1]) if _RECEIVED and wrapped else None


class Session:
    """Enter before the heavy imports' side effects and before local workers start; leave once."""

    def __init__(self, run_id: str, log_file: str | None, verbose: bool):
        self.run_id = run_id
        self._explicit = bool(log_file)
        self.log_path: pathlib.Path | None = pathlib.Path(log_file) if log_file else default_log_dir() / f"{run_id}.log"
        self._verbose = verbose

    def __enter__(self) -> Session:
        sys.stderr.flush()
        log_fd = self._open_log()
        self._saved_fd = os.dup(2)
        self.console: TextIO = os.fdopen(os.dup(2), "w", buffering=1)
        self._tee = None
        if self._verbose:  # a pipe on fd 2, copied to the log and the console by a thread
            read_end, write_end = os.pipe()
            os.dup2(write_end, 2)
            os.close(write_end)
            self._tee = threading.Thread(target=_tee, args=(read_end, log_fd, self._saved_fd), daemon=True)
            self._tee.start()
        else:
            os.dup2(log_fd, 2)
            os.close(log_fd)
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, force=True,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        self._temp = tempfile.mkdtemp(prefix=f"mixtrain-convert-{self.run_id}-")
        self._saved_tmpdir = os.environ.get("TMPDIR")
        os.environ["TMPDIR"] = self._temp
        tempfile.tempdir = self._temp
        self._saved_handlers = {signum: signal.signal(signum, _raise_interrupted) for signum in EXIT_SIGNALS}
        return self

    def _open_log(self) -> int:
        """The log's file descriptor. A --log_file that cannot be written is a bad command line
        (LogError); an unwritable default location (a read-only home) falls back to the system's
        temporary folder, then to no log at all (`log_path` None)."""
        candidates = [self.log_path] if self._explicit else [self.log_path, pathlib.Path(tempfile.gettempdir()) /
                                                             "mixtrain-convert-logs" / self.log_path.name]
        for path in candidates:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                if path.parent == default_log_dir():
                    _prune(path.parent)
                descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                _hold(descriptor)
            except OSError as error:
                if self._explicit:
                    raise LogError(f"--log_file={path}: cannot write the log: {error.strerror or error}") from None
                continue
            self.log_path = path
            return descriptor
        self.log_path = None
        return os.open(os.devnull, os.O_WRONLY)

    def ignore_signals(self) -> None:
        """While cleaning up after a failure or an interrupt: a second Ctrl-C must not cut it short."""
        for signum in EXIT_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)

    def close(self) -> None:
        self.__exit__(None, None, None)

    def leave_now(self, code: int) -> None:
        """End the process from any thread (the early planner's reader, while the main thread is
        in Beam's import): what was printed and logged flushed, the temporary folder removed, and
        nothing else of the interpreter's teardown (signal handlers are the main thread's)."""
        sys.stderr.flush()
        self.console.flush()
        for handler in logging.getLogger().handlers:
            handler.flush()
        shutil.rmtree(self._temp, ignore_errors=True)
        if self._tee is not None:
            os.dup2(self._saved_fd, 2)  # the tee's pipe loses its writer: what it holds reaches the log
            self._tee.join(timeout=2)
        os._exit(code)

    def __exit__(self, *exc_info) -> None:
        self.ignore_signals()
        tempfile.tempdir = None
        if self._saved_tmpdir is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = self._saved_tmpdir
        shutil.rmtree(self._temp, ignore_errors=True)
        sys.stderr.flush()
        logging.shutdown()
        os.dup2(self._saved_fd, 2)  # the tee's pipe loses its last writer here (local workers are gone)
        os.close(self._saved_fd)
        self.console.close()
        if self._tee is not None:
            self._tee.join(timeout=2)
        for signum, handler in self._saved_handlers.items():
            signal.signal(signum, handler)


def _tee(read_end: int, log_fd: int, console_fd: int) -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, tuple(EXIT_SIGNALS))  # signals are the main thread's to take (early_plan.start)
    with os.fdopen(read_end, "rb", buffering=0) as source:
        while chunk := source.read(65536):
            os.write(log_fd, chunk)
            try:
                os.write(console_fd, chunk)
            except OSError:
                pass
    os.close(log_fd)


def _prune(folder: pathlib.Path) -> None:
    """Remove default logs past KEEP_DAYS, or past KEEP_BYTES together (oldest first), but those a
    live run holds and the one the last error named."""
    import time

    try:
        named = (folder / LAST_ERROR).read_text().strip()
    except OSError:
        named = ""
    found = []
    for path in folder.glob("*.log"):
        try:
            info = path.stat()
        except OSError:  # removed by a run starting at the same time
            continue
        found.append((info.st_mtime, info.st_size, path))
    total, now = 0, time.time()
    for mtime, size, path in sorted(found, key=lambda item: item[0], reverse=True):
        total += size
        if (now - mtime > KEEP_DAYS * 86400 or total > KEEP_BYTES) and path.name != named and not _held(path):
            path.unlink(missing_ok=True)


def _hold(descriptor: int) -> None:
    """A shared lock on the run's log for as long as the run lives: `_prune` leaves it alone."""
    import fcntl

    try:
        fcntl.flock(descriptor, fcntl.LOCK_SH)  # waits out another run's probe (`_held`), which lasts an instant
    except OSError:
        pass


def _held(path: pathlib.Path) -> bool:
    """Whether a live run holds the log (its shared lock, `Session._open_log`)."""
    import errno
    import fcntl

    try:
        descriptor = os.open(path, os.O_RDWR)  # read-write: where flock is emulated by POSIX locks, an exclusive one needs it
    except OSError:
        return False
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError as error:
        return error.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
    finally:
        os.close(descriptor)


def remember_failed_log(path: str | os.PathLike | None) -> None:
    """The log an `error:` line names is kept by `_prune` until another error names another."""
    if path is None:
        return
    path = pathlib.Path(path)
    if path.parent == default_log_dir():
        try:
            (path.parent / LAST_ERROR).write_text(path.name + "\n")
        except OSError:
            pass
