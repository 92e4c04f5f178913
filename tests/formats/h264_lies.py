"""Test helper: rewrite the picture size an H.264 MP4 declares, in its SPS (the avcC box, what
FFmpeg sizes its decoder by) or in its sample entry (avc1 width/height), nothing else changed.
What issue 27's "2,257-byte MP4 whose SPS declares 8000x8000" was."""

from __future__ import annotations

import struct

_HIGH_PROFILES = {100, 110, 122, 244, 44, 83, 86, 118, 128, 138, 139, 134, 135}


def _unescape(data: bytes) -> bytes:
    out, zeros = bytearray(), 0
    for byte in data:
        if zeros >= 2 and byte == 3:
            zeros = 0
            continue
        out.append(byte)
        zeros = zeros + 1 if byte == 0 else 0
    return bytes(out)


def _escape(data: bytes) -> bytes:
    out, zeros = bytearray(), 0
    for byte in data:
        if zeros >= 2 and byte <= 3:
            out.append(3)
            zeros = 0
        out.append(byte)
        zeros = zeros + 1 if byte == 0 else 0
    return bytes(out)


def _ue(bits: str, position: int) -> tuple[int, int]:
    zeros = 0
    while bits[position + zeros] == "0":
        zeros += 1
    value = int(bits[position + zeros:position + 2 * zeros + 1], 2) - 1
    return value, position + 2 * zeros + 1


def _ue_bits(value: int) -> str:
    text = bin(value + 1)[2:]
    return "0" * (len(text) - 1) + text


def patch_sps(sps: bytes, width: int, height: int) -> bytes:
    """An SPS NAL unit (header byte first) declaring width x height (multiples of 16, frame MBs only)."""
    rbsp = _unescape(sps[1:])
    profile = rbsp[0]
    bits = "".join(f"{byte:08b}" for byte in rbsp[3:])
    _, position = _ue(bits, 0)  # seq_parameter_set_id
    if profile in _HIGH_PROFILES:
        chroma, position = _ue(bits, position)
        position += chroma == 3
        _, position = _ue(bits, position)  # bit_depth_luma_minus8
        _, position = _ue(bits, position)  # bit_depth_chroma_minus8
        position += 1  # qpprime_y_zero_transform_bypass_flag
        assert bits[position] == "0", "scaling matrices are not handled"
        position += 1
    _, position = _ue(bits, position)  # log2_max_frame_num_minus4
    order, position = _ue(bits, position)
    assert order in (0, 2), "pic_order_cnt_type 1 is not handled"
    if order == 0:
        _, position = _ue(bits, position)
    _, position = _ue(bits, position)  # max_num_ref_frames
    position += 1  # gaps_in_frame_num_value_allowed_flag
    start = position
    _, position = _ue(bits, position)
    _, position = _ue(bits, position)
    bits = bits[:start] + _ue_bits(width // 16 - 1) + _ue_bits(height // 16 - 1) + bits[position:]
    bits += "0" * (-len(bits) % 8)
    body = rbsp[:3] + bytes(int(bits[i:i + 8], 2) for i in range(0, len(bits), 8))
    return sps[:1] + _escape(body)


def _find(data: bytes, kind: bytes, start: int) -> int:
    """Start of the first box of `kind` at or after `start` (its size field)."""
    at = data.index(kind, start) - 4
    return at


def declare_sps_size(data: bytes, width: int, height: int) -> bytes:
    """The MP4 `data` with every SPS of its avcC rewritten to width x height; the box sizes above
    avcC (and chunk offsets, when moov precedes mdat) follow."""
    data = bytearray(data)
    moov = _find(data, b"moov", 0)
    path = [moov]
    for kind in (b"trak", b"mdia", b"minf", b"stbl", b"stsd", b"avc1", b"avcC"):
        path.append(_find(data, kind, path[-1] + 8))
    avcc = path[-1]
    body = avcc + 8
    count = data[body + 5] & 0x1F
    position, rebuilt = body + 6, bytearray(data[body:body + 6])
    for _ in range(count):
        length = struct.unpack_from(">H", data, position)[0]
        sps = patch_sps(bytes(data[position + 2:position + 2 + length]), width, height)
        rebuilt += struct.pack(">H", len(sps)) + sps
        position += 2 + length
    end = avcc + struct.unpack_from(">I", data, avcc)[0]
    rebuilt += data[position:end]
    delta = len(rebuilt) - (end - body)
    data[body:end] = rebuilt
    for box in path:
        struct.pack_into(">I", data, box, struct.unpack_from(">I", data, box)[0] + delta)
    mdat = data.find(b"mdat") - 4
    if moov < mdat:  # the samples moved by delta
        stco = data.find(b"stco", moov)
        if stco >= 0:
            entries = struct.unpack_from(">I", data, stco + 8)[0]
            for index in range(entries):
                at = stco + 12 + 4 * index
                struct.pack_into(">I", data, at, struct.unpack_from(">I", data, at)[0] + delta)
    return bytes(data)


def declare_entry_size(data: bytes, width: int, height: int) -> bytes:
    """The MP4 `data` with its avc1 sample entry's width and height rewritten (the SPS untouched)."""
    data = bytearray(data)
    entry = _find(data, b"avc1", _find(data, b"stsd", _find(data, b"moov", 0)) + 8)
    struct.pack_into(">HH", data, entry + 32, width, height)
    return bytes(data)
