"""Video policy: how each video column is written (copy, or encode and with which options), decided
at plan time from metadata, and the codecs' defaults and limits behind those decisions.

Depth and any source deeper than 8 bits are never squeezed through a lossy 8-bit codec:
`options_for` routes them to lossless FFV1 (in MP4), keeping their pixel format. The PyAV work
itself is in formats/video/__init__.py (decode, encode) and formats/video/stream_copy.py (copy mode).
"""

from __future__ import annotations

import dataclasses
import math

import av

from formats.errors import ConversionError
from formats.sequence import FROM_IMAGES

__all__ = [
    "EncodeOptions",
    "options_for",
    "is_high_bit_depth",
    "padded_size",
    "lossless_pix_fmt",
    "lossless_options",
    "near_lossless_options",
    "plan_column",
    "declared_size",
    "COPY",
    "REENCODE",
    "MODES",
    "ENCODERS",
    "MIN_PSNR",
    "quality_ladder",
]

# Codec name as containers report it -> the encoder PyAV's wheels ship for it.
ENCODERS = {"h264": "libx264", "hevc": "libx265", "av1": "libsvtav1", "ffv1": "ffv1"}


# Defaults chosen on measurements (docs/video.md): luma PSNR >= 35 dB on real camera data at
# yuv420p, a keyframe every 10 frames (random access decodes at most 9 extra frames, files
# about half the size of lerobot's keyframe-every-2), the encoders' balanced presets.
DEFAULT_CRF = {"h264": 16, "hevc": 16, "av1": 20}
# libx265 (PyAV 18.1's wheel) wrote out of bounds under valgrind on widths 16-48 px and not from 50
# px up; the process then aborted ("free(): invalid next size") after an unrelated allocation.
# 64 is its largest coding-tree size: narrower frames are refused for hevc.
MIN_HEVC_WIDTH = 64
DEFAULT_GOP = 10
# The luma PSNR (dB) every frame of a lossy encode must keep against its source, checked in the pass
# that encodes it (`video.encode_to_floor`); `validate --deep` holds published files to the same floor.
# Measured defaults miss it on content they were not tuned on (noise, fine texture: lerobot 0.3.3 PNG
# cameras gave 33.3 dB at crf 16), so the crf of such a segment is lowered in CRF_STEP steps.
MIN_PSNR = 35.0
CRF_STEP = 6
# The lowest crf a segment is lowered to: x264 crf 0 is lossless; SVT-AV1 crf 0 is not its best
# (30.2 dB where crf 1 gave 52.2 on noise frames).
LOWEST_CRF = {"h264": 0, "hevc": 0, "av1": 1}
DEFAULT_PRESET = {"h264": "medium", "hevc": "medium", "av1": "8"}
CRF_RANGE = {"h264": (0, 51), "hevc": (0, 51), "av1": (0, 63)}
# What each encoder accepts of --video_pix_fmt (AV1 through SVT: 4:2:0 only).
PIX_FMTS = {
    "h264": ("yuv420p", "yuv422p", "yuv444p"),
    "hevc": ("yuv420p", "yuv422p", "yuv444p"),
    "av1": ("yuv420p",),
}


@dataclasses.dataclass(frozen=True)
class EncodeOptions:
    """How to encode: codec, quality (crf), keyframe interval (gop), preset, pixel format, and the
    luma PSNR floor each frame must keep (0: none).

    None means the codec's documented default (`resolved()` fills them in); `ffv1` is lossless
    and ignores crf, preset and the floor.
    """

    codec: str = "h264"
    crf: int | None = None
    gop: int | None = None
    preset: str | None = None
    pix_fmt: str = "yuv420p"
    min_psnr: float | None = None

    def resolved(self) -> EncodeOptions:
        """These options with every default filled in and checked; raises ConversionError."""
        codec = self.codec.lower()
        if codec not in ENCODERS:
            raise ConversionError(f"video codec {self.codec!r} is not supported (choose from {', '.join(sorted(ENCODERS))})")
        if codec == "ffv1":
            return EncodeOptions(codec, None, 1 if self.gop is None else self.gop, None, self.pix_fmt, None)
        if self.pix_fmt not in PIX_FMTS[codec]:
            raise ConversionError(
                f"pixel format {self.pix_fmt!r} is not available for {codec} (choose from {', '.join(PIX_FMTS[codec])})"
            )
        crf = DEFAULT_CRF[codec] if self.crf is None else int(self.crf)
        low, high = CRF_RANGE[codec]
        if not low <= crf <= high:
            raise ConversionError(f"crf {crf} is outside {low}..{high} for {codec}")
        gop = DEFAULT_GOP if self.gop is None else int(self.gop)
        if gop < 1:
            raise ConversionError(f"gop {gop} must be at least 1 (1: every frame a keyframe)")
        floor = MIN_PSNR if self.min_psnr is None else float(self.min_psnr)
        if not 0 <= floor < math.inf:
            raise ConversionError(f"luma PSNR floor {floor:g} dB must be 0 (none) or more")
        return EncodeOptions(codec, crf, gop, self.preset or DEFAULT_PRESET[codec], self.pix_fmt, floor)

    def column_meta(self) -> dict:
        """What mixtrain.json records of an encode (crf/preset/floor only where they mean something)."""
        meta = {"codec": self.codec, "pix_fmt": self.pix_fmt, "gop": self.gop}
        if self.codec == "ffv1":
            meta["lossless"] = True
        else:
            meta.update(crf=self.crf, preset=self.preset, min_psnr=self.min_psnr)
        return meta


def quality_ladder(options: EncodeOptions) -> list[EncodeOptions]:
    """The resolved options a segment is encoded with, in order, until its frames keep the floor:
    the requested crf, then CRF_STEP lower each time down to the codec's LOWEST_CRF."""
    if options.codec == "ffv1" or not options.min_psnr:
        return [options]
    lowest = LOWEST_CRF[options.codec]
    crfs = [options.crf]
    while crfs[-1] > lowest:
        crfs.append(max(lowest, crfs[-1] - CRF_STEP))
    return [dataclasses.replace(options, crf=crf) for crf in crfs]


def is_high_bit_depth(pix_fmt: str | None) -> bool:
    """More than 8 bits per component (gray16le depth, 10-bit yuv...)."""
    if not pix_fmt:
        return False
    try:
        return any(component.bits > 8 for component in av.VideoFormat(pix_fmt).components)
    except (ValueError, av.error.FFmpegError):
        return False


def options_for(requested: EncodeOptions, *, source_pix_fmt: str | None, is_depth: bool) -> EncodeOptions:
    """The options a column is encoded with: depth and >8-bit sources go lossless (FFV1, their own
    pixel format) whatever was requested, because a lossy 8-bit codec would destroy their values;
    FFV1 requested (--video_codec=ffv1) keeps each column's own pixel format too."""
    if is_depth or is_high_bit_depth(source_pix_fmt):
        return EncodeOptions("ffv1", None, None, None, lossless_pix_fmt(source_pix_fmt)).resolved()
    if requested.codec == "ffv1":
        return EncodeOptions("ffv1", None, requested.gop, None, lossless_pix_fmt(source_pix_fmt)).resolved()
    return requested.resolved()


def lossless_pix_fmt(source_pix_fmt: str | None) -> str | None:
    """The FFV1 pixel format that holds `source_pix_fmt` without loss (None: decided by the first
    frame); big-endian 16-bit gray (16-bit PNG) maps to its little-endian twin."""
    if not source_pix_fmt:
        return None
    if source_pix_fmt.endswith("be"):
        source_pix_fmt = source_pix_fmt[:-2] + "le"
    if any(fmt.name == source_pix_fmt for fmt in av.Codec("ffv1", "w").video_formats or ()):
        return source_pix_fmt
    deep = is_high_bit_depth(source_pix_fmt)
    if source_pix_fmt.startswith(("gray", "ya")):
        return "gray16le" if deep else "gray"
    if _is_rgb(source_pix_fmt):  # RGB through a YUV matrix would round: FFV1's own RGB formats keep every value
        return "rgb48le" if deep else "bgr0"
    return "yuv444p16le" if deep else "yuv444p"


def _is_rgb(pix_fmt: str) -> bool:
    try:
        return bool(av.VideoFormat(pix_fmt).is_rgb)
    except (ValueError, av.error.FFmpegError):
        return False


def padded_size(width: int, height: int, pix_fmt: str) -> tuple[int, int]:
    """The encoded size: chroma-subsampled formats need even widths (4:2:x) and heights (4:2:0)."""
    even_width = "420" in pix_fmt or "422" in pix_fmt or pix_fmt in ("nv12", "nv21", "nv16")
    even_height = "420" in pix_fmt or pix_fmt in ("nv12", "nv21")
    return width + (width % 2 if even_width else 0), height + (height % 2 if even_height else 0)


# 8-bit YUV: H.264 lossless (x264 crf 0, High 4:4:4 Predictive), which Chromium plays and which is
# 18 % smaller than FFV1 on so100_tiny; anything else (gray, 10/12/16-bit, 12-bit depth): FFV1.
_X264_LOSSLESS = ("yuv420p", "yuv422p", "yuv444p")


def lossless_options(pix_fmt: str | None) -> list[EncodeOptions]:
    """The encodes copy mode tries, in order, where packets cannot be copied (docs/lerobot_v3.md),
    all keeping `pix_fmt`: x264 lossless for 8-bit YUV, then FFV1 for everything."""
    ffv1 = EncodeOptions("ffv1", pix_fmt=lossless_pix_fmt(pix_fmt)).resolved()
    if pix_fmt in _X264_LOSSLESS:
        return [EncodeOptions("h264", 0, DEFAULT_GOP, "medium", pix_fmt).resolved(), ffv1]
    return [ffv1]


_NEAR_LOSSLESS_CRF = {"h264": 10, "hevc": 10, "av1": 8}


def near_lossless_options(codec: str, pix_fmt: str | None) -> EncodeOptions:
    """What re-timing encodes with by default: the source's codec at visually lossless quality,
    or FFV1 (lossless) for what those encoders cannot hold."""
    if codec in _NEAR_LOSSLESS_CRF and pix_fmt in PIX_FMTS[codec]:
        return EncodeOptions(codec, _NEAR_LOSSLESS_CRF[codec], None, "12" if codec == "av1" else None, pix_fmt).resolved()
    return EncodeOptions("ffv1", pix_fmt=lossless_pix_fmt(pix_fmt))


COPY, REENCODE = "copy", "reencode"
MODES = (COPY, REENCODE)


def plan_column(meta: dict, *, mode: str, requested: EncodeOptions) -> tuple[EncodeOptions | None, dict]:
    """How one video column is written, decided at plan time from its metadata.

    `meta` is the column's plan-time entry (fps, codec, resolution, pix_fmt, is_depth_map, and
    `encoded_from: images` for cameras stored as images, which are always encoded). Returns the
    encode options (None: packet copy) and the column_types entry the output will carry.
    """
    if mode not in MODES:
        raise ConversionError(f"video mode {mode!r} is not one of {', '.join(MODES)}")
    entry = dict(meta)
    from_images = meta.get("encoded_from") == FROM_IMAGES
    if mode == COPY and not from_images:
        # Packets of the source, pixels identical to it; a camera slower than the steps has its
        # frames repeated by re-timing, encoded at near-lossless quality.
        entry["written_as"] = "retime" if meta.get("retimed") else "copy"
        return None, entry
    options = options_for(requested, source_pix_fmt=meta.get("pix_fmt"), is_depth=bool(meta.get("is_depth_map")))
    if meta.get("codec") and not from_images:
        entry["source_codec"] = meta["codec"]
    if meta.get("pix_fmt"):
        entry["source_pix_fmt"] = meta["pix_fmt"]
    entry.update(options.column_meta(), written_as="encode")
    resolution = meta.get("resolution") or {}
    width, height = resolution.get("width"), resolution.get("height")
    if width and height:
        padded = padded_size(int(width), int(height), options.pix_fmt or "")
        entry["resolution"] = {"width": padded[0], "height": padded[1]}
        if padded != (width, height):
            entry["source_resolution"] = {"width": width, "height": height}
            entry["padding"] = "edge: last column/row repeated on the right/bottom"
    return options, entry


def declared_size(entry: dict) -> tuple[int, int] | None:
    """(width, height) the source frames of a planned column must have, if the metadata says."""
    resolution = entry.get("source_resolution") or entry.get("resolution") or {}
    if resolution.get("width") and resolution.get("height"):
        return int(resolution["width"]), int(resolution["height"])
    return None
