"""Copy mode's default check of copied samples: their structure, without a decoder.

A copied segment's samples are the source's bytes. Decoding every one (`--verify_copies=full`)
cost 6.2x the CPU of the copy itself; most damage a stored file suffers (a truncated or zero-filled
download, bytes from elsewhere written over the mdat) breaks the framing every decoder relies on
first, and that can be read in microseconds per sample:

- H.264 / HEVC (`avc1`, `avc3`, `hvc1`, `hev1`): the length-prefixed NAL units tile each sample
  exactly; each NAL's forbidden bit is 0 (HEVC: temporal id not 0) and, once trailing zero bytes
  are set aside (some muxers leave them; FFmpeg drops them), it holds no 0x000000, 0x000001 or
  0x000002 (H.264 7.4.1 and HEVC 7.4.2 forbid them); each sample holds a picture (a VCL NAL unit).
- AV1 (`av01`): the OBUs tile each sample exactly (AV1-ISOBMFF: every OBU but the last carries its
  size), their forbidden bit is 0, each sample holds a frame (a FRAME or FRAME_HEADER OBU).

Only what the specifications forbid is refused (nothing a valid file holds), so a valid copy is
never refused; what FFmpeg's decoders merely tolerate (trailing zeros, reserved OBU types) passes.

What this cannot see is damage inside entropy-coded picture data that keeps the framing intact (a
flipped bit inside a slice): only a decoder finds that, and FFmpeg's decoders often conceal it
without an error; the full decode stays available for it.
"""

from __future__ import annotations

import re
import struct

import numpy as np

__all__ = ["SampleFormat", "sample_format", "check_samples"]

_FORBIDDEN_IN_NAL = re.compile(rb"\x00\x00[\x00-\x02]")
_H264_VCL = frozenset(range(1, 6))
_AV1_FRAME_OBUS = frozenset((3, 6))  # OBU_FRAME_HEADER, OBU_FRAME


# The FFmpeg decoder each kind opens, as a demuxer would pick it (AV1: dav1d, not FFmpeg's hardware-only av1).
DECODERS = {"h264": "h264", "hevc": "hevc", "av1": "libdav1d"}


class SampleFormat:
    """How a track's samples are framed: `kind` "h264", "hevc" or "av1"; `length_size` the bytes
    of each NAL unit's length prefix (H.264/HEVC); `config` the sample entry's decoder configuration
    (avcC, hvcC or av1C payload: a decoder's extradata)."""

    __slots__ = ("kind", "length_size", "config")

    def __init__(self, kind: str, length_size: int = 0, config: bytes = b"") -> None:
        self.kind, self.length_size, self.config = kind, length_size, config


def sample_format(stsd: bytes) -> SampleFormat | None:
    """The framing of the first sample entry of a whole `stsd` box, or None for a codec (or a
    configuration) this module does not parse: the caller decodes those instead."""
    try:
        entry = 16  # header, version and flags, entry count
        entry_end = entry + struct.unpack_from(">I", stsd, entry)[0]
        kind = stsd[entry + 4:entry + 8]
        position = entry + 86  # after the VisualSampleEntry's fixed fields (ISO 14496-12 12.1.3)
        while position + 8 <= entry_end:
            size, box = struct.unpack_from(">I4s", stsd, position)
            if size < 8:
                return None
            config = stsd[position + 8:position + size]
            if box == b"avcC" and kind in (b"avc1", b"avc3"):
                return SampleFormat("h264", (config[4] & 3) + 1, config)
            if box == b"hvcC" and kind in (b"hvc1", b"hev1"):
                return SampleFormat("hevc", (config[21] & 3) + 1, config)
            if box == b"av1C" and kind == b"av01":
                return SampleFormat("av1", 0, config)
            position += size
    except (struct.error, IndexError):
        pass
    return None


def check_samples(form: SampleFormat, data: bytes | memoryview, offsets: np.ndarray, sizes: np.ndarray) -> str | None:
    """Why the samples at `offsets` / `sizes` of `data` are not well-formed (naming the sample,
    counted from 0), or None when every one is."""
    view = memoryview(data)
    check = _check_av1 if form.kind == "av1" else _check_nal_units
    for number, (offset, size) in enumerate(zip(offsets.tolist(), sizes.tolist())):
        if offset < 0 or offset + size > len(view):
            return f"sample {number} ends beyond the file"
        problem = check(view[offset:offset + size], form)
        if problem is not None:
            return f"sample {number}: {problem}"
    return None


def _check_nal_units(sample: memoryview, form: SampleFormat) -> str | None:
    hevc, width = form.kind == "hevc", form.length_size
    position, end, pictures = 0, len(sample), 0
    while position < end:
        if position + width > end:
            return "a NAL unit length field is cut off"
        length = int.from_bytes(sample[position:position + width], "big")
        position += width
        if length < (2 if hevc else 1) or position + length > end:  # end-of-sequence units are the header alone
            return f"a NAL unit of {length} bytes does not fit the sample's {end} bytes"
        nal = sample[position:position + length]
        header = nal[0]
        if header & 0x80:
            return "a NAL unit's forbidden bit is set"
        if hevc:
            if nal[1] & 7 == 0:
                return "an HEVC NAL unit with temporal id 0 (nuh_temporal_id_plus1 = 0)"
            pictures += (header >> 1) & 0x3F < 32
        else:
            pictures += (header & 0x1F) in _H264_VCL
        if _FORBIDDEN_IN_NAL.search(bytes(nal).rstrip(b"\x00")) is not None:
            return "a NAL unit holds a start code or zero run (0x000000-0x000002)"
        position += length
    return None if pictures else "no picture (VCL NAL unit) in the sample"


def _check_av1(sample: memoryview, form: SampleFormat) -> str | None:
    position, end, frames = 0, len(sample), 0
    while position < end:
        header = sample[position]
        if header & 0x80:
            return "an OBU's forbidden bit is set"
        kind = (header >> 3) & 0xF
        position += 2 if header & 4 else 1  # the extension byte
        if position > end:
            return "an OBU header is cut off"
        if header & 2:  # obu_has_size_field: leb128
            size = shift = 0
            for _ in range(8):
                if position >= end:
                    return "an OBU size field is cut off"
                byte = sample[position]
                position += 1
                size |= (byte & 0x7F) << shift
                shift += 7
                if not byte & 0x80:
                    break
            else:
                return "an OBU size field longer than 8 bytes"
        else:
            size = end - position  # only the sample's last OBU may omit its size
        if position + size > end:
            return f"an OBU of {size} bytes does not fit the sample's {end} bytes"
        frames += kind in _AV1_FRAME_OBUS
        position += size
    return None if frames else "no frame (FRAME or FRAME_HEADER OBU) in the sample"
