"""The GCS emulator (gcp-storage-emulator, a test dependency) on a free loopback port, with a
bucket `bucket`: what the gs:// tests and the docs test run against."""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Iterator

import pytest


@contextlib.contextmanager
def running() -> Iterator[str]:
    """The emulator serving while the block runs; yields its URL (for STORAGE_EMULATOR_HOST)."""
    emulator = pytest.importorskip("gcp_storage_emulator.server", reason="gcp-storage-emulator is a test dependency (pip install -e .[test])")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = emulator.create_server("127.0.0.1", port, in_memory=True, default_bucket="bucket")
    server.start()
    logging.getLogger("gcp_storage_emulator").setLevel(logging.CRITICAL)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()
