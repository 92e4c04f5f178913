"""Video through PyAV: cut a time range out of an MP4 by packet copy, re-encode, encode image
sequences, probe, decode.

Copy mode: the packets of [start, end) are copied into a new MP4 whose timestamps start at 0, so
the output decodes to the source's pixels bit for bit. Plain MP4s are cut on their sample tables
(`formats.mp4`, no per-packet work); anything else is remuxed through PyAV. Packets can be copied
alone only when they are one unbroken decode-order run starting on a keyframe that is shown first:
lerobot's recorder writes each episode as its own GOP run, but convert_image_to_video_dataset
encodes many episodes in one stream (episodes start inside GOPs, HEVC B-frames reference frames of
the next episode). Such a segment is decoded and encoded losslessly in the source's pixel format
(x264 lossless for 8-bit YUV, else FFV1), checked by decoding it again, so it still decodes to the
source's pixels; `CopyResult.note()` says so for mixtrain.json. A remuxed or encoded segment's
frame count is counted by decoding the written file.

Encoding (re-encode mode, image sequences) takes decoded frames, encoded JPEG/PNG bytes or raw
uint8/uint16 arrays and writes frame i at pts i in a 1/fps time base. 4:2:0 and 4:2:2 need even
sizes: an odd frame is padded on the right/bottom by repeating its last column/row (nothing is
cropped away; `EncodeResult.padded_from` says so). Depth and any source deeper than 8 bits are
never squeezed through a lossy 8-bit codec: `options_for` routes them to lossless FFV1 (in MP4),
keeping their pixel format.

Facts from real files (see ../shared/NOTES.md): copying AV1 needs `opaque=True` on the template
stream; lerobot's H.264 has B-frames (negative first dts, pts from 0).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from fractions import Fraction
from typing import BinaryIO

import av
import numpy as np
from av.video.reformatter import ColorRange, Colorspace

from formats import mp4
from formats.errors import ConversionError, VideoError
from formats.sequence import FROM_IMAGES

# SVT-AV1 prints its whole configuration on every encode unless told errors only.
os.environ.setdefault("SVT_LOG", "1")

__all__ = [
    "VideoInfo",
    "CopyResult",
    "EncodeOptions",
    "EncodeResult",
    "ImageDecoder",
    "probe",
    "stream_info",
    "copy_segment",
    "verify_decodes",
    "first_time",
    "reencode_segment",
    "retime",
    "near_lossless_options",
    "lossless_options",
    "LOSSLESS",
    "encode_frames",
    "decode_frames",
    "iter_frames",
    "options_for",
    "is_high_bit_depth",
    "padded_size",
    "to_video_range",
    "plan_column",
    "declared_size",
    "lossless_pix_fmt",
    "image_array",
    "array_format_of",
    "COPY",
    "REENCODE",
    "ENCODERS",
]

# Codec name as containers report it -> the encoder PyAV's wheels ship for it.
ENCODERS = {"h264": "libx264", "hevc": "libx265", "av1": "libsvtav1", "ffv1": "ffv1"}
# Decoder names PyAV reports for a stream -> the codec's canonical name.
_CODEC_NAMES = {"libdav1d": "av1", "libaom-av1": "av1", "h264": "h264", "hevc": "hevc", "ffv1": "ffv1"}

# Defaults chosen on measurements (README "Video"): luma PSNR >= 35 dB on real camera data at
# yuv420p, a keyframe every 10 frames (random access decodes at most 9 extra frames, files
# about half the size of lerobot's keyframe-every-2), the encoders' balanced presets.
DEFAULT_CRF = {"h264": 16, "hevc": 16, "av1": 20}
# libx265 (PyAV 18.1's wheel) wrote out of bounds under valgrind on widths 16-48 px and not from 50
# px up; the process then aborted ("free(): invalid next size") after an unrelated allocation.
# 64 is its largest coding-tree size: narrower frames are refused for hevc.
MIN_HEVC_WIDTH = 64
DEFAULT_GOP = 10
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
    """How to encode: codec, quality (crf), keyframe interval (gop), preset, pixel format.

    None means the codec's documented default (`resolved()` fills them in); `ffv1` is lossless
    and ignores crf and preset.
    """

    codec: str = "h264"
    crf: int | None = None
    gop: int | None = None
    preset: str | None = None
    pix_fmt: str = "yuv420p"

    def resolved(self) -> EncodeOptions:
        """These options with every default filled in and checked; raises ConversionError."""
        codec = self.codec.lower()
        if codec not in ENCODERS:
            raise ConversionError(f"video codec {self.codec!r} is not supported (choose from {', '.join(sorted(ENCODERS))})")
        if codec == "ffv1":
            return EncodeOptions(codec, None, 1 if self.gop is None else self.gop, None, self.pix_fmt)
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
        return EncodeOptions(codec, crf, gop, self.preset or DEFAULT_PRESET[codec], self.pix_fmt)

    def column_meta(self) -> dict:
        """What mixtrain.json records of an encode (crf/preset only where they mean something)."""
        meta = {"codec": self.codec, "pix_fmt": self.pix_fmt, "gop": self.gop}
        if self.codec == "ffv1":
            meta["lossless"] = True
        else:
            meta.update(crf=self.crf, preset=self.preset)
        return meta


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
    pixel format) whatever was requested, because a lossy 8-bit codec would destroy their values."""
    if is_depth or is_high_bit_depth(source_pix_fmt):
        return EncodeOptions("ffv1", None, None, None, lossless_pix_fmt(source_pix_fmt)).resolved()
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
    return "yuv444p16le" if deep else "yuv444p"


def padded_size(width: int, height: int, pix_fmt: str) -> tuple[int, int]:
    """The encoded size: chroma-subsampled formats need even widths (4:2:x) and heights (4:2:0)."""
    even_width = "420" in pix_fmt or "422" in pix_fmt or pix_fmt in ("nv12", "nv21", "nv16")
    even_height = "420" in pix_fmt or pix_fmt in ("nv12", "nv21")
    return width + (width % 2 if even_width else 0), height + (height % 2 if even_height else 0)


@dataclasses.dataclass(frozen=True)
class VideoInfo:
    codec: str
    width: int
    height: int
    pix_fmt: str | None
    fps: float | None
    frames: int


@dataclasses.dataclass(frozen=True)
class CopyResult:
    """What `copy_segment` wrote: the frames the written file decodes to, and whether its packets
    are the source's (`written_as` "copy") or a lossless encode of them ("lossless": `codec`,
    `pix_fmt` and `reason` say which and why)."""

    frames: int
    reencoded: bool
    info: VideoInfo
    written_as: str = "copy"
    codec: str | None = None
    pix_fmt: str | None = None
    reason: str | None = None

    def note(self) -> dict | None:
        """What mixtrain.json records for a sequence whose file is not a packet copy (None: it is)."""
        if not self.reencoded:
            return None
        return {"written_as": self.written_as, "codec": self.codec, "pix_fmt": self.pix_fmt, "reason": self.reason}


@dataclasses.dataclass(frozen=True)
class EncodeResult:
    """What an encode wrote. `padded_from` is the source (width, height) when it was padded to even."""

    frames: int
    width: int
    height: int
    padded_from: tuple[int, int] | None
    options: EncodeOptions


FrameCallback = Callable[[int, av.VideoFrame], None]


def _open_input(source: BinaryIO | str) -> av.container.InputContainer:
    try:
        return av.open(source, mode="r")
    except (av.error.FFmpegError, OSError, ValueError) as error:
        raise VideoError(f"cannot open video: {error}") from error


def _video_stream(container: av.container.InputContainer) -> av.video.stream.VideoStream:
    if not container.streams.video:
        raise VideoError("file has no video stream")
    return container.streams.video[0]


def _codec_name(stream: av.video.stream.VideoStream) -> str:
    name = stream.codec_context.name
    return _CODEC_NAMES.get(name, name)


def probe(source: BinaryIO | str) -> VideoInfo:
    """Codec, size, pixel format, fps and packet count of the first video stream."""
    container = _open_input(source)
    try:
        stream = _video_stream(container)
        frames = sum(1 for packet in container.demux(stream) if packet.size > 0)
        return _info_of(stream, frames)
    except av.error.FFmpegError as error:
        raise VideoError(f"cannot read video: {error}") from error
    finally:
        container.close()


def first_time(source: BinaryIO | str) -> float:
    """When the first video stream's first frame is presented, in seconds (edit lists included):
    a file copied byte for byte must start at 0 to keep "frame i at i / fps"."""
    container = _open_input(source)
    try:
        stream = _video_stream(container)
        return float(stream.start_time * stream.time_base) if stream.start_time else 0.0
    except av.error.FFmpegError as error:
        raise VideoError(f"cannot read video: {error}") from error
    finally:
        container.close()
        _rewind(source)


def stream_info(source: BinaryIO | str) -> VideoInfo:
    """Codec, size, pixel format and fps from the stream header alone (frames: -1, not counted)."""
    container = _open_input(source)
    try:
        return _info_of(_video_stream(container), -1)
    finally:
        container.close()


def _bounds(time_base: Fraction, start: float | None, end: float | None, fps: float) -> tuple[int | None, int | None]:
    """[start, end) seconds -> pts bounds shifted by half a frame, so float rounding of the
    source's timestamps (float32 in lerobot) never moves a frame across a boundary."""
    half = 0.5 / fps
    low = None if start is None else int(round((start - half) / time_base))
    high = None if end is None else int(round((end - half) / time_base))
    return low, high


def _seek(container, stream, low: int | None) -> None:
    if low is not None and low > 0:
        # Lands on the keyframe at or before `low`: only that GOP is read, not the file's head.
        container.seek(low, stream=stream, backward=True, any_frame=False)


def _segment_frames(container, stream, low: int | None, high: int | None, *, skip_before: int | None = None) -> Iterator[av.VideoFrame]:
    """Decoded frames presented in [low, high) pts, in presentation order (decoding from the
    keyframe before `low`; `skip_before` drops earlier frames when decoding starts elsewhere)."""
    _seek(container, stream, low)
    floor = low if skip_before is None else skip_before
    for frame in container.decode(stream):
        if frame.pts is None:
            continue
        if high is not None and frame.pts >= high:
            break
        if floor is None or frame.pts >= floor:
            yield frame


def copy_segment(
    source: BinaryIO | str,
    destination: BinaryIO,
    *,
    start: float | None,
    end: float | None,
    frames: int,
    fps: float,
    verify: bool = True,
) -> CopyResult:
    """Remux the packets presented in [start, end) seconds into a new MP4 starting at t=0.

    Args:
      source: readable, seekable file object (or path) of the source MP4.
      destination: writable, seekable file object; receives a complete MP4.
      start, end: segment bounds in seconds of the source's presentation time; None = open end.
      frames: the number of frames the segment must hold (the sequence length).
      fps: frame rate used to place the half-frame tolerance around the bounds.
      verify: decode the written file once (`verify_decodes`); the sample-table path otherwise
        copies bytes it never looked at.

    Raises:
      VideoError: unreadable input, or a segment whose frame count is not `frames`.
    """
    copied = _copy_by_sample_table(source, destination, start=start, end=end, frames=frames, fps=fps)
    if copied is not None:
        if verify:
            verify_decodes(destination, frames)
        return copied
    return _copy_by_remux(source, destination, start=start, end=end, frames=frames, fps=fps)


def _copy_by_remux(source: BinaryIO | str, destination: BinaryIO | str, *, start: float | None, end: float | None,
                   frames: int, fps: float) -> CopyResult:
    """`copy_segment` through PyAV's demuxer and muxer: any container FFmpeg reads, and the cuts
    whose packets cannot be copied as they are (those are encoded losslessly, see `_lossless_segment`)."""
    container = _open_input(source)
    try:
        stream = _video_stream(container)
        low, high = _bounds(stream.time_base, start, end, fps)
        _seek(container, stream, low)
        run = []  # decode order from the seek point; stops once decode time passed the segment
        for packet in container.demux(stream):
            if packet.size == 0 or packet.pts is None:
                continue
            if high is not None and packet.dts is not None and packet.dts >= high:
                break  # decode order passed the segment: every later pts is later still
            run.append(packet)
        inside = [i for i, packet in enumerate(run) if (low is None or packet.pts >= low) and (high is None or packet.pts < high)]
        if len(inside) != frames:
            raise VideoError(f"segment [{_fmt(start)}, {_fmt(end)}) s holds {len(inside)} frames, expected {frames}")
        reason = _not_copyable(run, inside)
        if reason is not None:
            return _lossless_segment(source, container, stream, destination, low, high, frames, fps, reason)
        packets = [run[i] for i in inside]
        origin = min(packet.pts for packet in packets)
        output = av.open(destination, mode="w", format="mp4")
        try:
            out_stream = output.add_stream_from_template(stream, opaque=True)
            out_stream.time_base = stream.time_base
            for packet in packets:
                packet.pts -= origin
                if packet.dts is not None:
                    packet.dts -= origin
                packet.stream = out_stream
                output.mux(packet)
        finally:
            output.close()
        _rewind(destination)
        decoded = _count_decoded(destination)
        if decoded != frames:  # the structural checks missed a dependency: never publish a short file
            return _lossless_segment(source, container, stream, destination, low, high, frames, fps,
                                     f"the copied packets decode to {decoded} frames")
        return CopyResult(frames=decoded, reencoded=False, info=_info_of(stream, frames))
    except av.error.FFmpegError as error:
        raise VideoError(f"cannot read video: {error}") from error
    finally:
        container.close()


def _not_copyable(run: list, inside: list[int]) -> str | None:
    """Why the packets at positions `inside` of a decode-order `run` cannot be copied alone, or None.

    They can when they are one unbroken decode-order run (a frame of a neighbour between them means
    a reference outside the segment: HEVC B-frames at the end that reference a later frame), that
    starts on a keyframe shown first (not inside a GOP, not an open GOP's leading pictures)."""
    first = run[inside[0]]
    if inside[-1] - inside[0] + 1 != len(inside):
        return "the segment's packets interleave with a neighbour's in decode order (references outside the segment)"
    if not first.is_keyframe:
        return "the segment starts inside a GOP"
    if first.pts != min(run[i].pts for i in inside):
        return "the segment starts on an open GOP (frames shown before its keyframe)"
    return None


def _rewind(destination: BinaryIO | str) -> None:
    if not isinstance(destination, str):
        destination.seek(0)


def _count_decoded(destination: BinaryIO | str, on_frame: FrameCallback | None = None) -> int:
    """How many frames a written file decodes to (what a reader gets, not what was muxed);
    `on_frame` sees each of them (image statistics ride on this one decode)."""
    container = _open_input(destination)
    try:
        stream = _video_stream(container)
        stream.thread_type = "AUTO"
        count = 0
        for frame in container.decode(stream):
            if on_frame is not None:
                on_frame(count, frame)
            count += 1
        return count
    finally:
        container.close()
        _rewind(destination)


def verify_decodes(written: BinaryIO | str, frames: int, on_frame: FrameCallback | None = None) -> None:
    """Decode a file of copied samples once: samples the decoder rejects (a damaged source), or a
    frame count other than `frames`, are a VideoError instead of a published file no one can play.
    `on_frame` sees every decoded frame."""
    _rewind(written)
    try:
        decoded = _count_decoded(written, on_frame)
    except av.error.FFmpegError as error:
        raise VideoError(f"the copied samples do not decode ({error}); the source video is damaged") from error
    if decoded != frames:
        raise VideoError(f"the copied samples decode to {decoded} frames, expected {frames}")


def _source_key(source: BinaryIO | str) -> tuple | None:
    """What identifies a source file's content for this process's caches (None: not cacheable)."""
    if isinstance(source, str):
        stat = os.stat(source)
        return source, stat.st_size, stat.st_mtime_ns
    path, size = getattr(source, "path", None), getattr(source, "size", None)
    return (path, size) if path and size is not None else None


# Per worker: what a source file's moov says, and its stream header, kept while about 2M samples
# (~100 MB of tables) fit: a source file holds many episodes, and is parsed once.
_SOURCES: OrderedDict = OrderedDict()
_SOURCES_LOCK = threading.Lock()
_CACHED_SAMPLES = 2_000_000


def _plain_source(source: BinaryIO | str, handle: BinaryIO) -> tuple[mp4.SampleTable, VideoInfo] | None:
    """The source's sample table and stream header, or None when it is not a plain MP4."""
    key = _source_key(source)
    with _SOURCES_LOCK:
        if key is not None and key in _SOURCES:
            _SOURCES.move_to_end(key)
            return _SOURCES[key]
    table = mp4.read_sample_table(handle)
    facts = None
    if table is not None:
        handle.seek(0)
        facts = table, stream_info(handle)
    if key is not None:
        with _SOURCES_LOCK:
            _SOURCES[key] = facts
            while len(_SOURCES) > 1 and sum(len(f[0].pts) for f in _SOURCES.values() if f) > _CACHED_SAMPLES:
                _SOURCES.popitem(last=False)
    return facts


def _copy_by_sample_table(source: BinaryIO | str, destination: BinaryIO | str, *, start: float | None, end: float | None,
                          frames: int, fps: float) -> CopyResult | None:
    """The fast path of `copy_segment` (see formats.mp4); None when the file or the cut is not the plain
    case: then every error is left to the PyAV path, which words it."""
    try:
        handle = open(source, "rb") if isinstance(source, str) else source
    except OSError:
        return None  # missing file, permissions
    try:
        try:
            facts = _plain_source(source, handle)
            cut = None
            if facts is not None:
                cut = mp4.plan_cut(facts[0], *_bounds(Fraction(1, facts[0].timescale), start, end, fps))
        except Exception:  # noqa: BLE001 - anything odd before writing: the PyAV path decides and words it
            return None
        if cut is None or cut.stop - cut.first != frames:
            return None
        try:
            with open(destination, "wb") if isinstance(destination, str) else contextlib.nullcontext(destination) as out:
                mp4.write_cut(cut, handle, out)
        except (ValueError, OSError) as error:
            raise VideoError(f"cannot copy video: {error}") from error
        return CopyResult(frames=frames, reencoded=False, info=dataclasses.replace(facts[1], frames=frames))
    finally:
        if handle is not source:
            handle.close()
        else:
            handle.seek(0)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


def _info_of(stream, frames: int) -> VideoInfo:
    rate = stream.average_rate
    return VideoInfo(
        codec=_codec_name(stream),
        width=stream.codec_context.width,
        height=stream.codec_context.height,
        pix_fmt=stream.codec_context.pix_fmt,
        fps=float(rate) if rate else None,
        frames=frames,
    )


LOSSLESS = "lossless"


def _lossless_segment(source, container, stream, destination, low, high, frames: int, fps: float, reason: str) -> CopyResult:
    """Copy mode's answer to a cut whose packets cannot be copied: the segment's decoded frames,
    encoded losslessly in their own pixel format (`lossless_options`), then decoded again and
    compared frame by frame (a digest of every plane) with what was encoded: a file that would
    not give back the source's pixels is never written. Decoding starts at the keyframe before
    the segment; when that is not enough (an open GOP's leading pictures need the GOP before),
    from the file's start. The frame count is what the written file decodes to."""
    info = _info_of(stream, frames)
    candidates = lossless_options(stream.codec_context.pix_fmt)
    found = 0
    for options in candidates:
        for attempt in ("seek", "start"):
            if not isinstance(source, str):
                source.seek(0)
            wanted: list[bytes] = []
            with _open_input(source) as fresh:  # the caller's container has been demuxed past the segment
                decoder = _video_stream(fresh)
                decoder.thread_type = "AUTO"
                _truncate(destination)
                encode_frames(_segment_frames(fresh, decoder, low if attempt == "seek" else None, high, skip_before=low),
                              destination, fps=fps, options=options, lossless=True,
                              on_frame=lambda _, frame, wanted=wanted: wanted.append(_digest(frame)))
            _rewind(destination)
            found = len(wanted)
            if found != frames:
                continue  # decoding from the keyframe before lost leading pictures: from the start
            if _decoded_digests(destination) == wanted:
                return CopyResult(frames=found, reencoded=True, info=info, written_as=LOSSLESS,
                                  codec=options.codec, pix_fmt=options.pix_fmt, reason=reason)
            break  # this encoder did not give the pixels back: the next one
    raise VideoError(f"segment [{_fmt(None if low is None else float(low * stream.time_base))}, "
                     f"{_fmt(None if high is None else float(high * stream.time_base))}) s decodes to {found} frames, "
                     f"expected {frames}, or could not be written losslessly; cannot copy it")


def _digest(frame: av.VideoFrame) -> bytes:
    """Every sample of a frame at its bit depth (planes packed, no line padding)."""
    return hashlib.blake2b(frame.to_ndarray().tobytes(), digest_size=16).digest()


def _decoded_digests(destination: BinaryIO | str) -> list[bytes]:
    container = _open_input(destination)
    try:
        stream = _video_stream(container)
        stream.thread_type = "AUTO"
        return [_digest(frame) for frame in container.decode(stream)]
    finally:
        container.close()
        _rewind(destination)


def _truncate(destination: BinaryIO | str) -> None:
    if isinstance(destination, str):
        open(destination, "wb").close()
    else:
        destination.seek(0)
        destination.truncate()


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
        return EncodeOptions(codec, _NEAR_LOSSLESS_CRF[codec], None, "12" if codec == "av1" else None, pix_fmt)
    return EncodeOptions("ffv1", pix_fmt=lossless_pix_fmt(pix_fmt))


def retime(
    source: BinaryIO | str,
    destination: BinaryIO | str,
    *,
    indices: tuple[int, ...],
    fps: float,
    options: EncodeOptions | None,
    on_frame: FrameCallback | None = None,
) -> EncodeResult:
    """Write a video whose frame i is frame `indices[i]` of `source` (a camera slower or offset
    against the steps), at i/fps. `options` None: the source codec at near-lossless quality.
    `on_frame` sees each output frame as it is encoded (as in `reencode_segment`)."""
    if any(b < a for a, b in zip(indices, indices[1:])):
        raise VideoError("frame_index goes backwards within the episode; cannot re-time")
    container = _open_input(source)
    try:
        stream = _video_stream(container)
        stream.thread_type = "AUTO"
        options = options or near_lossless_options(_codec_name(stream), stream.codec_context.pix_fmt)

        def picked() -> Iterator[av.VideoFrame]:
            wanted = iter(indices)
            target = next(wanted, None)
            for position, frame in enumerate(container.decode(stream)):
                while target is not None and target == position:
                    yield frame
                    target = next(wanted, None)
                if target is None:
                    return
            if target is not None:
                raise VideoError(f"frame_index {target} is beyond the video's {position + 1} frames")

        return encode_frames(picked(), destination, fps=fps, options=options, on_frame=on_frame)
    except av.error.FFmpegError as error:
        raise VideoError(f"cannot decode video: {error}") from error
    finally:
        container.close()


def reencode_segment(
    source: BinaryIO | str,
    destination: BinaryIO,
    *,
    start: float | None,
    end: float | None,
    frames: int,
    fps: float,
    options: EncodeOptions,
    on_frame: FrameCallback | None = None,
    expected_size: tuple[int, int] | None = None,
) -> EncodeResult:
    """Decode the frames presented in [start, end) seconds and encode them with `options`.

    Frames stream from decoder to encoder one at a time; `on_frame(i, frame)` sees each decoded
    frame first (image statistics ride on this decode pass). Raises VideoError on unreadable input
    or a segment whose frame count is not `frames`.
    """
    container = _open_input(source)
    try:
        stream = _video_stream(container)
        stream.thread_type = "AUTO"
        low, high = _bounds(stream.time_base, start, end, fps)
        result = encode_frames(_segment_frames(container, stream, low, high), destination,
                               fps=fps, options=options, on_frame=on_frame, expected_size=expected_size)
    except av.error.FFmpegError as error:
        raise VideoError(f"cannot decode video: {error}") from error
    finally:
        container.close()
    if result.frames != frames:
        raise VideoError(f"segment [{_fmt(start)}, {_fmt(end)}) s holds {result.frames} frames, expected {frames}")
    return result


class ImageDecoder:
    """Images (JPEG/PNG/TIFF bytes, arrays) -> VideoFrame, with FFmpeg's own decoders and no temporary
    files (lerobot 0.6 stores depth images as 16-bit TIFF). Each image gets a fresh decoder context (about 40 us): FFmpeg's PNG decoder carries
    state from one packet to the next (APNG), so a reused context returns blends of earlier images."""

    _MAGIC = ((b"\xff\xd8", "mjpeg"), (b"\x89PNG", "png"), (b"II*\x00", "tiff"), (b"MM\x00*", "tiff"))

    def decode(self, data: bytes, index: int) -> av.VideoFrame:
        name = next((codec for magic, codec in self._MAGIC if data[: len(magic)] == magic), None)
        if name is None:
            raise VideoError(f"image {index} is neither JPEG, PNG nor TIFF (starts with {bytes(data[:4])!r})")
        try:
            decoded = av.CodecContext.create(name, "r").decode(av.Packet(data))
        except av.error.FFmpegError as error:
            raise VideoError(f"image {index}: cannot decode {name}: {error}") from error
        if len(decoded) != 1:
            raise VideoError(f"image {index}: {name} data decoded to {len(decoded)} frames")
        return decoded[0]

    def to_frame(self, item: np.ndarray | bytes | av.VideoFrame, index: int) -> av.VideoFrame:
        if isinstance(item, av.VideoFrame):
            return item
        if isinstance(item, np.ndarray):
            array, pixel_format = _array_format(item, index)
            return av.VideoFrame.from_ndarray(np.ascontiguousarray(array), format=pixel_format)
        if isinstance(item, (bytes, bytearray, memoryview)):
            return self.decode(bytes(item), index)
        raise VideoError(f"image {index}: cannot encode a {type(item).__name__}")


def _array_format(array: np.ndarray, index: int) -> tuple[np.ndarray, str]:
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    if array.dtype == np.uint8 and array.ndim == 3 and array.shape[2] in (3, 4):
        return array, "rgb24" if array.shape[2] == 3 else "rgba"
    if array.dtype == np.uint8 and array.ndim == 2:
        return array, "gray"
    if array.dtype == np.uint16 and array.ndim == 2:
        return array, "gray16le"
    raise VideoError(f"image {index}: array of shape {list(array.shape)} and dtype {array.dtype} is not an image "
                     "(expected uint8 [H, W, 3|4], uint8 [H, W] or uint16 [H, W])")


def _pad(array: np.ndarray, width: int, height: int) -> np.ndarray:
    extra = [(0, height - array.shape[0]), (0, width - array.shape[1])] + [(0, 0)] * (array.ndim - 2)
    return np.pad(array, extra, mode="edge")


def to_video_range(frame: av.VideoFrame, pix_fmt: str) -> av.VideoFrame:
    """Convert to `pix_fmt`; into limited ("MPEG") range for YUV, which is what decoders assume
    of yuv420p. Left to itself swscale carries full range through (PNG/JPEG decodes, full-range
    AV1 reported as plain yuv420p), which players then show with crushed or washed-out levels.
    RGB and gray sources get the BT.601 matrix, which the encoded stream is tagged with."""
    limited = pix_fmt.startswith("yuv") and not pix_fmt.startswith("yuvj")
    if not limited:
        return frame.reformat(format=pix_fmt)
    if _is_yuv(frame.format.name):
        return frame.reformat(format=pix_fmt, dst_color_range=ColorRange.MPEG)
    return frame.reformat(format=pix_fmt, dst_colorspace=Colorspace.ITU601, dst_color_range=ColorRange.MPEG)


def _is_yuv(pix_fmt: str) -> bool:
    return pix_fmt.startswith(("yuv", "nv"))


_FULL_RANGE = 2  # AVCOL_RANGE_JPEG
_MPEG_RANGE = 1
_BT601 = 6  # AVCOL_SPC_SMPTE170M / AVCOL_PRI_SMPTE170M / AVCOL_TRC_SMPTE170M


def _needs_conversion(frame: av.VideoFrame, pix_fmt: str) -> bool:
    if frame.format.name != pix_fmt:
        return True
    return pix_fmt.startswith("yuv") and frame.color_range == _FULL_RANGE


def _has_alpha(pix_fmt: str) -> bool:
    return any(component.is_alpha for component in av.VideoFormat(pix_fmt).components)


def _check_opaque(frame: av.VideoFrame, index: int) -> None:
    """Video has no alpha: dropping a constant opaque one loses nothing, any other would be lost."""
    deep = is_high_bit_depth(frame.format.name)
    rgba = frame.to_ndarray(format="rgba64le" if deep else "rgba")
    if not (rgba[..., 3] == (65535 if deep else 255)).all():
        raise VideoError(f"image {index} has transparency ({frame.format.name}); video cannot keep an alpha channel")


def _tag_colours(context, first: av.VideoFrame, pix_fmt: str) -> None:
    """Say in the stream what the pixels are: limited range, and the matrix they were made with
    (ours, BT.601, for RGB/gray input; the source's own for YUV passed through)."""
    if not pix_fmt.startswith("yuv"):
        return
    context.color_range = _MPEG_RANGE
    if _is_yuv(first.format.name):
        for name in ("colorspace", "color_primaries", "color_trc"):
            if getattr(first, name) not in (2, None):  # 2: unspecified
                setattr(context, name, getattr(first, name))
    else:
        context.colorspace = context.color_primaries = context.color_trc = _BT601


def _copy_colours(context, first: av.VideoFrame) -> None:
    """A lossless copy of decoded samples says what the source said of them (range, matrix)."""
    for name in ("color_range", "colorspace", "color_primaries", "color_trc"):
        if getattr(first, name, None):
            setattr(context, name, getattr(first, name))


def _padded_frame(frame: av.VideoFrame, width: int, height: int) -> av.VideoFrame:
    target = array_format_of(frame.format.name)
    return av.VideoFrame.from_ndarray(_pad(frame.to_ndarray(format=target), width, height), format=target)


def array_format_of(pix_fmt: str) -> str:
    """A numpy-exportable format holding `pix_fmt`'s samples at their bit depth."""
    deep = is_high_bit_depth(pix_fmt)
    if pix_fmt.startswith("gray"):
        return "gray16le" if deep else "gray"
    return "rgb48le" if deep else "rgb24"


def encode_frames(
    frames: Iterable[np.ndarray | bytes | av.VideoFrame],
    destination: BinaryIO,
    *,
    fps: float | Fraction,
    options: EncodeOptions = EncodeOptions(),
    on_frame: FrameCallback | None = None,
    expected_size: tuple[int, int] | None = None,
    lossless: bool = False,
) -> EncodeResult:
    """Encode a frame sequence into an MP4, frame i at pts i in a 1/fps time base.

    Items may be decoded VideoFrames, encoded JPEG/PNG bytes, or arrays (uint8 [H, W, 3] RGB,
    [H, W, 4] RGBA, [H, W] gray; uint16 [H, W] depth). Every frame must have the first one's size,
    and `expected_size` (width, height) when given: what the metadata declared. A frame deeper
    than 8 bits is refused by a lossy codec (`options_for` routes such columns to FFV1). x264
    runs with `mbtree=0`, which makes repeated encodes of the same frames byte-identical (NOTES.md).
    `lossless` (FFV1 in the frames' own format): samples pass untouched, colour tags copied.
    """
    options = options.resolved()
    encoder = ENCODERS[options.codec]
    rate = fps if isinstance(fps, Fraction) else Fraction(fps).limit_denominator(1001000)
    images = ImageDecoder()
    output = av.open(destination, mode="w", format="mp4")
    stream = None
    size = padded = None
    count = 0
    try:
        for item in frames:
            frame = images.to_frame(item, count)
            if stream is None:
                size = (frame.width, frame.height)
                if expected_size is not None and tuple(expected_size) != size:
                    raise VideoError(f"frames are {size[0]}x{size[1]}, the metadata declares {expected_size[0]}x{expected_size[1]}")
                if options.pix_fmt is None:  # lossless, format of the source
                    options = dataclasses.replace(options, pix_fmt=lossless_pix_fmt(frame.format.name))
                padded = padded_size(frame.width, frame.height, options.pix_fmt)
                if options.codec == "hevc" and padded[0] < MIN_HEVC_WIDTH:
                    raise VideoError(f"frames are {size[0]}x{size[1]}: libx265 writes outside its buffers on frames narrower than "
                                     f"{MIN_HEVC_WIDTH} px (seen under valgrind; it can abort the process); encode this camera "
                                     "with --video_codec=h264 or av1")
                stream = output.add_stream(encoder, rate=rate)
                stream.width, stream.height = padded
                stream.pix_fmt = options.pix_fmt
                stream.codec_context.time_base = 1 / rate
                if lossless:
                    _copy_colours(stream.codec_context, frame)
                else:
                    _tag_colours(stream.codec_context, frame, options.pix_fmt)
                stream.options = _encoder_options(options)
            elif (frame.width, frame.height) != size:
                raise VideoError(f"image {count} is {frame.width}x{frame.height}, the first is {size[0]}x{size[1]}")
            if _has_alpha(frame.format.name):
                _check_opaque(frame, count)
            if options.codec != "ffv1" and is_high_bit_depth(frame.format.name):
                raise VideoError(f"image {count} has more than 8 bits per sample ({frame.format.name}); "
                                 f"{options.codec} would keep 8: refusing to lose depth precision")
            if on_frame is not None:
                on_frame(count, frame)
            if padded != size:
                frame = _padded_frame(frame, *padded)
            if lossless and frame.format.name != options.pix_fmt:
                raise VideoError(f"image {count} is {frame.format.name}, the lossless stream {options.pix_fmt}")
            if not lossless and _needs_conversion(frame, options.pix_fmt):
                frame = to_video_range(frame, options.pix_fmt)
            frame.pts = count
            frame.time_base = 1 / rate
            frame.pict_type = av.video.frame.PictureType.NONE
            for packet in stream.encode(frame):
                output.mux(packet)
            count += 1
        if stream is None:
            raise VideoError("no frames to encode")
        for packet in stream.encode(None):
            output.mux(packet)
    except av.error.FFmpegError as error:
        raise VideoError(f"cannot encode {options.codec}: {error}") from error
    finally:
        output.close()
    width, height = padded or (0, 0)
    return EncodeResult(count, width, height, size if padded != size else None, options)


def _encoder_options(options: EncodeOptions) -> dict[str, str]:
    encoder = ENCODERS[options.codec]
    if encoder == "ffv1":
        return {"level": "3", "slicecrc": "1", "g": str(options.gop)}
    result = {"crf": str(options.crf), "g": str(options.gop), "preset": str(options.preset)}
    if encoder == "libx264":
        result["x264-params"] = "mbtree=0"
    elif encoder == "libx265":
        result["x265-params"] = "log-level=error"
    elif encoder == "libsvtav1":
        result["svtav1-params"] = "verbosity=0"
    return result


def iter_frames(source: BinaryIO | str | bytes, *, start: float | None = None, end: float | None = None,
                fps: float = 30) -> Iterator[av.VideoFrame]:
    """Decoded frames presented in [start, end) seconds, one at a time."""
    if isinstance(source, bytes):
        source = io.BytesIO(source)
    container = _open_input(source)
    try:
        stream = _video_stream(container)
        stream.thread_type = "AUTO"
        low, high = _bounds(stream.time_base, start, end, fps)
        yield from _segment_frames(container, stream, low, high)
    except av.error.FFmpegError as error:
        raise VideoError(f"cannot decode video: {error}") from error
    finally:
        container.close()


def decode_frames(source: BinaryIO | str | bytes, *, start: float | None = None, end: float | None = None,
                  fps: float = 30, planar: bool = True) -> np.ndarray:
    """Decode the frames presented in [start, end) seconds.

    Returns [N, H*3/2, W] uint8 raw yuv420p planes when `planar` (bit-exact comparisons, no
    colour conversion), else [N, H, W, 3] RGB.
    """
    out = [frame.to_ndarray() if planar else frame.to_ndarray(format="rgb24")
           for frame in iter_frames(source, start=start, end=end, fps=fps)]
    return np.stack(out) if out else np.zeros((0,), np.uint8)


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


def image_array(frame: av.VideoFrame) -> np.ndarray:
    """A decoded frame's values: RGB uint8 [H, W, 3] (uint16 for deep colour), or gray [H, W] in its
    own samples: a 12-bit depth code stays 0..4095 (converting to gray16le would scale it by 16)."""
    if frame.format.name in ("gray", "gray10le", "gray12le", "gray14le", "gray16le"):
        return frame.to_ndarray()
    return frame.to_ndarray(format=array_format_of(frame.format.name))
