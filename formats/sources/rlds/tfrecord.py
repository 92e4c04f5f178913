"""TFRecord framing without TensorFlow: scan record offsets, read one record, write records.

A TFRecord file is a sequence of records, each

    uint64 length (little endian) | uint32 masked crc32c(length) | data | uint32 masked crc32c(data)

with masked(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8 (mod 2^32). `scan` reads only the
12-byte headers and seeks over the data, so indexing a shard costs one header read per record;
`read_record` then reads exactly one record and checks both checksums. crc32c comes from
google-crc32c (C implementation; the same library gcsfs uses).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from typing import BinaryIO

import google_crc32c

from formats.errors import FormatError

__all__ = ["scan", "read_record", "write_records", "masked_crc"]

_HEADER = struct.Struct("<QI")
_FOOTER = struct.Struct("<I")
# A record larger than this is a corrupt length field, not an episode (refused before reading).
MAX_RECORD_BYTES = 1 << 36


def masked_crc(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def scan(handle: BinaryIO, size: int) -> Iterator[tuple[int, int]]:
    """Yield (offset of the data, length) for every record, checking the length checksums and
    that each record fits in the file's `size` bytes."""
    position = 0
    index = 0
    while position < size:
        handle.seek(position)
        header = handle.read(_HEADER.size)
        if len(header) < _HEADER.size:
            raise FormatError(f"record {index}: truncated header at byte {position} (file ends at {size})")
        length, length_crc = _HEADER.unpack(header)
        if masked_crc(header[:8]) != length_crc:
            raise FormatError(f"record {index}: length checksum mismatch at byte {position} (corrupt file)")
        if length > MAX_RECORD_BYTES:
            raise FormatError(f"record {index}: declared length {length} bytes at byte {position} is not plausible")
        end = position + _HEADER.size + length + _FOOTER.size
        if end > size:
            raise FormatError(f"record {index}: truncated: needs bytes up to {end}, file ends at {size}")
        yield position + _HEADER.size, length
        position = end
        index += 1


def read_record(handle: BinaryIO, offset: int, length: int) -> bytes:
    """The data of the record at `offset` (as `scan` yields it), its checksum verified."""
    handle.seek(offset)
    data = handle.read(length + _FOOTER.size)
    if len(data) < length + _FOOTER.size:
        raise FormatError(f"record at byte {offset}: truncated ({len(data)} of {length + _FOOTER.size} bytes)")
    payload, (crc,) = data[:length], _FOOTER.unpack(data[length:])
    if masked_crc(payload) != crc:
        raise FormatError(f"record at byte {offset}: data checksum mismatch (corrupt file)")
    return payload


def write_records(handle: BinaryIO, records: Iterable[bytes]) -> int:
    """Write records with their checksums; returns how many."""
    count = 0
    for record in records:
        length = struct.pack("<Q", len(record))
        handle.write(length + _FOOTER.pack(masked_crc(length)) + record + _FOOTER.pack(masked_crc(record)))
        count += 1
    return count
