"""A small zarr v2 reader (and writer) for one-dimensional, possibly structured, arrays.

Why not zarr-python: 3.x cannot open structured dtypes with subarray fields (zarr-python
issues 3582/3583: "No Zarr data type found"), and 2.18 pins numcodecs < 0.16 and an old major
version. What L5Kit needs of zarr v2 is small and fully specified (zarr v2 storage spec): a
`.zarray` JSON, chunks named by index, each one compressor-encoded (blosc here, any numcodecs
codec works), filters applied in reverse on read, C order, and the last chunk stored at full
chunk size. Chunks are fetched through fsspec, so local paths and gs:// work alike, and only
the chunks a slice touches are read.

Every chunk must decode to exactly `chunks[0] x itemsize` bytes (the last one too), and that is
checked BEFORE inflating: a chunk holding more rows than the metadata says would shift every
later row, and a small chunk that inflates to gigabytes would exhaust memory. Compressors whose
decoded size can be checked first: blosc (its 16-byte header), lz4 (numcodecs' 4-byte size
prefix), zstd (the frame header's content size), zlib/gzip/bz2/lzma (stdlib streams decoded
with an output bound); any other compressor is refused when the array is opened.
"""

from __future__ import annotations

import base64
import bz2
import collections
import json
import lzma
import math
import posixpath
import struct
import threading
import zlib
from typing import Any

import fsspec
import numcodecs
import numpy as np

from formats import storage
from formats.errors import FormatError

__all__ = ["ZarrArray", "parse_dtype", "write_array", "write_group"]

# Refuse declared sizes that no real dataset has, before any allocation (a corrupt .zarray).
MAX_ELEMENTS = 10**11
# The largest decoded chunk accepted, checked when the array is opened: a chunk is decoded whole in
# memory, and the codec allocates what the chunk's header claims before it finds the bytes are not
# there (a 64-byte blosc chunk claiming 400 MB, with a .zarray that agrees, took 400 MB; blosc's own
# limit, 2 GiB, was the bound). l5kit's own chunks are a few MB (agents: 20,000 rows).
MAX_CHUNK_BYTES = 256 << 20
# Compressors whose decoded size is known (or bounded) before the chunk is inflated.
CHECKED_COMPRESSORS = ("blosc", "lz4", "zstd", "zlib", "gzip", "bz2", "lzma")


def parse_dtype(spec: Any) -> np.dtype:
    """A zarr v2 `dtype` entry: a numpy type string, or a list of [name, type(, shape)] fields."""
    if isinstance(spec, str):
        return _numpy_dtype(spec)
    fields = []
    for field in spec:
        if not isinstance(field, (list, tuple)) or len(field) not in (2, 3):
            raise ValueError(f"field {field!r} is not [name, dtype] or [name, dtype, shape]")
        name, kind = field[0], parse_dtype(field[1]) if isinstance(field[1], list) else _numpy_dtype(field[1])
        fields.append((name, kind, tuple(field[2])) if len(field) == 3 else (name, kind))
    return _numpy_dtype(fields)


def _numpy_dtype(spec: Any) -> np.dtype:
    """np.dtype(spec), whatever it raises a ValueError: numpy parses "(2,)f8, i4"-style strings
    with ast.literal_eval, so a hostile `dtype` raised SyntaxError, which nothing caught."""
    try:
        return np.dtype(spec)
    except MemoryError:
        raise
    except Exception as error:  # noqa: BLE001 - numpy's parser raises SyntaxError, TypeError, ValueError, RecursionError...
        raise ValueError(f"dtype {spec!r} is not a numpy type ({type(error).__name__}: {error})") from None


def _dtype_spec(dtype: np.dtype) -> Any:
    if dtype.fields is None:
        return dtype.str
    spec = []
    for name in dtype.names:
        field = dtype.fields[name][0]
        if field.subdtype is not None:
            base, shape = field.subdtype
            spec.append([name, base.str, list(shape)])
        else:
            spec.append([name, field.str])
    return spec


class ZarrArray:
    """A 1-D zarr v2 array read chunk by chunk; `read(start, stop)` returns a numpy array.

    A few decoded chunks are kept (least recently used first out): consecutive scenes share
    their frames' and agents' chunks, and a worker loads them in order.
    """

    def __init__(self, fs: fsspec.AbstractFileSystem, path: str, cache_chunks: int = 4, *, root: str | None = None):
        """Open the array at `path`; with `root`, `path` and every chunk are resolved inside it
        (no `..`, no symlink out of the dataset, no FIFO: storage.resolve_inside)."""
        self.fs = fs
        self.path = path
        self.root = root
        meta_path = self._resolve(".zarray")
        meta = storage.read_json(fs, meta_path, missing="not found (not a zarr v2 array)")
        try:
            if meta.get("zarr_format") != 2:
                raise ValueError(f"zarr_format {meta.get('zarr_format')!r} (only 2 is supported)")
            self.dtype = parse_dtype(meta["dtype"])
            shape, chunks = meta["shape"], meta["chunks"]
            if not _int_list(shape) or not _int_list(chunks):
                raise ValueError(f"shape {shape!r} / chunks {chunks!r} must be lists of integers")
            if len(shape) != 1 or len(chunks) != 1:
                raise ValueError(f"shape {shape} / chunks {chunks}: only one-dimensional arrays are supported")
            self.length, self.chunk_length = int(shape[0]), int(chunks[0])
            if not 0 <= self.length <= MAX_ELEMENTS or not 0 < self.chunk_length <= MAX_ELEMENTS:
                raise ValueError(f"shape {shape} / chunks {chunks} are not plausible sizes")
            if self.dtype.itemsize == 0:
                raise ValueError(f"dtype {meta['dtype']!r} has no bytes")
            self.chunk_bytes = self.chunk_length * self.dtype.itemsize
            if self.chunk_bytes > MAX_CHUNK_BYTES:
                raise ValueError(f"chunks of {self.chunk_length} rows x {self.dtype.itemsize} bytes ({self.chunk_bytes} bytes) "
                                 f"are larger than {MAX_CHUNK_BYTES} bytes, more than this reader decodes in one piece "
                                 "(rechunk the array, e.g. with zarr's or rechunker's copy, to smaller chunks)")
            if meta.get("order", "C") not in ("C", "F"):
                raise ValueError(f"order {meta.get('order')!r}")
            self.compressor = _codec(meta["compressor"]) if meta.get("compressor") else None
            if self.compressor is not None and self.compressor.codec_id not in CHECKED_COMPRESSORS:
                raise ValueError(f"compressor {self.compressor.codec_id!r} is not supported: its decoded size cannot be checked "
                                 f"before inflating (supported: {', '.join(CHECKED_COMPRESSORS)})")
            filters = meta.get("filters") or []
            if not isinstance(filters, list):
                raise ValueError(f"filters {filters!r} must be a list")
            self.filters = [_codec(f) for f in filters]
            self.fill_value = meta.get("fill_value")
            self.separator = meta.get("dimension_separator", ".")
        except (KeyError, TypeError, ValueError, OverflowError) as error:
            message = f"missing key {error}" if isinstance(error, KeyError) else str(error)
            raise FormatError(f"{meta_path}: {message}") from error
        self._cache: collections.OrderedDict[int, np.ndarray] = collections.OrderedDict()
        self._cache_chunks = cache_chunks
        self._lock = threading.Lock()  # a worker may load scenes in several threads

    def __len__(self) -> int:
        return self.length

    @property
    def chunk_count(self) -> int:
        return math.ceil(self.length / self.chunk_length)

    def read(self, start: int, stop: int) -> np.ndarray:
        """Elements [start, stop) as a new array (a copy: callers may keep it)."""
        if not 0 <= start <= stop <= self.length:
            raise FormatError(f"{self.path}: rows [{start}, {stop}) outside the array's {self.length} rows")
        if start == stop:
            return np.zeros(0, self.dtype)
        first, last = start // self.chunk_length, (stop - 1) // self.chunk_length
        parts = []
        for index in range(first, last + 1):
            chunk = self._chunk(index)
            offset = index * self.chunk_length
            parts.append(chunk[max(start - offset, 0): min(stop - offset, self.chunk_length)])
        return np.concatenate(parts) if len(parts) > 1 else parts[0].copy()

    def _chunk(self, index: int) -> np.ndarray:
        with self._lock:
            if index in self._cache:
                self._cache.move_to_end(index)
                return self._cache[index]
        values = self._fetch(index)
        with self._lock:
            self._cache[index] = values
            while len(self._cache) > self._cache_chunks:
                self._cache.popitem(last=False)
        return values

    def _resolve(self, name: str) -> str:
        """`path/name`, resolved inside the dataset root when the array was opened with one."""
        if self.root is None:
            return f"{self.path}/{name}"
        relative = posixpath.relpath(f"{self.path}/{name}", self.root)
        return storage.resolve_inside(self.root, relative, what="zarr file", fs=self.fs)

    def _fetch(self, index: int) -> np.ndarray:
        key = self._resolve(str(index))  # one-dimensional: the key is the index whatever the separator
        storage.check_regular(self.fs, key)
        try:
            raw = self.fs.cat_file(key)
        except FileNotFoundError:
            # Zarr would substitute the fill value; for dataset rows that is data loss, not data.
            raise FormatError(f"{key}: chunk {index} of {self.path} is missing (zarr would read it as fill values)") from None
        expected = self.chunk_bytes  # zarr v2 stores every chunk full-size, the last one too
        try:
            data = _inflate(self.compressor, raw, expected) if self.compressor is not None else raw
            if memoryview(data).nbytes != expected:
                raise _SizeError(memoryview(data).nbytes)
            for codec in reversed(self.filters):
                data = codec.decode(data)
                if memoryview(data).nbytes != expected:
                    raise FormatError(f"{key}: filter {codec.codec_id!r} decodes chunk {index} to {memoryview(data).nbytes} bytes, "
                                      f"{self._expected_text()}; refused")
            values = np.frombuffer(memoryview(data), dtype=self.dtype)
        except _SizeError as error:
            raise FormatError(f"{key}: chunk {index} decodes to {error.describe(self.dtype.itemsize)}, "
                              f"{self._expected_text()}; refused") from None
        except FormatError:
            raise
        except Exception as error:  # noqa: BLE001 - codecs raise anything on corrupt bytes
            raise FormatError(f"{key}: cannot decode chunk {index} ({type(error).__name__}: {error})") from error
        return values

    def _expected_text(self) -> str:
        return (f"but .zarray says every chunk holds {self.chunk_length} rows x {self.dtype.itemsize} bytes "
                f"= {self.chunk_bytes} bytes")


class _SizeError(Exception):
    """A chunk whose decoded size (declared, or found by a bounded decoder) is not the metadata's."""

    def __init__(self, size: int, at_least: bool = False):
        super().__init__(size)
        self.size = size
        self.at_least = at_least

    def describe(self, itemsize: int) -> str:
        if self.at_least:
            return f"at least {self.size} bytes"
        rows = f" ({self.size // itemsize} rows)" if self.size % itemsize == 0 else ""
        return f"{self.size} bytes{rows}"


def _int_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)


def _codec(config: Any):
    if not isinstance(config, dict) or not isinstance(config.get("id"), str):
        raise ValueError(f"codec {config!r} is not an object with an 'id'")
    try:
        return numcodecs.get_codec(dict(config))
    except Exception as error:  # noqa: BLE001 - numcodecs raises many kinds on bad parameters
        raise ValueError(f"codec {config!r}: {type(error).__name__}: {error}") from error


def _declared_zstd_size(raw: bytes) -> int | None:
    """Frame_Content_Size of a zstd frame header (RFC 8878 3.1.1.1), None when absent."""
    if len(raw) < 6 or raw[:4] != b"\x28\xb5\x2f\xfd":
        raise ValueError("not a zstd frame")
    descriptor = raw[4]
    fcs_flag, single_segment, dictionary_flag = descriptor >> 6, (descriptor >> 5) & 1, descriptor & 3
    position = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[dictionary_flag]
    size = (1 if single_segment else 0, 2, 4, 8)[fcs_flag]
    if size == 0:
        return None
    if len(raw) < position + size:
        raise ValueError("truncated zstd frame header")
    value = int.from_bytes(raw[position: position + size], "little")
    return value + 256 if size == 2 else value


def _inflate(codec, raw: bytes, expected: int) -> bytes:
    """Decode one chunk, checking its decoded size against `expected` BEFORE inflating (headers)
    or while inflating (bounded streams); raises _SizeError on a mismatch."""
    kind = codec.codec_id
    raw = bytes(raw)
    if kind == "blosc":  # header: version, versionlz, flags, typesize, nbytes, blocksize, cbytes (uint32 LE)
        if len(raw) < 16:
            raise ValueError(f"{len(raw)} bytes: shorter than a blosc header")
        nbytes, _, cbytes = struct.unpack_from("<III", raw, 4)
        if nbytes != expected:
            raise _SizeError(nbytes)
        if cbytes != len(raw):
            raise ValueError(f"blosc header says {cbytes} compressed bytes, the chunk file holds {len(raw)}")
        return codec.decode(raw)
    if kind == "lz4":  # numcodecs prefixes the decoded size (uint32 LE)
        if len(raw) < 4:
            raise ValueError(f"{len(raw)} bytes: shorter than an lz4 size prefix")
        declared = struct.unpack_from("<I", raw)[0]
        if declared != expected:
            raise _SizeError(declared)
        return codec.decode(raw)
    if kind == "zstd":
        declared = _declared_zstd_size(raw)
        if declared is None:
            raise ValueError("the zstd frame does not declare its decoded size")
        if declared != expected:
            raise _SizeError(declared)
        return codec.decode(raw)
    if kind in ("zlib", "gzip"):
        stream = zlib.decompressobj(zlib.MAX_WBITS | (16 if kind == "gzip" else 0))
    elif kind == "bz2":
        stream = bz2.BZ2Decompressor()
    elif kind == "lzma":
        raw_format = codec.format == lzma.FORMAT_RAW
        stream = lzma.LZMADecompressor(format=codec.format, filters=codec.filters if raw_format else None)
    else:  # refused when the array was opened
        raise ValueError(f"compressor {kind!r} is not supported")
    data = stream.decompress(raw, expected + 1)  # never more than one byte past the expected size
    if len(data) > expected:
        raise _SizeError(len(data), at_least=True)
    if not stream.eof:  # stopped at the bound, or the input ran out: let the stream try to go on
        more = stream.decompress(getattr(stream, "unconsumed_tail", b""), 1)
        if more:
            raise _SizeError(len(data) + len(more), at_least=True)
        if not stream.eof:
            raise ValueError(f"{kind} stream ends early ({len(data)} bytes decoded)")
    return data


def write_array(fs: fsspec.AbstractFileSystem, path: str, values: np.ndarray, chunk_length: int,
                compressor: dict | None = None) -> None:
    """Write `values` as zarr v2 writes it: full-size chunks (the last padded with the fill value)."""
    compressor = compressor or {"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1, "blocksize": 0}
    codec = numcodecs.get_codec(compressor)
    fill = np.zeros(1, values.dtype)
    fs.makedirs(path, exist_ok=True)
    meta = {
        "chunks": [chunk_length],
        "compressor": compressor,
        "dtype": _dtype_spec(values.dtype),
        "fill_value": base64.standard_b64encode(fill.tobytes()).decode() if values.dtype.fields else 0,
        "filters": None,
        "order": "C",
        "shape": [len(values)],
        "zarr_format": 2,
    }
    fs.pipe_file(f"{path}/.zarray", json.dumps(meta, indent=4, sort_keys=True).encode())
    for index in range(math.ceil(len(values) / chunk_length)):
        chunk = np.zeros(chunk_length, values.dtype)
        part = values[index * chunk_length: (index + 1) * chunk_length]
        chunk[: len(part)] = part
        fs.pipe_file(f"{path}/{index}", bytes(codec.encode(chunk.tobytes())))


def write_group(fs: fsspec.AbstractFileSystem, path: str, attrs: dict) -> None:
    fs.makedirs(path, exist_ok=True)
    fs.pipe_file(f"{path}/.zgroup", json.dumps({"zarr_format": 2}, indent=4).encode())
    fs.pipe_file(f"{path}/.zattrs", json.dumps(attrs, indent=4, sort_keys=True).encode())
