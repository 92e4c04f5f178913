"""Harness: RLDS example decoding (formats/sources/rlds/records.py: one tf.train.Example -> a Sequence).

Input: one byte choosing the dataset whose features.json decodes it (the product's synthetic RLDS
sample, or the real bridge fixture when ../shared/fixtures is present) and the mode: raw (the rest
is the record's bytes) or structured (an atheris.FuzzedDataProvider edits one of that dataset's real
Examples as a protobuf: a feature's values cut, repeated or emptied, its kind changed, its bytes
replaced by a zlib bomb or hostile bytes, a feature removed or added). The record is framed into a
one-record shard with valid checksums, so the decoding, not the framing, is fuzzed.
Contract: `Reader.load` raises nothing but ConversionError, within 1 s and 256 MiB
(fuzz/contract.py); a zlib tensor must not inflate past its declared shape.
"""

from __future__ import annotations

import glob
import os
import zlib

import atheris
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
_EXAMPLES: list[list[bytes]] = []  # per reader: its dataset's smallest records
_BOMB = zlib.compress(bytes(64 << 20), 9)  # 64 MiB of zeros in ~64 kB
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
        records = [record for record in sorted(_records(fs, base_root, shards[0]), key=len)[:2] if len(record) < MAX_LEN]
        _EXAMPLES.append(records)
        seeds += [bytes([2 * number]) + record for record in records]
        seeds += [bytes([2 * number + 1]) + b"\x00" * 8]
    return seeds


def _edited(examples: list[bytes], fdp: atheris.FuzzedDataProvider) -> bytes:
    """One of the dataset's Examples with a few protobuf-level edits."""
    from tensorflow_datasets.proto import tf_example_pb2

    example = tf_example_pb2.Example.FromString(examples[fdp.ConsumeIntInRange(0, len(examples) - 1)])
    features = example.features.feature
    for _ in range(fdp.ConsumeIntInRange(1, 3)):
        names = sorted(features)
        if not names:
            break
        name = names[fdp.ConsumeIntInRange(0, len(names) - 1)]
        feature = features[name]
        kind = feature.WhichOneof("kind")
        values = list(getattr(feature, kind).value) if kind else []
        op = fdp.ConsumeIntInRange(0, 7)
        if op == 0:
            del features[name]
            continue
        if op == 1:  # cut or emptied
            values = values[:fdp.ConsumeIntInRange(0, len(values))]
        elif op == 2:  # one more value, or all repeated
            values = values + values[:1] if fdp.ConsumeBool() else values * 2
        elif op == 3:  # another kind with as many values
            kind = ("bytes_list", "float_list", "int64_list")[fdp.ConsumeIntInRange(0, 2)]
            values = [b"x" if kind == "bytes_list" else 1] * len(values)
        elif op == 4 and kind == "bytes_list" and values:  # one value a zlib bomb or hostile bytes
            values[fdp.ConsumeIntInRange(0, len(values) - 1)] = _BOMB if fdp.ConsumeBool() else fdp.ConsumeBytes(64)
        elif op == 5:
            name = fdp.ConsumeUnicodeNoSurrogates(12)
            kind, values = "float_list", [fdp.ConsumeRegularFloat()]
        elif op == 6 and kind == "int64_list" and values:
            values[fdp.ConsumeIntInRange(0, len(values) - 1)] = fdp.ConsumeIntInRange(-(2**63), 2**63 - 1)
        elif kind == "float_list" and values:
            values[fdp.ConsumeIntInRange(0, len(values) - 1)] = fdp.ConsumeFloat()
        features[name].Clear()
        if kind:
            getattr(features[name], kind).value.extend(values)
    return example.SerializeToString()


def one_input(data: bytes) -> None:
    if not data:
        return
    number = (data[0] >> 1) % len(_READERS)
    reader = _READERS[number]
    record = _edited(_EXAMPLES[number], atheris.FuzzedDataProvider(data[1:])) if data[0] & 1 else data[1:]
    with open(os.path.join(reader.root, _SHARD), "wb") as handle:
        tfrecord.write_records(handle, [record])
    reader.load(RecordRef("train", 0, 0, _SHARD, 12, len(record), "train_00000_000000"))


del fsspec  # imported for the type of Reader.fs only
