"""Progress of a run, counted where the work happens: Beam counters, and a live feed for the launcher.

Beam counters (namespace `mixtrain`) are what the Dataflow UI shows; a local runner only hands
them back when the run has ended. So a local launcher also names an abstract Unix datagram
socket in MIXTRAIN_PROGRESS_SOCKET (inherited by every local worker, forked or cold), and each
report is also sent there as one small JSON datagram. A Dask worker, on any machine, sends its
reports as events of the topic DASK_TOPIC to the scheduler, which passes them to the launcher's
client (pipelines/dask_runner.py forwards them to that socket). Dataflow workers have neither
and only count. A report never fails the work it describes.
"""

from __future__ import annotations

import json
import os
import socket
import sys

from apache_beam.metrics import Metrics

__all__ = ["ENV", "DASK_TOPIC", "FIELDS", "NAMESPACE", "report"]

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

_sender: tuple[int, socket.socket] | None = None  # (pid, socket): a forked worker opens its own


def report(**counts: int) -> None:
    """Add `counts` (keys of FIELDS) to the run's totals."""
    for key, value in counts.items():
        if value:
            Metrics.counter(NAMESPACE, FIELDS[key]).inc(int(value))
    if "distributed" in sys.modules and _dask_event(counts):
        return
    name = os.environ.get(ENV)
    if not name:
        return
    global _sender
    if _sender is None or _sender[0] != os.getpid():
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.settimeout(1.0)
        _sender = (os.getpid(), sock)
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
