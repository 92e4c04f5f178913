"""A local S3 server (moto's server mode, a test dependency) on a free loopback port, with a bucket
`bucket`: what the s3:// tests and the docs test run against, reached through the standard AWS
environment variables (as a user's MinIO or Ceph store is)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
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


def _listens(pid: int, port: int) -> bool:
    """Whether process `pid` holds the socket listening on loopback `port` (/proc/net/tcp's inode
    among the process's descriptors)."""
    inodes = set()
    with open("/proc/net/tcp") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # LISTEN
                inodes.add(fields[9])
    try:
        held = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
    except OSError:
        return False
    return any(f"socket:[{inode}]" in held for inode in inodes)


def _start() -> tuple[subprocess.Popen, int]:
    """moto's server on a free port, answering. A port found free may be taken before moto binds
    it (test files run side by side): moto then exits, and another port is tried; a server answers
    for us only when our process holds the listening socket."""
    for _ in range(5):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while server.poll() is None and time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
            except OSError:
                time.sleep(0.1)
                continue
            if _listens(server.pid, port):  # not another process's server on a port taken meanwhile
                return server, port
            time.sleep(0.1)
        if server.poll() is None:
            server.terminate()
            server.wait(timeout=30)
    raise RuntimeError("moto's S3 server did not start (five ports tried)")


@contextlib.contextmanager
def running(bucket: str = "bucket") -> Iterator[str]:
    """The server serving while the block runs, `bucket` created; yields its URL (for AWS_ENDPOINT_URL).

    A process of its own, not moto's in-process ThreadedMotoServer: delta-rs holds the GIL through
    some calls (`DeltaTable.history`), so a server thread of this interpreter could not answer them
    and the call waited out its 180 s timeout."""
    pytest.importorskip("moto.server", reason="moto[server] is a test dependency (pip install -e .[test])")
    pytest.importorskip("s3fs", reason="s3fs is installed by setup.py's s3 and test extras")
    server, port = _start()
    url = f"http://127.0.0.1:{port}"
    try:
        import s3fs

        s3fs.S3FileSystem(endpoint_url=url, key=KEY, secret=KEY, skip_instance_cache=True).mkdir(bucket)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


@contextlib.contextmanager
def serving_this_process() -> Iterator[str]:
    """The server running and this process's AWS variables pointing at it while the block runs
    (restored after, cached clients forgotten): what the s3:// test modules' fixtures hold."""
    with running() as url:
        variables = environment(url)
        saved = {key: os.environ.get(key) for key in [*variables, "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION", "AWS_PROFILE"]}
        for key in ("AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
            os.environ.pop(key, None)
        os.environ.update(variables)
        clear_clients()
        try:
            yield url
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            clear_clients()
