"""What a video's headers declare, checked before any decoder allocates for it: a few bytes of
header must not make the converter decode an 8000x8000 stream, or publish that size for a 64x48
camera. The MP4 sample entry's size and the H.264 sequence parameter set's (ITU-T H.264
7.3.2.1.1, parsed here) must agree and stay within the limits below."""

from __future__ import annotations

import struct
from typing import BinaryIO

from formats.errors import VideoError
from formats.video import mp4

__all__ = ["MAX_VIDEO_PIXELS", "MAX_VIDEO_SIDE", "check_size", "check_declared", "declared_sizes", "sps_size", "unescape_nal"]

# Picture sizes refused before a decoder allocates for them: 8K UHD (7680 x 4320, ~50 MB a decoded
# yuv420p frame, and a decoder holds several) is more than any robot camera writes; a header
# claiming more (an SPS rewritten to 8000 x 8000 in a 2 kB file) would cost GBs to decode.
MAX_VIDEO_PIXELS = 7680 * 4320
# The longest side accepted, whatever the area: 8192 is the largest H.264 level 6.2 and AV1 level 6.x allow.
MAX_VIDEO_SIDE = 8192


def check_size(width: int, height: int, what: str) -> None:
    if width > MAX_VIDEO_SIDE or height > MAX_VIDEO_SIDE or width * height > MAX_VIDEO_PIXELS:
        raise VideoError(f"{what} declares {width}x{height} pixels, more than this converter decodes "
                         f"({MAX_VIDEO_SIDE} a side, {MAX_VIDEO_PIXELS:,} in all); refused before decoding")


def check_declared(source: BinaryIO | str) -> None:
    """An MP4's declared picture sizes, read from its moov before any decoder sees the file: each
    within the limits, and its H.264 SPS (what FFmpeg allocates by) the same as its sample entry
    (what the container says). Files that are not MP4 or not H.264 pass to the later checks."""
    if isinstance(source, str):
        with open(source, "rb") as handle:
            entry, coded = declared_sizes(handle)
    elif getattr(source, "seekable", lambda: False)():
        position = source.tell()
        try:
            entry, coded = declared_sizes(source)
        finally:
            source.seek(position)
    else:
        return
    if coded is not None:
        check_size(*coded, "its H.264 sequence parameter set")
    if entry is not None and entry != (0, 0):
        check_size(*entry, "its MP4 sample entry")
    if coded is not None and entry not in (None, (0, 0)) and not _same_picture(coded, entry):
        raise VideoError(f"its H.264 sequence parameter set declares {coded[0]}x{coded[1]} pixels, its MP4 sample entry "
                         f"{entry[0]}x{entry[1]}: a damaged or forged header; refused before decoding")


def _same_picture(coded: tuple[int, int], entry: tuple[int, int]) -> bool:
    """The SPS's (cropped) size and the sample entry's agree, or the entry gives the coded size
    before cropping (a muxer writing 1920x1088 for a 1920x1080 picture): within one macroblock."""
    return all(0 <= e - c < 16 for c, e in zip(coded, entry))


def declared_sizes(source: BinaryIO) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
    """(width, height) of an MP4's video sample entry, and that its H.264 SPS (avcC) declares;
    each None where absent or unreadable (not an MP4, another codec). Reads the moov box only:
    what a decoder would allocate for is known before any decoder opens."""
    try:
        moov = mp4.top_level(source).get(b"moov")
        if moov is None:
            return None, None
        for _, trak_payload, trak_end in mp4.children(moov, 8, len(moov)).get(b"trak", []):
            box = mp4.children(moov, trak_payload, trak_end)[b"mdia"][0]
            mdia = mp4.children(moov, box[1], box[2])
            if moov[mdia[b"hdlr"][0][1] + 8:mdia[b"hdlr"][0][1] + 12] != b"vide":
                continue
            box = mp4.children(moov, *mp4.children(moov, *mdia[b"minf"][0][1:])[b"stbl"][0][1:])[b"stsd"][0]
            entry = box[1] + 8  # the first sample entry: a VisualSampleEntry (ISO 14496-12 12.1.3)
            entry_end = entry + struct.unpack_from(">I", moov, entry)[0]
            size = struct.unpack_from(">HH", moov, entry + 32)
            coded = None
            if moov[entry + 4:entry + 8] in (b"avc1", b"avc3"):
                avcc = mp4.children(moov, entry + 86, entry_end).get(b"avcC")
                if avcc and moov[avcc[0][1] + 5] & 0x1F:
                    length = struct.unpack_from(">H", moov, avcc[0][1] + 6)[0]
                    coded = sps_size(moov[avcc[0][1] + 8:avcc[0][1] + 8 + length])
            return (int(size[0]), int(size[1])), coded
    except (ValueError, KeyError, IndexError, struct.error):
        pass
    return None, None

_H264_HIGH_PROFILES = {100, 110, 122, 244, 44, 83, 86, 118, 128, 138, 139, 134, 135}


def unescape_nal(data: bytes) -> bytes:
    """A NAL unit's payload without its emulation-prevention bytes (00 00 03 -> 00 00)."""
    return data.replace(b"\x00\x00\x03", b"\x00\x00")


class _Bits:
    """Big-endian bit reader with Exp-Golomb codes (H.264 7.2, 9.1)."""

    def __init__(self, data: bytes) -> None:
        self.bits, self.position = "".join(f"{byte:08b}" for byte in data), 0

    def u(self, count: int) -> int:
        if self.position + count > len(self.bits):
            raise ValueError("SPS ends early")
        value = int(self.bits[self.position:self.position + count] or "0", 2)
        self.position += count
        return value

    def ue(self) -> int:
        zeros = 0
        while self.u(1) == 0:
            zeros += 1
            if zeros > 31:
                raise ValueError("Exp-Golomb code over 32 bits")
        return (1 << zeros) - 1 + self.u(zeros)

    def se(self) -> int:
        value = self.ue()
        return (value + 1) // 2 if value % 2 else -(value // 2)


def sps_size(sps: bytes) -> tuple[int, int]:
    """(width, height) an H.264 sequence parameter set declares, cropping applied (7.3.2.1.1);
    `sps` is the NAL unit, header byte first. ValueError when it cannot be read."""
    if not sps or sps[0] & 0x1F != 7:
        raise ValueError("not an SPS")
    data = unescape_nal(sps[1:])
    bits = _Bits(data[3:])
    profile, chroma = data[0], 1
    bits.ue()  # seq_parameter_set_id
    if profile in _H264_HIGH_PROFILES:
        chroma = bits.ue()
        if chroma == 3:
            bits.u(1)  # separate_colour_plane_flag
        bits.ue(), bits.ue(), bits.u(1)  # bit depths, qpprime_y_zero_transform_bypass_flag
        if bits.u(1):  # seq_scaling_matrix_present_flag: skip the lists
            for index in range(8 if chroma != 3 else 12):
                if bits.u(1):
                    last = scale = 8
                    for _ in range(16 if index < 6 else 64):
                        if scale:
                            scale = (last + bits.se() + 256) % 256
                        last = scale or last
    bits.ue()  # log2_max_frame_num_minus4
    order = bits.ue()
    if order == 0:
        bits.ue()
    elif order == 1:
        bits.u(1), bits.se(), bits.se()
        for _ in range(bits.ue()):
            bits.se()
    bits.ue(), bits.u(1)  # max_num_ref_frames, gaps_in_frame_num_value_allowed_flag
    width_mbs, height_units = bits.ue() + 1, bits.ue() + 1
    frame_mbs_only = bits.u(1)
    if not frame_mbs_only:
        bits.u(1)  # mb_adaptive_frame_field_flag
    bits.u(1)  # direct_8x8_inference_flag
    width, height = width_mbs * 16, (2 - frame_mbs_only) * height_units * 16
    if bits.u(1):  # frame_cropping_flag
        left, right, top, bottom = bits.ue(), bits.ue(), bits.ue(), bits.ue()
        unit_x = 1 if chroma in (0, 3) else 2
        unit_y = (2 - frame_mbs_only) * (2 if chroma == 1 else 1)
        width, height = width - unit_x * (left + right), height - unit_y * (top + bottom)
    return width, height
