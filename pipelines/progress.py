"""Live progress on the launcher of a local run: sequences done of total, timesteps, MB, rate, ETA.

Workers report through `transforms.progress.report` (one datagram per sequence or shard to the
abstract socket this module binds); a thread adds them up and draws one line: redrawn in place on
a terminal, or printed every `interval` seconds otherwise (logs, CI, nightly jobs).
"""

from __future__ import annotations

import json
import os
import socket
import struct
import threading
import time
import uuid
from typing import TextIO

from transforms.progress import ENV, FIELDS

__all__ = ["Progress", "line"]

REDRAW_SECONDS = 0.5


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def line(totals: dict, total: int | None, shards: int, elapsed: float) -> str:
    """The progress line for `totals` (FIELDS keys) after `elapsed` seconds of conversion."""
    done = totals["sequences"] + totals["skipped"]
    parts = [f"{done}/{total} sequences ({100 * done / total:.0f}%)" if total else f"{done} sequences"]
    parts.append(f"{totals['timesteps']} timesteps")
    parts.append(f"{totals['bytes'] / 1e6:.1f} MB written")
    rate = done / elapsed if elapsed > 0 else 0.0
    if rate:
        parts.append(f"{rate:.1f} sequences/s")
    if total and rate and done < total:
        parts.append(f"ETA {_duration((total - done) / rate)}")
    if totals["shards"]:
        parts.append(f"{totals['shards']}/{shards} shards")
    if totals["skipped"]:
        parts.append(f"{totals['skipped']} skipped")
    return "[mixtrain-convert] " + ", ".join(parts)


RECEIVE_SECONDS = 0.2  # the receiver's wait on its socket between looks at whether the run ended
_MOST = 1 << 48  # no report of a run counts this much (a count of bytes included)
# struct ucred (pid, uid, gid) where the kernel passes senders' credentials (Linux), else nothing.
_CREDENTIALS = struct.Struct("iII") if hasattr(socket, "SO_PASSCRED") and hasattr(socket, "SCM_CREDENTIALS") else struct.Struct("")


def _descends_from(pid: int, ancestor: int) -> bool | None:
    """Whether process `pid` is `ancestor` or below it (its parents read from /proc); None when
    `pid` itself is gone (or /proc cannot be read)."""
    first = True
    for _ in range(64):
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
        try:
            with open(f"/proc/{pid}/stat") as handle:
                pid = int(handle.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return None if first else False
        first = False
    return False


class Progress:
    """Collects the workers' reports while a local run goes on; `mode` is bar, lines or off."""

    def __init__(self, console: TextIO, mode: str, interval: float, total: int | None, shards: int):
        self._console = console
        self._mode = mode
        self._interval = interval
        self._total = total
        self._shards = shards
        self.totals = dict.fromkeys(FIELDS, 0)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._name = f"mixtrain-progress-{os.getpid()}-{uuid.uuid4().hex}"
        self._wake_token = uuid.uuid4().bytes  # the end of the run, told apart from anything else sent to the socket
        self._entered = self._left = False
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        if _CREDENTIALS.size:  # the kernel then says which process sent each datagram
            self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self._senders: dict[int, bool] = {}  # pid -> whether it is this run's
        self._socket.bind("\0" + self._name)
        self._socket.settimeout(RECEIVE_SECONDS)
        self._threads = [threading.Thread(target=self._receive, daemon=True, name="mixtrain-progress-receive")]
        if mode != "off":
            self._threads.append(threading.Thread(target=self._draw, daemon=True, name="mixtrain-progress-draw"))

    def __enter__(self) -> Progress:
        self._saved = os.environ.get(ENV)
        self._entered = True
        os.environ[ENV] = self._name  # workers started from now on inherit it
        self._started = time.monotonic()
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        if self._left:
            return
        self._left = True
        try:
            self._stop.set()
            self._wake()
            for thread in self._threads:
                if thread.ident is not None:  # started
                    thread.join(timeout=2)
        finally:  # an interrupt during the wake-up or the joins still closes the socket and restores the variable
            self._socket.close()
            if self._entered and os.environ.get(ENV) == self._name:
                if self._saved is None:
                    os.environ.pop(ENV, None)
                else:
                    os.environ[ENV] = self._saved

    def _wake(self) -> None:
        """Wake the receiver now, after the reports already queued, not at its next timeout. The
        queue may be full (10 datagrams): retried while the receiver drains it, never blocking
        (a receiver gone quiet would block a plain send for good), for at most its timeout."""
        deadline = time.monotonic() + RECEIVE_SECONDS + 0.05
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as waker:
            while True:
                try:
                    waker.sendto(self._wake_token, socket.MSG_DONTWAIT, "\0" + self._name)
                    return
                except BlockingIOError:
                    if time.monotonic() > deadline or not self._threads[0].is_alive():
                        return
                    time.sleep(0.002)
                except OSError:
                    return

    def _receive(self) -> None:
        credentials = _CREDENTIALS.size
        while True:
            try:
                data, ancillary, _, _ = self._socket.recvmsg(4096, socket.CMSG_SPACE(credentials) if credentials else 0)
            except TimeoutError:
                if self._stop.is_set():
                    return
                continue
            except OSError:
                return
            if data == self._wake_token:  # __exit__'s wake-up: every report sent before it has been read
                return
            if not self._from_this_run(ancillary):  # anyone on the machine can send to the socket
                continue
            try:
                counts = json.loads(data)
            except (ValueError, RecursionError):
                continue
            if isinstance(counts, dict):
                self.add(counts)

    def _from_this_run(self, ancillary: list) -> bool:
        """Whether the kernel says the datagram came from this process or one it started (the
        local runner's workers); where it says nothing (no SO_PASSCRED), every datagram counts."""
        if not _CREDENTIALS.size:
            return True
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == getattr(socket, "SCM_CREDENTIALS", None) and len(data) >= _CREDENTIALS.size:
                pid, uid, _ = _CREDENTIALS.unpack_from(data)
                if self._senders.get(pid):
                    return True
                ours = _descends_from(pid, os.getpid())
                if ours is None:  # gone before its report was read (a worker reaped at the end): its user tells
                    return uid == os.getuid()
                if ours:  # only the run's own are remembered (a pid reused later by another process is asked again)
                    self._senders[pid] = True
                return ours
        return False

    def add(self, counts: dict) -> None:
        """One worker's report (bench/timed_convert.py also stamps its time): known counts, each a
        whole number a run can reach (a 4,000-digit one killed the drawing thread)."""
        with self._lock:
            for key, value in counts.items():
                if key in self.totals and isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _MOST:
                    self.totals[key] += value

    def current(self) -> str:
        with self._lock:
            totals = dict(self.totals)
        return line(totals, self._total, self._shards, time.monotonic() - self._started)

    def _draw(self) -> None:
        shown, last_line = "", time.monotonic()
        while not self._stop.wait(REDRAW_SECONDS):
            text = self.current()
            try:
                if self._mode == "bar":
                    self._console.write("\r" + text + "\x1b[K")
                    self._console.flush()
                elif text != shown and time.monotonic() - last_line >= self._interval:
                    self._console.write(text + "\n")
                    self._console.flush()
                    shown, last_line = text, time.monotonic()
            except (OSError, ValueError):  # the console went away: the run goes on
                return
        if self._mode == "bar":
            try:
                self._console.write("\r\x1b[K")
                self._console.flush()
            except (OSError, ValueError):
                pass
