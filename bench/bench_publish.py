"""Publishing on an object store: N staged objects moved into place on the GCS emulator, with the
client's cost and the emulator's measured apart.

    python bench/bench_publish.py [--objects=10000] [--stock]

A run stages N small video objects (files/<camera>/<episode>.mp4), a few Parquet shards and
stats.json under DST/_staging/<run>/, then publishes them (formats/mixtrain/publish.py) on a
gcp-storage-emulator serving on loopback in its own process, and checks the result (every object
in place, no staging left, mixtrain.json written). The baseline is the publication as it was
before this benchmark's change (`baseline_publish` below, kept verbatim), measured in the same run
on the same emulator.

The emulator is not a model of GCS: it serves one request at a time (http.server, one thread),
and on every write or delete it serialises the metadata of every object it holds (json.dumps with
indent, pure Python) and keeps a copy of each deleted object (soft delete, 7 days by default), so
each request costs O(objects held). At 2,000 objects that alone is minutes. By default the
emulator here runs "lean": that dump (only used to persist a disk-backed emulator across restarts;
this one is in memory) and the soft-delete copy are switched off, which leaves a constant cost per
request, closer to what a real store charges a client. `--stock` runs it unmodified (use a small
--objects). Both wall time and the two processes' CPU (ours, the emulator's) are reported.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import resource
import socket
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

EMULATOR = r"""
import logging, socketserver, sys
from gcp_storage_emulator import server, storage
# A client that gives up on a response (the baseline's flooded backlog) is not news: no traceback.
socketserver.BaseServer.handle_error = lambda self, request, client_address: None
if sys.argv[2] == "lean":
    storage.Storage._write_config_to_file = lambda self: None  # O(objects) JSON dump on every write
    storage.DEFAULT_SOFT_DELETE_RETENTION_SECONDS = 0  # deletes keep no copy
logging.getLogger("gcp_storage_emulator").setLevel(logging.ERROR)
emulator = server.create_server("127.0.0.1", int(sys.argv[1]), in_memory=True, default_bucket="bucket")
emulator.start()
print("ready", flush=True)
sys.stdin.read()
emulator.stop()
"""


def baseline_publish(fs, staging: str, output: str, sidecar_value: dict) -> None:
    """formats/mixtrain/publish.py `publish` on an object store before this change (for the comparison)."""
    from formats.mixtrain import DATA_DIR, ERRORS_FILE, FILES_DIR, FINGERPRINTS_FILE, SIDECAR, STATS_FILE, dumps
    from formats.mixtrain.publish import discard_staging

    for name in (ERRORS_FILE, FINGERPRINTS_FILE):
        if not fs.exists(f"{staging}/{name}"):
            fs.pipe_file(f"{staging}/{name}", b"")
    sidecar_path = f"{output}/{SIDECAR}"
    if fs.exists(sidecar_path):
        fs.rm(sidecar_path)
    for name in (DATA_DIR, FILES_DIR, STATS_FILE, ERRORS_FILE, FINGERPRINTS_FILE):
        target, source = f"{output}/{name}", f"{staging}/{name}"
        if fs.exists(target):
            fs.rm(target, recursive=True)
        if fs.exists(source):
            fs.copy(source, target, recursive=True)
            fs.rm(source, recursive=True)
    fs.pipe_file(sidecar_path, dumps(sidecar_value).encode())
    discard_staging(fs, staging, output)


def _cpu_of(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _stage(fs, staging: str, objects: int) -> dict[str, bytes]:
    """What a run leaves in staging: N small videos over 3 cameras, 4 shards, stats."""
    staged = {f"{staging}/files/camera_{i % 3}/episode_{i:06d}.mp4": b"v" * (500 + i % 7) for i in range(objects)}
    staged.update({f"{staging}/data/part-{i:05d}.parquet": b"p" * 4000 for i in range(4)})
    staged[f"{staging}/stats.json"] = b"{}"
    fs.pipe(staged, batch_size=8)  # the emulator drops connections beyond a few at a time
    return staged


def _check(fs, staged: dict, staging: str, output: str) -> None:
    published = set(fs.find(output))
    expected = {path.replace(staging, output) for path in staged}
    missing = expected - published
    if missing or any(path.startswith(f"{output}/_staging") for path in published) or f"{output}/mixtrain.json" not in published:
        raise SystemExit(f"publication incomplete: {len(missing)} objects missing, staging left: "
                         f"{any(p.startswith(f'{output}/_staging') for p in published)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=10_000)
    parser.add_argument("--stock", action="store_true", help="the emulator unmodified (O(objects held) per request)")
    args = parser.parse_args()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    emulator = subprocess.Popen([sys.executable, "-c", EMULATOR, str(port), "stock" if args.stock else "lean"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert emulator.stdout.readline().strip() == "ready"
        os.environ["STORAGE_EMULATOR_HOST"] = f"http://127.0.0.1:{port}"
        os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
        from formats import storage
        from formats.mixtrain import publish

        results = {}
        for label, publish_fn in (("baseline", baseline_publish), ("now", publish.publish)):
            fs, output = storage.open_root(f"gs://bucket/{label}")
            staging = f"{output}/_staging/run"
            started = time.perf_counter()
            staged = _stage(fs, staging, args.objects)
            staged_s = time.perf_counter() - started
            fs.invalidate_cache()
            wall, cpu, server_cpu = time.perf_counter(), _own_cpu(), _cpu_of(emulator.pid)
            publish_fn(fs, staging, output, {"format": "mixtrain", "bench": True})
            wall, cpu, server_cpu = time.perf_counter() - wall, _own_cpu() - cpu, _cpu_of(emulator.pid) - server_cpu
            fs.invalidate_cache()
            _check(fs, staged, staging, output)
            results[label] = (wall, cpu, server_cpu)
            print(f"  {label:<9} staged {len(staged)} objects in {staged_s:6.1f} s; publish wall {wall:7.2f} s, "
                  f"client CPU {cpu:6.2f} s, emulator CPU {server_cpu:6.2f} s", file=sys.stderr)
            fs.rm(output, recursive=True)
        print(f"\npublish {args.objects} objects on the GCS emulator ({'stock' if args.stock else 'lean'})")
        print(f"{'':<10}{'wall s':>9}{'client CPU s':>14}{'emulator CPU s':>16}")
        for label, (wall, cpu, server_cpu) in results.items():
            print(f"{label:<10}{wall:9.2f}{cpu:14.2f}{server_cpu:16.2f}")
        (b_wall, b_cpu, b_srv), (n_wall, n_cpu, n_srv) = results["baseline"], results["now"]
        print(f"speed-up: wall {b_wall / n_wall:.2f}x (target >= 8), client CPU {b_cpu / max(n_cpu, 1e-9):.2f}x, "
              f"emulator CPU {b_srv / max(n_srv, 1e-9):.2f}x")
    finally:
        emulator.stdin.close()
        emulator.wait(timeout=30)


if __name__ == "__main__":
    main()
