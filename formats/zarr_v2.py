"""A small zarr v2 reader (and writer) for one-dimensional, possibly structured, arrays.

Why not zarr-python: 3.x cannot open structured dtypes with subarray fields (zarr-python
issues 3582/3583: "No Zarr data type found"), and 2.18 pins numcodecs < 0.16 and an old major
version. What L5Kit needs of zarr v2 is small and fully specified (zarr v2 storage spec): a
`.zarray` JSON, chunks named by index, each one compressor-encoded (blosc here, any numcodecs
codec works), filters applied in reverse on read, C order, and the last chunk stored at full
chunk size. Chunks are fetched through fsspec, so local paths and gs:// work alike, and only
the chunks a slice touches are read.
"""

from __future__ import annotations

import base64
import collections
import json
import math
import threading
from typing import Any

import fsspec
import numcodecs
import numpy as np

from formats import storage
from formats.errors import FormatError

__all__ = ["ZarrArray", "parse_dtype", "write_array", "write_group"]

# Refuse declared sizes that no real dataset has, before any allocation (a corrupt .zarray).
MAX_ELEMENTS = 10**11


def parse_dtype(spec: Any) -> np.dtype:
    """A zarr v2 `dtype` entry: a numpy type string, or a list of [name, type(, shape)] fields."""
    if isinstance(spec, str):
        return np.dtype(spec)
    fields = []
    for field in spec:
        if not isinstance(field, (list, tuple)) or len(field) not in (2, 3):
            raise ValueError(f"field {field!r} is not [name, dtype] or [name, dtype, shape]")
        name, kind = field[0], parse_dtype(field[1]) if isinstance(field[1], list) else np.dtype(field[1])
        fields.append((name, kind, tuple(field[2])) if len(field) == 3 else (name, kind))
    return np.dtype(fields)


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

    def __init__(self, fs: fsspec.AbstractFileSystem, path: str, cache_chunks: int = 4):
        self.fs = fs
        self.path = path
        meta_path = f"{path}/.zarray"
        meta = storage.read_json(fs, meta_path, missing="not found (not a zarr v2 array)")
        try:
            if meta.get("zarr_format") != 2:
                raise ValueError(f"zarr_format {meta.get('zarr_format')!r} (only 2 is supported)")
            self.dtype = parse_dtype(meta["dtype"])
            shape, chunks = meta["shape"], meta["chunks"]
            if len(shape) != 1 or len(chunks) != 1:
                raise ValueError(f"shape {shape} / chunks {chunks}: only one-dimensional arrays are supported")
            self.length, self.chunk_length = int(shape[0]), int(chunks[0])
            if not 0 <= self.length <= MAX_ELEMENTS or not 0 < self.chunk_length <= MAX_ELEMENTS:
                raise ValueError(f"shape {shape} / chunks {chunks} are not plausible sizes")
            if meta.get("order", "C") not in ("C", "F"):
                raise ValueError(f"order {meta.get('order')!r}")
            self.compressor = numcodecs.get_codec(meta["compressor"]) if meta.get("compressor") else None
            self.filters = [numcodecs.get_codec(f) for f in meta.get("filters") or []]
            self.fill_value = meta.get("fill_value")
            self.separator = meta.get("dimension_separator", ".")
        except (KeyError, TypeError, ValueError) as error:
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

    def _fetch(self, index: int) -> np.ndarray:
        key = f"{self.path}/{index}"  # one-dimensional: the key is the index whatever the separator
        try:
            raw = self.fs.cat_file(key)
        except FileNotFoundError:
            # Zarr would substitute the fill value; for dataset rows that is data loss, not data.
            raise FormatError(f"{key}: chunk {index} of {self.path} is missing (zarr would read it as fill values)") from None
        try:
            data = self.compressor.decode(raw) if self.compressor is not None else raw
            for codec in reversed(self.filters):
                data = codec.decode(data)
            values = np.frombuffer(memoryview(data), dtype=self.dtype)
        except Exception as error:  # noqa: BLE001 - codecs raise anything on corrupt bytes
            raise FormatError(f"{key}: cannot decode chunk {index} ({type(error).__name__}: {error})") from error
        expected = min(self.chunk_length, self.length - index * self.chunk_length)
        if len(values) < expected:
            raise FormatError(f"{key}: chunk {index} holds {len(values)} rows, expected at least {expected}")
        return values


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
