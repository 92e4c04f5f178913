"""Harness: zarr v2 `.zarray` metadata and chunk decoding bounds (formats/sources/l5kit/zarr_v2.py).

Input: a mode byte, then either raw (`u16 n | n bytes of .zarray | chunk 0's bytes`) or
structured (an atheris.FuzzedDataProvider that picks a real array, mutates its `.zarray` as JSON
(fuzz/jsonmut.py) and keeps or replaces its first chunk). Contract: opening the array and reading
its first chunk's rows raise nothing but ConversionError, within 1 s and 256 MiB (fuzz/contract.py):
no chunk may inflate past what `.zarray` says, whatever the compressor header claims.
"""

from __future__ import annotations

import json
import os
import shutil
import struct

import atheris
import numpy as np

from formats import storage
from formats.sources.l5kit import zarr_v2
from formats.sources.l5kit.sample import write_dataset
from fuzz import jsonmut
from fuzz.contract import fixtures_dir

MAX_LEN = 40_000
SMOKE_RUNS = 600
_BASES: list[tuple[dict, bytes]] = []  # (.zarray, chunk 0)
_WORK = ""


def _raw(meta: bytes, chunk: bytes) -> bytes:
    return b"\x00" + struct.pack("<H", len(meta)) + meta + chunk


def prepare(work: str) -> list[bytes]:
    """Bases: the sample writer's four arrays, one small array per compressor the reader accepts
    (and one it refuses), and the fixture's arrays whose first chunk is under MAX_LEN."""
    global _WORK
    _WORK = os.path.join(work, "zarr_input")
    sample = os.path.join(work, "l5kit_sample.zarr")
    write_dataset(sample)
    fs, root = storage.open_root(work)
    values = np.arange(40, dtype="<f4")
    for codec in ({"id": "zlib", "level": 1}, {"id": "gzip", "level": 1}, {"id": "bz2", "level": 1}, {"id": "lzma"},
                  {"id": "zstd", "level": 1}, {"id": "lz4"}, {"id": "blosc", "cname": "zstd", "clevel": 1, "shuffle": 2},
                  {"id": "crc32"}):
        try:
            zarr_v2.write_array(fs, storage.join(root, "codecs", codec["id"]), values, 16, compressor=codec)
        except Exception:  # noqa: BLE001 - a codec numcodecs lacks here
            continue
    folders = [os.path.join(sample, name) for name in sorted(os.listdir(sample)) if os.path.isdir(os.path.join(sample, name))]
    folders += [os.path.join(work, "codecs", name) for name in sorted(os.listdir(os.path.join(work, "codecs")))]
    fixture = fixtures_dir()
    if fixture:
        zarr = os.path.join(fixture, "l5kit", "single_scene.zarr")
        folders += [os.path.join(zarr, name) for name in sorted(os.listdir(zarr)) if os.path.isdir(os.path.join(zarr, name))]
    seeds = []
    for folder in folders:
        with open(os.path.join(folder, ".zarray"), "rb") as handle:
            meta = handle.read()
        chunk_path = os.path.join(folder, "0")
        if not os.path.exists(chunk_path) or os.path.getsize(chunk_path) > MAX_LEN:
            continue
        with open(chunk_path, "rb") as handle:
            chunk = handle.read()
        _BASES.append((json.loads(meta), chunk))
        seeds.append(_raw(meta, chunk))
    return seeds


def _split(data: bytes) -> tuple[bytes, bytes] | None:
    if data[0] % 2 == 0:
        if len(data) < 3:
            return None
        (length,) = struct.unpack_from("<H", data, 1)
        return data[3:3 + length], data[3 + length:]
    fdp = atheris.FuzzedDataProvider(data[1:])
    meta, chunk = _BASES[fdp.ConsumeIntInRange(0, len(_BASES) - 1)]
    meta = jsonmut.dumps(jsonmut.mutate(meta, fdp))
    if fdp.ConsumeBool():
        chunk = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 64)) + chunk[64:] if fdp.ConsumeBool() else fdp.ConsumeBytes(MAX_LEN)
    return meta, chunk


def one_input(data: bytes) -> None:
    if not data:
        return
    parts = _split(data)
    if parts is None:
        return
    shutil.rmtree(_WORK, ignore_errors=True)
    array_path = os.path.join(_WORK, "array")
    os.makedirs(array_path)
    with open(os.path.join(array_path, ".zarray"), "wb") as handle:
        handle.write(parts[0])
    with open(os.path.join(array_path, "0"), "wb") as handle:
        handle.write(parts[1])
    fs, root = storage.open_root(_WORK)
    array = zarr_v2.ZarrArray(fs, storage.join(root, "array"), root=root)
    array.read(0, min(len(array), array.chunk_length))
