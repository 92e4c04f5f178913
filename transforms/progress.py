"""Progress of a run, counted where the work happens: Beam counters, and a live feed for the launcher.

Beam counters (namespace `mixtrain`) are what the Dataflow UI shows; a local runner only hands
them back when the run has ended. So a local launcher also names an abstract Unix datagram
socket in MIXTRAIN_PROGRESS_SOCKET (inherited by every local worker, forked or cold), and the
reports are also sent there as small JSON datagrams. A Dask worker, on any machine, sends its
reports as events of the topic DASK_TOPIC to the scheduler, which passes them to the launcher's
client (pipelines/dask_runner.py forwards them to that socket). Dataflow workers have neither
and only count. A report never fails the work it describes.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time

__all__ = ["ENV", "DASK_TOPIC", "FIELDS", "NAMESPACE", "report", "flush"]

ENV = "MIXTRAIN_PROGRESS_SOCKET"
DASK_TOPIC = "mixtrain-progress"
NAMESPACE = "mixtrain"
# What is counted: the Beam counter `mixtrain/<name>` and the key of the datagram.
FIELDS = {
    "sequences": "sequences_converted",
    "timesteps": "timesteps_converted",
    "bytes": "bytes_written",
    "skipped": "sequences_skipped",
    "shards": "shards_written",
}

# Reports are sent at most every SEND_SECONDS per worker, summed in between (a datagram per
# sequence cost 0.17 ms of the worker's time at 20,000 short episodes); a thread sends what is
# left, and the DoFns that report call `flush` when a bundle ends.
SEND_SECONDS = 0.1
_sender: tuple[int, socket.socket] | None = None  # (pid, socket): a forked worker opens its own
_pending: dict[str, dict[str, int]] = {}  # socket name (one per run) -> counts not sent yet
_last_sent = 0.0
_flushing = False
_lock = threading.Lock()


def _after_fork() -> None:
    global _lock, _flushing, _last_sent
    _lock, _flushing, _last_sent = threading.Lock(), False, 0.0
    _pending.clear()


os.register_at_fork(after_in_child=_after_fork)


def report(**counts: int) -> None:
    """Add `counts` (keys of FIELDS) to the run's totals."""
    global _flushing
    from apache_beam.metrics import Metrics  # here: the launcher's receiver (pipelines/progress.py) imports this module before Beam

    for key, value in counts.items():
        if value:
            Metrics.counter(NAMESPACE, FIELDS[key]).inc(int(value))
    if "distributed" in sys.modules and _dask_event(counts):
        return
    name = os.environ.get(ENV)
    if not name:
        return
    with _lock:
        pending = _pending.setdefault(name, {})
        for key, value in counts.items():
            if value:
                pending[key] = pending.get(key, 0) + int(value)
        if time.monotonic() - _last_sent < SEND_SECONDS:
            if not _flushing:
                _flushing = True
                threading.Thread(target=_flush_later, daemon=True, name="mixtrain-progress-send").start()
            return
        batches = _take()
    _send(batches)


def flush() -> None:
    """Send what is pending now (the end of a bundle: the worker may be stopped soon after)."""
    with _lock:
        batches = _take()
    _send(batches)


def _take() -> dict[str, dict[str, int]]:
    global _last_sent
    batches = {name: counts for name, counts in _pending.items() if counts}
    _pending.clear()
    _last_sent = time.monotonic()
    return batches


def _flush_later() -> None:
    global _flushing
    while True:
        time.sleep(SEND_SECONDS)
        with _lock:
            batches = _take()
            if not batches:
                _flushing = False
                return
        _send(batches)


def _send(batches: dict[str, dict[str, int]]) -> None:
    global _sender
    if not batches:
        return
    if _sender is None or _sender[0] != os.getpid():
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.settimeout(1.0)
        _sender = (os.getpid(), sock)
    for name, counts in batches.items():
        try:
            _sender[1].sendto(json.dumps(counts).encode(), "\0" + name)
        except OSError:  # the launcher is gone or slow: progress is best effort, the work is not
            pass


def _dask_event(counts: dict) -> bool:
    """On a Dask worker: the counts as an event to the launcher's client; False elsewhere."""
    try:
        from distributed import get_worker

        worker = get_worker()
    except (ImportError, ValueError):  # not in a Dask worker
        return False
    try:
        worker.log_event(DASK_TOPIC, counts)
    except Exception:  # noqa: BLE001 - progress is best effort, the work is not
        pass
    return True
