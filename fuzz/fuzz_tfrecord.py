"""Harness: TFRecord framing and checksums (formats/sources/rlds/tfrecord.py).

Contract, per input (a shard's bytes): `scan` over the whole file and `read_record` of every record
it yields raise nothing but FormatError, and every record read is exactly its declared length.
At most 1 s and 256 MiB per input (fuzz/contract.py): a header declaring a 64 GiB record in a
small file must be refused before anything is read for it.
"""

from __future__ import annotations

import glob
import io
import os

from formats.sources.rlds import tfrecord
from fuzz.contract import ContractViolation, fixtures_dir

MAX_LEN = 4096
SMOKE_RUNS = 2000


def prepare(work: str) -> list[bytes]:
    """Seeds: records the product's writer frames (empty, short, a few hundred bytes) and the
    first 4 KiB of the fixture's shard (its first record cut short: a truncation seed)."""
    seeds = []
    for records in ([], [b""], [b"abc"], [b"x" * 300, b"", bytes(range(256))]):
        out = io.BytesIO()
        tfrecord.write_records(out, records)
        seeds.append(out.getvalue())
    root = fixtures_dir()
    if root:
        for path in sorted(glob.glob(os.path.join(root, "rlds", "*", "*", "*.tfrecord-*")))[:1]:
            with open(path, "rb") as handle:
                seeds.append(handle.read(MAX_LEN))
    return seeds


def one_input(data: bytes) -> None:
    handle = io.BytesIO(data)
    for offset, length in list(tfrecord.scan(handle, len(data))):
        record = tfrecord.read_record(handle, offset, length)
        if len(record) != length:
            raise ContractViolation(f"record at {offset}: {len(record)} bytes, declared {length}")
