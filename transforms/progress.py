"""Progress of a run, counted where the work happens: Beam counters, and a live feed for the launcher.

Beam counters (namespace `mixtrain`) are what the Dataflow UI shows; a local runner only hands
them back when the run has ended. So a local launcher also names an abstract Unix datagram
socket in MIXTRAIN_PROGRESS_SOCKET (inherited by every local worker, forked or cold), and each
report is also sent there as one small JSON datagram. Remote workers have no such variable and
only count. A report never fails the work it describes.
"""

from __future__ import annotations

import json
import os
import socket

from apache_beam.metrics import Metrics

__all__ = ["ENV", "FIELDS", "NAMESPACE", "report"]

ENV = "MIXTRAIN_PROGRESS_SOCKET"
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
