"""Video through PyAV: probe, decode, re-encode, encode image sequences.

Encoding (re-encode mode, image sequences) takes decoded frames, encoded JPEG/PNG bytes or raw
uint8/uint16 arrays and writes frame i at pts i in a 1/fps time base. 4:2:0 and 4:2:2 need even
sizes: an odd frame is padded on the right/bottom by repeating its last column/row (nothing is
cropped away; `EncodeResult.padded_from` says so). Which options a column is encoded with is
decided in formats/video/policy.py; copy mode's packet cuts are formats/video/stream_copy.py.

Why ~600 lines: the encode loop, its colour-range handling and ImageDecoder share one frame path;
split further, each half would need the other's internals.

The package: this module (probe, decode, encode), `policy` (which codec and options a column gets),
`stream_copy` (copy mode: packet cuts, through `mp4` for the sample tables), `verify` (PSNR checks),
`declared` (the picture size headers declare, checked before decoding).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import io
import math
import os
from collections.abc import Callable, Iterable, Iterator
from fractions import Fraction
from typing import BinaryIO

import av
import numpy as np
from av.video.reformatter import ColorRange, Colorspace

from formats.errors import VideoError
from formats.video import declared
from formats.video.policy import (
    ENCODERS,
    MIN_HEVC_WIDTH,
    EncodeOptions,
    is_high_bit_depth,
    lossless_pix_fmt,
    near_lossless_options,
    padded_size,
    quality_ladder,
)

# SVT-AV1 prints its whole configuration on every encode unless told errors only.
os.environ.setdefault("SVT_LOG", "1")

__all__ = [
    "VideoInfo",
    "EncodeResult",
    "ImageDecoder",
    "probe",
    "stream_info",
    "first_time",
    "reencode_segment",
    "retime",
    "encode_frames",
    "encode_to_floor",
    "luma_plane",
    "psnr",
    "decode_frames",
    "iter_frames",
    "to_video_range",
    "image_array",
    "array_format_of",
]

# Decoder names PyAV reports for a stream -> the codec's canonical name.
_CODEC_NAMES = {"libdav1d": "av1", "libaom-av1": "av1", "h264": "h264", "hevc": "hevc", "ffv1": "ffv1"}


@dataclasses.dataclass(frozen=True)
class VideoInfo:
    codec: str
    width: int
    height: int
    pix_fmt: str | None
    fps: float | None
    frames: int


@dataclasses.dataclass(frozen=True)
class EncodeResult:
    """What an encode wrote. `padded_from` is the source (width, height) when it was padded to even."""

    frames: int
    width: int
    height: int
    padded_from: tuple[int, int] | None
    options: EncodeOptions
    psnr_min: float | None = None  # the lowest luma PSNR of a frame, where the floor was checked
    below_floor: tuple[int, float] | None = None  # (crf, its PSNR) of the first try, when the crf had to be lowered


FrameCallback = Callable[[int, av.VideoFrame], None]


def _open_input(source: BinaryIO | str) -> av.container.InputContainer:
    try:
        declared.check_declared(source)
        return av.open(source, mode="r")
    except (av.error.FFmpegError, OSError, ValueError) as error:
        if isinstance(error, VideoError):
            raise
        raise VideoError(f"cannot open video: {error}") from error


def _video_stream(container: av.container.InputContainer) -> av.video.stream.VideoStream:
    if not container.streams.video:
        raise VideoError("file has no video stream")
    stream = container.streams.video[0]
    declared.check_size(stream.codec_context.width, stream.codec_context.height, "its video stream")
    return stream


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
    declared = (stream.codec_context.width, stream.codec_context.height)
    for frame in container.decode(stream):
        if (frame.width, frame.height) != declared and declared != (0, 0):  # what the headers said is what gets published
            raise VideoError(f"a frame decodes to {frame.width}x{frame.height} pixels, the stream declares {declared[0]}x{declared[1]}")
        if frame.pts is None:
            continue
        if high is not None and frame.pts >= high:
            break
        if floor is None or frame.pts >= floor:
            yield frame


def _rewind(destination: BinaryIO | str) -> None:
    if not isinstance(destination, str):
        destination.seek(0)


def _truncate(destination: BinaryIO | str) -> None:
    if isinstance(destination, str):
        open(destination, "wb").close()
    else:
        destination.seek(0)
        destination.truncate()


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


def retime(
    source: BinaryIO | str,
    destination: BinaryIO | str,
    *,
    indices: tuple[int, ...],
    fps: float,
    options: EncodeOptions | None,
    on_frame: FrameCallback | None = None,
    threads: int | None = None,
    expected_size: tuple[int, int] | None = None,
) -> EncodeResult:
    """Write a video whose frame i is frame `indices[i]` of `source` (a camera slower or offset
    against the steps), at i/fps. `options` None: the source codec at near-lossless quality.
    `on_frame` sees each output frame as it is encoded (as in `reencode_segment`); `threads` and
    `expected_size` (the declared (width, height)) as in `encode_frames`, threads for the decoder too.
    Held to the options' luma PSNR floor (`encode_to_floor`)."""
    if any(b < a for a, b in zip(indices, indices[1:])):
        raise VideoError("frame_index goes backwards within the episode; cannot re-time")
    with _decoding(source, threads) as (container, stream):
        options = options or near_lossless_options(_codec_name(stream), stream.codec_context.pix_fmt)

    def picked() -> Iterator[av.VideoFrame]:
        with _decoding(source, threads) as (container, stream):
            wanted = iter(indices)
            target = next(wanted, None)
            position = -1
            for position, frame in enumerate(container.decode(stream)):
                while target is not None and target == position:
                    yield frame
                    target = next(wanted, None)
                if target is None:
                    return
            if target is not None:
                raise VideoError(f"frame_index {target} is beyond the video's {position + 1} frames")

    return encode_to_floor(picked, destination, fps=fps, options=options, on_frame=on_frame, threads=threads,
                           expected_size=expected_size)


@contextlib.contextmanager
def _decoding(source: BinaryIO | str, threads: int | None) -> Iterator[tuple]:
    """(container, video stream) of `source` from its start, decoder errors as VideoError."""
    _rewind(source)
    container = _open_input(source)
    try:
        stream = _video_stream(container)
        _decode_threads(stream, threads)
        yield container, stream
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
    threads: int | None = None,
) -> EncodeResult:
    """Decode the frames presented in [start, end) seconds and encode them with `options`, held to
    their luma PSNR floor (`encode_to_floor`: a segment that misses it is decoded and encoded again).

    Frames stream from decoder to encoder one at a time; `on_frame(i, frame)` sees each decoded
    frame first (image statistics ride on this decode pass). `threads` as in `encode_frames`, for
    the decoder too. Raises VideoError on unreadable input or a segment whose frame count is not `frames`.
    """
    def segment() -> Iterator[av.VideoFrame]:
        with _decoding(source, threads) as (container, stream):
            low, high = _bounds(stream.time_base, start, end, fps)
            yield from _segment_frames(container, stream, low, high)

    result = encode_to_floor(segment, destination, fps=fps, options=options, on_frame=on_frame,
                             expected_size=expected_size, threads=threads)
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
    threads: int | None = None,
) -> EncodeResult:
    """Encode a frame sequence into an MP4, frame i at pts i in a 1/fps time base.

    Items may be decoded VideoFrames, encoded JPEG/PNG bytes, or arrays (uint8 [H, W, 3] RGB,
    [H, W, 4] RGBA, [H, W] gray; uint16 [H, W] depth). Every frame must have the first one's size,
    and `expected_size` (width, height) when given: what the metadata declared. A frame deeper
    than 8 bits is refused by a lossy codec (`options_for` routes such columns to FFV1). x264
    runs with `mbtree=0`, which makes repeated encodes of the same frames byte-identical (NOTES.md).
    `lossless` (FFV1 in the frames' own format): samples pass untouched, colour tags copied.
    A lossy encode whose options carry a floor (`min_psnr`) decodes its own packets as they are
    written and returns each frame's lowest luma PSNR against its input (`psnr_min`), measured as
    `validate --deep` measures it: the reference frames the encoder has not emitted yet wait in a
    queue (its lookahead, about 40 frames of luma for x264 medium).
    `threads` caps the encoder's threads (None: the encoder's own choice, all cores): processes
    encoding side by side each take their share instead of all fighting for every core. x264's and
    x265's bytes depend on their thread count (x264 writes it in the stream's SEI and its frame
    threads shape rate control; x265's frame threads restrict motion search): those two always run
    on FIXED_ENCODER_THREADS, whatever `threads` says; FFV1 and SVT-AV1 write the same bytes on any.
    """
    options = options.resolved()
    encoder = ENCODERS[options.codec]
    rate = fps if isinstance(fps, Fraction) else Fraction(fps).limit_denominator(1001000)
    images = ImageDecoder()
    output = av.open(destination, mode="w", format="mp4")
    stream = None
    size = padded = None
    count = 0
    checker = _FloorCheck() if options.min_psnr and options.codec != "ffv1" and not lossless else None
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
                own = FIXED_ENCODER_THREADS.get(options.codec, threads)
                if own is not None:
                    stream.codec_context.thread_count = own
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
            source = frame
            if padded != size:
                frame = _padded_frame(frame, *padded)
            if lossless and frame.format.name != options.pix_fmt:
                raise VideoError(f"image {count} is {frame.format.name}, the lossless stream {options.pix_fmt}")
            if not lossless and _needs_conversion(frame, options.pix_fmt):
                frame = to_video_range(frame, options.pix_fmt)
            if checker is not None:  # the reference luma: `luma_plane` of the source frame (its yuv420p twin is the frame just made)
                same = padded == size and options.pix_fmt == "yuv420p" and source.format.name != "yuv420p"
                checker.expect(frame if same else source)
            frame.pts = count
            frame.time_base = 1 / rate
            frame.pict_type = av.video.frame.PictureType.NONE
            if count == 0:  # the first call opens the encoder, which may fail half-way
                scheduling = _scheduling()
                try:
                    packets = stream.encode(frame)
                finally:
                    _undo_realtime_scheduling(scheduling)
            else:
                packets = stream.encode(frame)
            if checker is not None:
                checker.open(stream)
            for packet in packets:
                if checker is not None:
                    checker.decode(packet)
                output.mux(packet)
            count += 1
        if stream is None:
            raise VideoError("no frames to encode")
        for packet in stream.encode(None):
            if checker is not None:
                checker.decode(packet)
            output.mux(packet)
        if checker is not None:
            checker.decode(None)
    except av.error.FFmpegError as error:
        raise VideoError(f"cannot encode {options.codec}: {error}") from error
    finally:
        output.close()
    width, height = padded or (0, 0)
    return EncodeResult(count, width, height, size if padded != size else None, options,
                        checker.lowest(count) if checker is not None else None)


def luma_plane(frame: av.VideoFrame, width: int, height: int, gray: bool) -> tuple[np.ndarray, float]:
    """[H, W] luma (the Y plane an encoder codes, BT.601 limited range) cropped to width x
    height, and its peak value. When both sides are gray (`gray`), the gray values themselves."""
    name = frame.format.name
    if gray:
        deep = is_high_bit_depth(name)
        plane = frame.to_ndarray(format="gray16le" if deep else "gray")
        return plane[:height, :width], 65535.0 if deep else 255.0
    if name != "yuv420p":
        frame = to_video_range(frame, "yuv420p")
    plane = frame.planes[0]
    rows = np.frombuffer(plane, np.uint8).reshape(plane.height, plane.line_size)
    return rows[:height, :width], 255.0


def psnr(reference: np.ndarray, output: np.ndarray, peak: float) -> float:
    """Peak signal-to-noise ratio in dB (inf when identical). Integer samples are compared in
    int64, exactly, and nine times faster than through float64 (which gives the same mean)."""
    if reference.dtype.kind in "ui" and output.dtype.kind in "ui":
        diff = np.subtract(reference, output, dtype=np.int64).ravel()
        error = float(np.dot(diff, diff)) / max(diff.size, 1)
    else:
        error = float(np.mean((reference.astype(np.float64) - output.astype(np.float64)) ** 2))
    return math.inf if error == 0 else 10 * math.log10(peak**2 / error)


class _FloorCheck:
    """Decodes an encoder's packets as they are written and scores each decoded frame against the
    input frame it came from (frames leave the encoder in input order: their pts)."""

    def __init__(self) -> None:
        self._decoder = None
        self._waiting: collections.deque = collections.deque()
        self._lowest = math.inf
        self._scored = 0

    def expect(self, frame: av.VideoFrame) -> None:
        luma, _ = luma_plane(frame, frame.width, frame.height, False)
        self._waiting.append(np.array(luma))  # a copy: the frame's planes may be reused

    def open(self, stream) -> None:
        """After the encoder opened (its first frame): a decoder for its packets, with its headers."""
        if self._decoder is None:
            context = stream.codec_context
            self._decoder = av.CodecContext.create(_DECODERS.get(context.name, context.name), "r")
            self._decoder.extradata = context.extradata

    def decode(self, packet: av.Packet | None) -> None:
        for decoded in self._decoder.decode(packet):
            reference = self._waiting.popleft()
            luma, peak = luma_plane(decoded, reference.shape[1], reference.shape[0], False)
            self._lowest = min(self._lowest, psnr(reference, luma, peak))
            self._scored += 1

    def lowest(self, frames: int) -> float:
        if self._scored != frames:
            raise VideoError(f"the encoded stream decodes to {self._scored} frames, {frames} were encoded")
        return self._lowest


# The decoder PyAV's wheels have for what each encoder writes.
_DECODERS = {"libx264": "h264", "libx265": "hevc", "libsvtav1": "libdav1d"}


def encode_to_floor(frames: Callable[[], Iterable], destination: BinaryIO | str, *, fps: float | Fraction,
                    options: EncodeOptions, on_frame: FrameCallback | None = None,
                    expected_size: tuple[int, int] | None = None, threads: int | None = None) -> EncodeResult:
    """`encode_frames` until every frame keeps the options' luma PSNR floor: the crf is lowered
    along `policy.quality_ladder` and the frames encoded again (`frames()` gives them anew; `on_frame`
    sees them once). A segment that misses the floor even at the lowest crf is refused."""
    ladder = quality_ladder(options.resolved())
    first = None
    for attempt, tried in enumerate(ladder):
        if attempt:
            _truncate(destination)
        result = encode_frames(frames(), destination, fps=fps, options=tried, on_frame=None if attempt else on_frame,
                               expected_size=expected_size, threads=threads)
        if result.psnr_min is None or result.psnr_min >= tried.min_psnr:
            return dataclasses.replace(result, below_floor=first)
        first = first or (tried.crf, result.psnr_min)
    raise VideoError(f"luma PSNR {result.psnr_min:.2f} dB is below the {tried.min_psnr:g} dB floor even at {tried.codec} crf "
                     f"{tried.crf}: lower --video_min_psnr (0: no floor) or encode this camera with another --video_codec")


# Threads of the encoders whose bytes depend on their thread count: a constant, so that a dataset
# encodes to the same bytes on any machine, with any worker count, here or on Dataflow (issue 28).
# Two: what a one-worker run on a 2-core machine used before, so its files are unchanged; more
# cores are used by more workers, not by more threads per encode. bench/bench_reencode.py on 2 shared
# cores (6 x 150 frames x 2 cameras 320x240, best of 2): 1 worker 21.0 s wall either way (1 thread:
# 19.2 s); 2 workers 13.4 s (was 19.6 s with 1 thread each; 22.0 s with a constant 1), all within the
# +-30% this machine's neighbours add. x265's pool (all cores) does not change its pictures.
FIXED_ENCODER_THREADS = {"h264": 2, "hevc": 2}


def _scheduling() -> int | None:
    return os.sched_getscheduler(0) if hasattr(os, "sched_getscheduler") else None


def _undo_realtime_scheduling(before: int | None) -> None:
    """SVT-AV1, opened by root (containers, Dataflow workers), moves the calling thread and its own
    twenty threads to SCHED_FIFO priority 99, even when the open then fails: busy real-time threads
    starve every other thread and process on the machine, and children inherit the policy (seen: a
    26 s conversion took 90 s and interrupts went unanswered). Every real-time thread of this
    process goes back to the caller's policy (unless the caller itself ran real-time); the bytes
    are the same."""
    if before is None:
        return
    realtime = (os.SCHED_FIFO, os.SCHED_RR)
    if before in realtime:
        return
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:  # not Linux
        return
    for task in tasks:
        with contextlib.suppress(OSError):  # a thread that has ended meanwhile
            if os.sched_getscheduler(int(task)) in realtime:
                os.sched_setscheduler(int(task), before, os.sched_param(0))


def _decode_threads(stream, threads: int | None) -> None:
    """Frame- or slice-threaded decoding (decoders are exact: threads never change a pixel),
    on at most `threads` threads when given."""
    stream.thread_type = "AUTO"
    if threads is not None:
        stream.codec_context.thread_count = threads


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


def image_array(frame: av.VideoFrame) -> np.ndarray:
    """A decoded frame's values: RGB uint8 [H, W, 3] (uint16 for deep colour), or gray [H, W] in its
    own samples: a 12-bit depth code stays 0..4095 (converting to gray16le would scale it by 16)."""
    if frame.format.name in ("gray", "gray10le", "gray12le", "gray14le", "gray16le"):
        return frame.to_ndarray()
    return frame.to_ndarray(format=array_format_of(frame.format.name))


# image format -> (FFmpeg encoder, its pixel format, the pixel format of the [H, W(, C)] array given)
IMAGE_FORMATS = {"png": ("png", "rgb24", "rgb24"), "png_gray": ("png", "gray", "gray"), "png16": ("png", "gray16be", "gray16le"),
                 "jpeg": ("mjpeg", "yuvj420p", "rgb24"), "tiff16": ("tiff", "gray16le", "gray16le")}


def encode_image(frame: np.ndarray, image_format: str = "png") -> bytes:
    """One frame as an image file's bytes, through FFmpeg's image encoders: png ([H, W, 3] uint8
    RGB), png_gray ([H, W] uint8), png16 and tiff16 ([H, W] uint16, 16-bit gray), jpeg (RGB, quality 2).
    PNG and TIFF are lossless: decoded, they give the array back."""
    codec, pix_fmt, given = IMAGE_FORMATS[image_format]
    context = av.CodecContext.create(codec, "w")
    context.width, context.height = frame.shape[1], frame.shape[0]
    context.pix_fmt = pix_fmt
    context.time_base = Fraction(1, 30)
    if codec == "mjpeg":
        context.options = {"qscale": "2"}
    source = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format=given)
    packets = context.encode(source) + context.encode(None)
    return b"".join(bytes(packet) for packet in packets)

