"""ArrayRecord container (TFDS `file_format=array_record`): count records, read one by index, write.

An ArrayRecord file is a Riegeli/records file: data chunks of `group_size` records each (TFDS writes
`group_size:1`, one episode a chunk: `file_adapters.ArrayRecordFileAdapter`), then a footer chunk
holding a `RiegeliFooterMetadata` and one `ArrayRecordFooter` (chunk offset, record count) per data
chunk, then a 64 KiB postscript at the end of the file pointing at the footer. google's `array_record`
package reads record i by its index (postscript, footer, then that one chunk), checking every chunk
header and chunk against its HighwayHash; nothing of TensorFlow is involved.

Its reader opens an OS path only (and gs:// through its own C++ GCS client, which ignores fsspec's
credentials and, offline, hung for over 200 s in its constructor: not used here). Any other fsspec
filesystem (gs://, s3://, hf://, memory://) is read through a sparse local file of the shard's size
holding only the bytes the reader will read: the postscript, the footer and the wanted chunk, each
one ranged read (`_Remote`). Finding those bytes means decoding the postscript and the footer here;
the record itself is still decoded and hash-checked by array_record, so bytes put at a wrong place
fail its hash check (the holes read as zeros) and are never taken for a record.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import struct
import tempfile
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import fsspec

from formats import storage
from formats.errors import FormatError, MissingPackageError

__all__ = ["READER_OPTIONS", "TFDS_WRITER_OPTIONS", "count", "read_record", "write_records"]

# Random access, one record at a time: no read-ahead, no thread pool (array_record's own advice
# for random access, in ArrayRecordReader's docstring).
READER_OPTIONS = "readahead_buffer_size:0,max_parallelism:0"
# What tfds writes (tensorflow_datasets/core/file_adapters.py, ArrayRecordFileAdapter.write_examples);
# the rest are array_record's defaults (zstd:3, window_log:20, transpose:false).
TFDS_WRITER_OPTIONS = "group_size:1"

_BLOCK = 1 << 16  # Riegeli block size; a block header (24 bytes) begins every block
_BLOCK_HEADER = 24
_CHUNK_HEADER = 40
_MAGIC = 0x71930E704FDAE05E  # RiegeliPostscript.magic (array_record_reader.cc kMagic)
# A footer larger than this (stored or decompressed) is a corrupt offset or size, not an index
# (1e6 chunks take about 15 MB).
MAX_FOOTER_BYTES = 256 << 20
# A record's chunk header claims its decompressed size, which array_record allocates before it
# decodes: a chunk claiming more than MAX_INFLATION times its stored bytes, past INFLATION_FLOOR,
# is a decompression bomb (a zstd chunk of zeros: 800 MB from a few KB, 2.6 GB peak), refused
# before it is read. RLDS records hold encoded images and arrays, which zstd shrinks a few times.
INFLATION_FLOOR = 64 << 20
MAX_INFLATION = 100


def _module():
    try:
        from array_record.python import array_record_module
    except ImportError as error:
        raise MissingPackageError(f"reading ArrayRecord files needs the array_record package: pip install array_record ({error})") from None
    return array_record_module


def _open(local: str):
    """An ArrayRecordReader that opened `local` completely: a reader that failed to open reports
    ok() False and 0 records rather than raising, so the failure is turned into a FormatError here."""
    try:
        reader = _module().ArrayRecordReader(local, READER_OPTIONS)
    except (RuntimeError, ValueError) as error:
        raise FormatError(f"not a readable ArrayRecord file: {error}") from None
    if not reader.ok():
        try:
            reader.close()
            reason = ""
        except RuntimeError as error:
            reason = str(error)
        raise FormatError(f"not a readable ArrayRecord file: {reason or 'truncated or corrupt (array_record gives no reason)'}")
    return reader


def count(fs: fsspec.AbstractFileSystem, path: str, cache: dict | None = None) -> int:
    """How many records the file holds, from its footer (the records are not read). A Riegeli
    chunk takes at least a byte a record, so a count past the file's size is a forged footer
    (its hashes are checksums, not signatures): refused before a ref is made for each."""
    local = storage.local_path(fs, path)
    if local is not None:
        reader = _open(local)
        try:
            records, size = reader.num_records(), fs.size(path)
        finally:
            reader.close()
    else:
        remote = _remote(fs, path, cache)
        records, size = remote.records, remote.size
    if records > size:
        raise FormatError(f"not a readable ArrayRecord file: its footer counts {records} records in {size} bytes")
    return records


def read_record(fs: fsspec.AbstractFileSystem, path: str, index: int, cache: dict | None = None) -> bytes:
    """Record `index` of the file, hash-checked by array_record. With `cache` (a reader's, per
    worker) a local shard stays open for its next records: opening it reads its footer, so a
    shard's records one by one cost in proportion to the records it holds (4.2 ms a record at 50,000)."""
    local = storage.local_path(fs, path)
    if local is None:
        return _remote(fs, path, cache).read(fs, index)
    found = _index(fs, path, cache)
    if found is not None:
        found.check_inflation(fs, index)
    if cache is None:
        return _read(_open(local), index)
    kept = cache.get(_OPEN)
    if kept is None or kept[0] != local:
        if kept is not None:
            _close(kept[1])
        cache.pop(_OPEN, None)  # a failed open keeps nothing
        cache[_OPEN] = kept = (local, _open(local))
    return _read(kept[1], index, close=False)


_OPEN = "open local shard"  # the cache's entry for the local shard kept open: (path, reader)


def _close(reader) -> None:
    try:
        reader.close()
    except RuntimeError:
        pass  # a read already raised what went wrong


def _read(reader, index: int, close: bool = True) -> bytes:
    try:
        if not 0 <= index < reader.num_records():
            raise FormatError(f"record {index}: the file holds {reader.num_records()} records")
        try:
            return reader.read([index])[0]
        except RuntimeError as error:
            raise FormatError(f"record {index}: {error}") from None
    finally:
        if close:
            _close(reader)


def write_records(local: str, records: Iterable[bytes], options: str = TFDS_WRITER_OPTIONS) -> int:
    """Write `records` to the OS path `local` as tfds does; returns how many."""
    writer = _module().ArrayRecordWriter(local, options)
    written = 0
    for record in records:
        writer.write(record)
        written += 1
    writer.close()
    return written


# --- other filesystems: locate the bytes, hand them to array_record in a sparse file ----------------

def _remote(fs: fsspec.AbstractFileSystem, path: str, cache: dict | None) -> _Remote:
    """The file's postscript and footer (one or two ranged reads), remembered in `cache` (a
    reader's, per worker) by path, the 8 shards used last: every record of a shard reads the same
    footer, and records of several shards arrive mixed after the shuffle that spreads them. (A
    shard rewritten meanwhile fails array_record's hash checks, never gives another record.)"""
    return _remembered(cache, ("remote", path), lambda: _Remote(fs, path, fs.size(path)))


def _remembered(cache: dict | None, key: tuple[str, str], make: Callable[[], Any]) -> Any:
    """`make()`, kept in `cache` under `key` among the 8 of its kind (key[0]) used last."""
    if cache is not None and key in cache:
        cache[key] = cache.pop(key)  # the most recently used last
        return cache[key]
    value = make()
    if cache is not None:
        kept = [entry for entry in cache if isinstance(entry, tuple) and entry[0] == key[0]]
        if len(kept) >= 8:
            cache.pop(kept[0])
        cache[key] = value
    return value


def _index(fs: fsspec.AbstractFileSystem, path: str, cache: dict | None) -> _Remote | None:
    """A local file's chunk index (its footer), remembered like a remote one's (the 8 shards used
    last: records of several shards arrive mixed), without the sparse copy that checks a remote
    footer's hashes (array_record checks a local file's itself). None when this module cannot read
    the footer (brotli or snappy, which array_record reads): the inflation check is then skipped."""
    def make() -> _Remote | None:
        try:
            return _Remote(fs, path, fs.size(path), verify=False)
        except FormatError:
            return None  # array_record opens it and says what is wrong, or reads it

    return _remembered(cache, ("index", path), make)


class _Remote:
    """Where a remote ArrayRecord file's chunks are, from its postscript and footer."""

    def __init__(self, fs: fsspec.AbstractFileSystem, path: str, size: int, verify: bool = True):
        self.path, self.size = path, size
        if size < _BLOCK:
            raise FormatError(f"not a readable ArrayRecord file: {size} bytes, less than the 64 KiB postscript")
        self.tail_at = size - _BLOCK
        self.tail = fs.cat_file(path, start=self.tail_at, end=size)
        postscript = _records(_chunk(self.tail, self.tail_at, "postscript"), "postscript")
        fields = _fields(postscript[0]) if postscript else {}
        if fields.get(2) != _MAGIC or not isinstance(fields.get(1), int):
            raise FormatError("not a readable ArrayRecord file: no ArrayRecord postscript in its last 64 KiB")
        self.footer_at = fields[1]
        if not 0 < self.footer_at < self.tail_at or self.tail_at - self.footer_at > MAX_FOOTER_BYTES:
            raise FormatError(f"not a readable ArrayRecord file: its postscript puts the footer at byte {self.footer_at} "
                              f"(the file has {size} bytes)")
        self.footer = fs.cat_file(path, start=self.footer_at, end=self.tail_at)
        records = _records(_chunk(self.footer, self.footer_at, "footer"), "footer")
        metadata = _fields(_fields(records[0]).get(1, b"")) if records and isinstance(_fields(records[0]).get(1), bytes) else {}
        chunks = [_fields(record) for record in records[1:]]
        if metadata.get(2) != len(chunks) or any(not isinstance(chunk.get(1), int) for chunk in chunks):
            raise FormatError("not a readable ArrayRecord file: its footer does not list its chunks")
        self.offsets = [chunk[1] for chunk in chunks] + [self.footer_at]
        counts = [chunk.get(3, 1) for chunk in chunks]
        self.firsts = [0, *itertools.accumulate(counts)]  # the index of each chunk's first record, then the total
        self.records = self.firsts[-1]
        if metadata.get(3, self.records) != self.records or self.offsets != sorted(self.offsets):
            raise FormatError("not a readable ArrayRecord file: its footer's chunk list is inconsistent")
        if not verify:
            return
        with self._sparse() as local:  # array_record checks the postscript's and footer's hashes
            reader = _open(local)
            opened = reader.num_records()
            reader.close()
        if opened != self.records:
            raise FormatError(f"not a readable ArrayRecord file: array_record counts {opened} records, its footer {self.records}")

    @contextlib.contextmanager
    def _sparse(self, *regions: tuple[int, bytes]) -> Iterator[str]:
        """A local file of the shard's size holding the postscript, the footer and `regions`
        (offset, bytes) at their offsets; holes elsewhere (they read as zeros, take no disk)."""
        with tempfile.NamedTemporaryFile(prefix="mixtrain-arrayrecord-", suffix=".array_record") as handle:
            handle.truncate(self.size)
            for at, blob in (*regions, (self.footer_at, self.footer), (self.tail_at, self.tail)):
                handle.seek(at)
                handle.write(blob)
            handle.flush()
            yield handle.name

    def _chunk_of(self, index: int) -> tuple[int, int]:
        if not 0 <= index < self.records:
            raise FormatError(f"record {index}: the file holds {self.records} records")
        chunk = bisect.bisect_right(self.firsts, index) - 1
        return self.offsets[chunk], self.offsets[chunk + 1]

    def check_inflation(self, fs: fsspec.AbstractFileSystem, index: int, blob: bytes | None = None) -> None:
        """Refuse the chunk of record `index` when it claims to inflate like a bomb (INFLATION_FLOOR)."""
        begin, end = self._chunk_of(index)
        head = blob if blob is not None else fs.cat_file(self.path, start=begin, end=min(end, begin + _CHUNK_HEADER + 2 * _BLOCK_HEADER))
        plain = _plain(head[:_CHUNK_HEADER + 2 * _BLOCK_HEADER], begin)
        if len(plain) < _CHUNK_HEADER:
            return  # a truncated chunk: array_record says so
        stored, = struct.unpack_from("<Q", plain, 8)
        claimed, = struct.unpack_from("<Q", plain, 32)
        if claimed > INFLATION_FLOOR and claimed > MAX_INFLATION * max(stored, 1):
            raise FormatError(f"record {index}: its chunk claims {claimed} bytes decompressed from {stored} (more than "
                              f"{MAX_INFLATION} times, past {INFLATION_FLOOR}): a decompression bomb, not an episode")

    def read(self, fs: fsspec.AbstractFileSystem, index: int) -> bytes:
        begin, end = self._chunk_of(index)
        blob = fs.cat_file(self.path, start=begin, end=end)
        self.check_inflation(fs, index, blob)
        with self._sparse((begin, blob)) as local:
            return _read(_open(local), index)


def _plain(blob: bytes, at: int) -> bytearray:
    """The bytes of `blob` (starting at file offset `at`) without the block headers that interrupt
    them (one every 64 KiB of the file)."""
    plain = bytearray()
    position = 0
    while position < len(blob):
        if (at + position) % _BLOCK == 0:
            position += _BLOCK_HEADER
            continue
        end = min(len(blob), position + _BLOCK - (at + position) % _BLOCK)
        plain += blob[position:end]
        position = end
    return plain


def _chunk(blob: bytes, at: int, what: str) -> tuple[int, bytes]:
    """(chunk type, chunk data) of the chunk beginning `blob`, which starts at file offset `at`."""
    plain = _plain(blob, at)
    if len(plain) < _CHUNK_HEADER:
        raise FormatError(f"not a readable ArrayRecord file: its {what} chunk is truncated")
    data_size, = struct.unpack_from("<Q", plain, 8)
    chunk_type = plain[24]
    if _CHUNK_HEADER + data_size > len(plain):
        raise FormatError(f"not a readable ArrayRecord file: its {what} chunk is truncated")
    return chunk_type, bytes(plain[_CHUNK_HEADER:_CHUNK_HEADER + data_size])


def _records(chunk: tuple[int, bytes], what: str) -> list[bytes]:
    """The records of a simple chunk ('r'), uncompressed or zstd (what array_record writes its
    postscript and, by default, its footer with)."""
    chunk_type, data = chunk
    if chunk_type != ord("r") or not data:
        raise FormatError(f"not a readable ArrayRecord file: its {what} is not a simple Riegeli chunk")
    compression = data[0]
    sizes_size, position = _varint(data, 1)
    sizes = _decompress(data[position:position + sizes_size], compression, what)
    values = _decompress(data[position + sizes_size:], compression, what)
    records, at, offset = [], 0, 0
    while at < len(sizes):
        length, at = _varint(sizes, at)
        records.append(values[offset:offset + length])
        offset += length
    if offset != len(values):
        raise FormatError(f"not a readable ArrayRecord file: its {what} record sizes do not add up")
    return records


def _decompress(block: bytes, compression: int, what: str) -> bytes:
    if compression == 0:
        return block
    if compression != ord("z"):
        raise FormatError(f"ArrayRecord {what} compressed with {chr(compression)!r} (not zstd): read from a local disk instead")
    size, position = _varint(block, 0)
    if size > MAX_FOOTER_BYTES:  # zstandard would allocate what the prefix claims before decoding
        raise FormatError(f"not a readable ArrayRecord file: its {what} claims {size} bytes decompressed "
                          f"(more than {MAX_FOOTER_BYTES})")
    import zstandard

    try:
        out = zstandard.ZstdDecompressor().decompress(block[position:], max_output_size=size)
    except zstandard.ZstdError as error:
        raise FormatError(f"not a readable ArrayRecord file: its {what} does not decompress ({error})") from None
    if len(out) != size:
        raise FormatError(f"not a readable ArrayRecord file: its {what} decompresses to {len(out)} bytes, not {size}")
    return out


def _varint(data: bytes, position: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if position >= len(data) or shift > 63:
            raise FormatError("not a readable ArrayRecord file: a malformed varint in its footer or postscript")
        byte = data[position]
        value |= (byte & 0x7F) << shift
        position += 1
        shift += 7
        if byte < 0x80:
            return value, position


def _fields(message: bytes) -> dict[int, int | bytes]:
    """The varint and length-delimited fields of a small protobuf message (last value wins)."""
    fields: dict[int, int | bytes] = {}
    position = 0
    while position < len(message):
        key, position = _varint(message, position)
        number, wire = key >> 3, key & 7
        if wire == 0:
            fields[number], position = _varint(message, position)
        elif wire == 2:
            length, position = _varint(message, position)
            fields[number] = message[position:position + length]
            position += length
        else:
            raise FormatError("not a readable ArrayRecord file: an unexpected field in its footer or postscript")
    return fields
