"""A local S3 server (moto's server mode, a test dependency) on a free loopback port, with a bucket
`bucket`: what the s3:// tests and the docs test run against, reached through the standard AWS
environment variables (as a user's MinIO or Ceph store is)."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Iterator

import pytest

KEY = "testing"  # moto accepts any key; the variables must be set, as for a real store


def environment(url: str) -> dict[str, str]:
    """The variables a user sets for an S3-compatible store at `url` (docs/options.md, Storage)."""
    return {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": KEY, "AWS_REGION": "us-east-1",
            # Nothing of this machine's own AWS set-up (profiles, ~/.aws, the EC2 metadata service) takes part.
            "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull, "AWS_EC2_METADATA_DISABLED": "true"}


def clear_clients() -> None:
    """Forget cached s3fs instances (they keep the endpoint and keys they were made with)."""
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()


@contextlib.contextmanager
def running(bucket: str = "bucket") -> Iterator[str]:
    """The server serving while the block runs, `bucket` created; yields its URL (for AWS_ENDPOINT_URL)."""
    server_module = pytest.importorskip("moto.server", reason="moto[server] is a test dependency (pip install -e .[test])")
    pytest.importorskip("s3fs", reason="s3fs is a dependency (pip install -e .)")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # not a log line per request on stderr
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    try:
        import s3fs

        s3fs.S3FileSystem(endpoint_url=url, key=KEY, secret=KEY, skip_instance_cache=True).mkdir(bucket)
        yield url
    finally:
        server.stop()
