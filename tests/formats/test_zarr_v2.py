"""The zarr v2 reader refuses any chunk whose decoded size is not what .zarray says, before inflating."""

import json
import os
import struct

import numcodecs
import numpy as np
import pytest

from formats import storage
from formats.errors import FormatError
from formats.sources import l5kit
from formats.sources.l5kit.sample import SyntheticL5Kit, write_dataset
from formats.sources.l5kit.zarr_v2 import ZarrArray, write_array

CODECS = {
    "blosc": {"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1, "blocksize": 0},
    "lz4": {"id": "lz4", "acceleration": 1},
    "zstd": {"id": "zstd", "level": 1},
    "zlib": {"id": "zlib", "level": 1},
    "gzip": {"id": "gzip", "level": 1},
    "bz2": {"id": "bz2", "level": 1},
    "lzma": {"id": "lzma", "format": 1, "check": -1, "preset": None, "filters": None},
}


def _array(tmp_path, compressor, rows=250, chunk=100):
    fs, root = storage.open_root(str(tmp_path))
    values = np.arange(rows, dtype=np.int64) * 3
    write_array(fs, f"{root}/a", values, chunk, compressor)
    return fs, root, values


@pytest.mark.parametrize("name", sorted(CODECS))
def test_every_checked_codec_reads_and_refuses_a_chunk_of_the_wrong_size(tmp_path, name):
    fs, root, values = _array(tmp_path, CODECS[name])
    assert np.array_equal(ZarrArray(fs, f"{root}/a", root=root).read(0, 250), values)
    codec = numcodecs.get_codec(CODECS[name])
    for rows in (103, 97):  # more rows than `chunks` says (would shift every later row), and fewer
        (tmp_path / "a/1").write_bytes(bytes(codec.encode(np.arange(rows, dtype=np.int64).tobytes())))
        array = ZarrArray(fs, f"{root}/a", root=root)
        assert np.array_equal(array.read(0, 100), values[:100])  # chunk 0 is fine
        found = f"{rows * 8} bytes \\({rows} rows\\)" if name in ("blosc", "lz4", "zstd") or rows < 100 else "at least 801 bytes"
        with pytest.raises(FormatError, match=rf"^{tmp_path}/a/1: chunk 1 decodes to {found}, but \.zarray says every chunk "
                                              r"holds 100 rows x 8 bytes = 800 bytes; refused$"):
            array.read(100, 200)


def test_the_last_chunk_must_be_full_size_too(tmp_path):
    fs, root, values = _array(tmp_path, CODECS["blosc"])
    codec = numcodecs.get_codec(CODECS["blosc"])
    (tmp_path / "a/2").write_bytes(bytes(codec.encode(values[200:].tobytes())))  # 50 rows: zarr v2 never writes that
    with pytest.raises(FormatError, match=r"a/2: chunk 2 decodes to 400 bytes \(50 rows\), but \.zarray says"):
        ZarrArray(fs, f"{root}/a").read(200, 250)


def test_a_blosc_bomb_is_refused_from_its_header_without_inflating(tmp_path, monkeypatch):
    fs, root, _ = _array(tmp_path, CODECS["blosc"])
    chunk = bytearray((tmp_path / "a/1").read_bytes())
    struct.pack_into("<I", chunk, 4, 1_900_000_000)  # the header claims 1.9 GB
    (tmp_path / "a/1").write_bytes(bytes(chunk))
    monkeypatch.setattr(numcodecs.Blosc, "decode", lambda *a, **k: pytest.fail("inflated a chunk of the wrong size"))
    with pytest.raises(FormatError, match=r"chunk 1 decodes to 1900000000 bytes \(237500000 rows\), but \.zarray says"):
        ZarrArray(fs, f"{root}/a").read(100, 101)


def test_a_zlib_bomb_is_stopped_one_byte_past_the_chunk(tmp_path):
    fs, root, _ = _array(tmp_path, CODECS["zlib"])
    (tmp_path / "a/0").write_bytes(bytes(numcodecs.Zlib(9).encode(bytes(200_000_000))))  # 200 MB of zeros, 194 kB on disk
    with pytest.raises(FormatError, match=r"a/0: chunk 0 decodes to at least 801 bytes, but \.zarray says"):
        ZarrArray(fs, f"{root}/a").read(0, 1)


@pytest.mark.parametrize("change, message", [
    (lambda m: m.update(compressor={"id": "base64"}), r"compressor 'base64' is not supported: its decoded size cannot be checked"),
    (lambda m: m.update(compressor={"id": "nonesuch"}), r"codec \{'id': 'nonesuch'\}: UnknownCodecError: codec not available"),
    (lambda m: m.update(compressor="blosc"), r"codec 'blosc' is not an object with an 'id'"),
    (lambda m: m.update(filters={"id": "delta"}), r"filters \{'id': 'delta'\} must be a list"),
    (lambda m: m.update(shape="250"), r"shape '250' / chunks \[100\] must be lists of integers"),
    (lambda m: m.update(chunks=[100.5]), r"must be lists of integers"),
    (lambda m: m.update(chunks=[10**10]), r"chunks of 10000000000 rows x 8 bytes \(80000000000 bytes\) are larger than"),
    (lambda m: m.update(dtype="<U100000000"), r"are larger than"),
    (lambda m: m.update(dtype=[]), r"has no bytes"),
])
def test_metadata_the_reader_cannot_check_is_refused_when_opened(tmp_path, change, message):
    fs, root, _ = _array(tmp_path, CODECS["blosc"])
    meta = json.loads((tmp_path / "a/.zarray").read_text())
    change(meta)
    (tmp_path / "a/.zarray").write_text(json.dumps(meta))
    with pytest.raises(FormatError, match=rf"^{tmp_path}/a/\.zarray: .*{message}"):
        ZarrArray(fs, f"{root}/a")


def test_l5kit_scene_with_an_oversized_agents_chunk_is_refused_naming_file_and_scene(tmp_path):
    path = tmp_path / "ds.zarr"
    truth = write_dataset(str(path), SyntheticL5Kit(scene_lengths=(10, 10), agents_chunk=20))
    codec = numcodecs.get_codec(json.loads((path / "agents/.zarray").read_text())["compressor"])
    (path / "agents/0").write_bytes(bytes(codec.encode(truth["agents"][:25].tobytes())))  # 25 rows in a 20-row chunk
    fs, root = storage.open_root(str(path))
    meta, refs = l5kit.plan(fs, root)
    with pytest.raises(FormatError, match=r"^scene_000000: .*ds.zarr/agents/0: chunk 0 decodes to 2900 bytes \(25 rows\)"):
        l5kit.load(fs, root, refs[0], meta)


def test_zarr_chunks_behind_symlinks_out_of_the_root_or_fifos_are_refused(tmp_path):
    path = tmp_path / "ds.zarr"
    write_dataset(str(path), SyntheticL5Kit(scene_lengths=(10, 10), agents_chunk=20))
    outside = tmp_path / "elsewhere"
    os.rename(path / "agents/1", outside)
    os.symlink(outside, path / "agents/1")
    fs, root = storage.open_root(str(path))
    meta, refs = l5kit.plan(fs, root)
    with pytest.raises(FormatError, match=rf"zarr file 'agents/1' is a symlink to {outside}, outside the dataset root"):
        for ref in refs:
            l5kit.load(fs, root, ref, meta)
    os.unlink(path / "agents/1")
    os.mkfifo(path / "agents/1")
    meta, refs = l5kit.plan(fs, root)
    with pytest.raises(FormatError, match=r"zarr file 'agents/1' is a FIFO, not a regular file; refused without opening it"):
        for ref in refs:
            l5kit.load(fs, root, ref, meta)
    os.unlink(path / "agents/1")
    os.mkfifo(path / "frames/.zarray.fifo")
    (path / "frames/.zarray").unlink()
    os.rename(path / "frames/.zarray.fifo", path / "frames/.zarray")
    with pytest.raises(FormatError, match=r"zarr file 'frames/.zarray' is a FIFO"):
        l5kit.plan(fs, root)
