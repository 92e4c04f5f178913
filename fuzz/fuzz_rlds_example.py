"""Harness: RLDS example decoding (formats/sources/rlds/records.py: one tf.train.Example -> a Sequence).

Input: one byte choosing the dataset whose features.json decodes it (the product's synthetic RLDS
sample, or the real bridge fixture when ../shared/fixtures is present), then the record's bytes,
framed into a one-record shard with valid checksums (so the decoding, not the framing, is fuzzed).
Contract: `Reader.load` raises nothing but ConversionError, within 1 s and 256 MiB
(fuzz/contract.py); a zlib tensor must not inflate past its declared shape.
"""

from __future__ import annotations

import glob
import os

import fsspec

from formats import storage
from formats.sources import rlds
from formats.sources.rlds import tfrecord
from formats.sources.rlds.records import Reader, RecordRef
from formats.sources.rlds.sample import SyntheticRLDS, write_dataset
from fuzz.contract import fixtures_dir

MAX_LEN = 200_000
SMOKE_RUNS = 300
_READERS: list[Reader] = []
_SHARD = "fuzz.tfrecord"


def _records(fs, root: str, shard) -> list[bytes]:
    path = storage.join(root, shard.path)
    with fs.open(path, "rb") as handle:
        return [tfrecord.read_record(handle, offset, length) for offset, length in tfrecord.scan(handle, fs.size(path))]


def prepare(work: str) -> list[bytes]:
    """Bases and seeds: the sample's records (every column kind, zlib tensors included) and the
    fixture's two smallest records."""
    sample = os.path.join(work, "rlds_sample", "1.0.0")
    write_dataset(sample, SyntheticRLDS())
    bases = [(sample, {"fps": 10})]
    root = fixtures_dir()
    bridge = sorted(glob.glob(os.path.join(root, "rlds", "*", "*"))) if root else []
    if bridge:
        bases.append((bridge[0], {"fps": 5}))
    seeds = []
    shard_root = os.path.join(work, "rlds_shard")
    os.makedirs(shard_root, exist_ok=True)
    for number, (path, options) in enumerate(bases):
        fs, base_root = storage.open_root(path)
        meta, shards = rlds.plan(fs, base_root, options)
        shard_fs, shard_root_url = storage.open_root(shard_root)
        _READERS.append(Reader(shard_fs, shard_root_url, meta))
        records = sorted(_records(fs, base_root, shards[0]), key=len)[:2]
        seeds += [bytes([number]) + record for record in records if len(record) < MAX_LEN]
    return seeds


def one_input(data: bytes) -> None:
    if not data:
        return
    reader = _READERS[data[0] % len(_READERS)]
    record = data[1:]
    with open(os.path.join(reader.root, _SHARD), "wb") as handle:
        tfrecord.write_records(handle, [record])
    reader.load(RecordRef("train", 0, 0, _SHARD, 12, len(record), "train_00000_000000"))


del fsspec  # imported for the type of Reader.fs only
