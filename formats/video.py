"""Video through PyAV: cut a time range out of an MP4 by packet copy, encode frames, probe, decode.

Copy mode never decodes: the packets of [start, end) are remuxed into a new MP4 whose timestamps
start at 0, so the output decodes to the source's pixels bit for bit. lerobot writes each episode
as its own closed GOP run and joins files by stream copy, so an episode starts on a keyframe; a
segment that does not (a cut inside a GOP) cannot be copied and is re-encoded from the decoded
frames with the source's codec at high quality, and reported as such.

Facts from real files (see ../shared/NOTES.md): copying AV1 needs `opaque=True` on the template
stream; lerobot's H.264 has B-frames (negative first dts, pts from 0).
"""

from __future__ import annotations

import dataclasses
import io
import os
from collections.abc import Iterable, Iterator
from fractions import Fraction
from typing import BinaryIO

import av
import numpy as np

from formats.errors import VideoError

# SVT-AV1 prints its whole configuration on every encode unless told errors only.
os.environ.setdefault("SVT_LOG", "1")

__all__ = [
    "VideoInfo",
    "CopyResult",
    "probe",
    "copy_segment",
    "encode_frames",
    "decode_frames",
    "ENCODERS",
]

# Codec name as containers report it -> the encoder PyAV's wheels ship for it.
ENCODERS = {"h264": "libx264", "hevc": "libx265", "av1": "libsvtav1"}
# Decoder names PyAV reports for a stream -> the codec's canonical name.
_CODEC_NAMES = {"libdav1d": "av1", "libaom-av1": "av1", "h264": "h264", "hevc": "hevc"}


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
    """What `copy_segment` wrote: its frame count and whether it had to re-encode."""

    frames: int
    reencoded: bool
    info: VideoInfo


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


def _bounds(stream, start: float | None, end: float | None, fps: float) -> tuple[int | None, int | None]:
    """[start, end) seconds -> pts bounds shifted by half a frame, so float rounding of the
    source's timestamps (float32 in lerobot) never moves a frame across a boundary."""
    time_base = stream.time_base
    half = 0.5 / fps
    low = None if start is None else int(round((start - half) / time_base))
    high = None if end is None else int(round((end - half) / time_base))
    return low, high


def _seek(container, stream, low: int | None) -> None:
    if low is not None and low > 0:
        # Lands on the keyframe at or before `low`: only that GOP is read, not the file's head.
        container.seek(max(low, 0), stream=stream, backward=True, any_frame=False)


def copy_segment(
    source: BinaryIO | str,
    destination: BinaryIO,
    *,
    start: float | None,
    end: float | None,
    frames: int,
    fps: float,
) -> CopyResult:
    """Remux the packets presented in [start, end) seconds into a new MP4 starting at t=0.

    Args:
      source: readable, seekable file object (or path) of the source MP4.
      destination: writable, seekable file object; receives a complete MP4.
      start, end: segment bounds in seconds of the source's presentation time; None = open end.
      frames: the number of frames the segment must hold (the sequence length).
      fps: frame rate used to place the half-frame tolerance around the bounds.

    Raises:
      VideoError: unreadable input, or a segment whose frame count is not `frames`.
    """
    container = _open_input(source)
    try:
        stream = _video_stream(container)
        low, high = _bounds(stream, start, end, fps)
        _seek(container, stream, low)
        packets = []
        for packet in container.demux(stream):
            if packet.size == 0 or packet.pts is None:
                continue
            if high is not None and packet.dts is not None and packet.dts >= high:
                break  # decode order passed the segment: every later pts is later still
            if (low is None or packet.pts >= low) and (high is None or packet.pts < high):
                packets.append(packet)
        if len(packets) != frames:
            raise VideoError(
                f"segment [{_fmt(start)}, {_fmt(end)}) s holds {len(packets)} frames, expected {frames}"
            )
        if not packets[0].is_keyframe:
            return _reencode_segment(container, stream, destination, low, high, frames)
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
        return CopyResult(frames=len(packets), reencoded=False, info=_info_of(stream, frames))
    except av.error.FFmpegError as error:
        raise VideoError(f"cannot read video: {error}") from error
    finally:
        container.close()


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


def _reencode_segment(container, stream, destination, low, high, frames: int) -> CopyResult:
    """Decode the segment (from the keyframe before it) and encode it with the source's codec."""
    container.seek(max(low or 0, 0), stream=stream, backward=True, any_frame=False)

    def segment_frames() -> Iterator[av.VideoFrame]:
        for frame in container.decode(stream):
            if frame.pts is None:
                continue
            if high is not None and frame.pts >= high:
                break
            if low is None or frame.pts >= low:
                yield frame

    codec = _codec_name(stream)
    rate = stream.average_rate or Fraction(30)
    written = encode_frames(
        segment_frames(),
        destination,
        codec=codec if codec in ENCODERS else "h264",
        fps=rate,
        crf=_LOSSLESS_ENOUGH_CRF.get(codec, 18),
        gop=None,
        pix_fmt=stream.codec_context.pix_fmt or "yuv420p",
    )
    if written != frames:
        raise VideoError(f"re-encoded segment holds {written} frames, expected {frames}")
    return CopyResult(frames=written, reencoded=True, info=_info_of(stream, frames))


# Quality for the one-off re-encode of a segment that cannot be copied: visually lossless.
_LOSSLESS_ENOUGH_CRF = {"h264": 10, "hevc": 10, "av1": 8}


def encode_frames(
    frames: Iterable[np.ndarray | av.VideoFrame],
    destination: BinaryIO,
    *,
    codec: str = "h264",
    fps: float | Fraction = 30,
    crf: int | None = 18,
    gop: int | None = None,
    pix_fmt: str = "yuv420p",
    preset: str | None = None,
) -> int:
    """Encode frames (uint8 [H, W, 3] RGB arrays or decoded VideoFrames) into an MP4.

    Returns the number of frames written. Frame i gets pts i in a 1/fps time base, so
    timestamps are exactly i/fps. x264 runs with `mbtree=0`, which makes
    repeated encodes of the same frames byte-identical (NOTES.md).
    """
    encoder = ENCODERS.get(codec, codec)
    rate = Fraction(fps).limit_denominator(1001000) if not isinstance(fps, Fraction) else fps
    output = av.open(destination, mode="w", format="mp4")
    count = 0
    try:
        stream = None
        for item in frames:
            if isinstance(item, np.ndarray):
                frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(item), format="rgb24")
            else:
                frame = item
            if stream is None:
                stream = output.add_stream(encoder, rate=rate)
                stream.width = frame.width
                stream.height = frame.height
                stream.pix_fmt = pix_fmt
                stream.codec_context.time_base = 1 / rate
                stream.options = _encoder_options(encoder, crf, gop, preset)
            frame.pts = count
            frame.time_base = 1 / rate
            frame.pict_type = av.video.frame.PictureType.NONE
            for packet in stream.encode(frame):
                output.mux(packet)
            count += 1
        if stream is not None:
            for packet in stream.encode(None):
                output.mux(packet)
    finally:
        output.close()
    return count


def _encoder_options(encoder: str, crf: int | None, gop: int | None, preset: str | None) -> dict:
    options: dict[str, str] = {}
    if crf is not None:
        options["crf"] = str(crf)
    if gop is not None:
        options["g"] = str(gop)
    if encoder == "libx264":
        options["x264-params"] = "mbtree=0"
        if preset:
            options["preset"] = preset
    elif encoder == "libx265":
        options["x265-params"] = "log-level=error"
        if preset:
            options["preset"] = preset
    elif encoder == "libsvtav1":
        options["preset"] = preset or "12"
        options["svtav1-params"] = "verbosity=0"
    return options


def decode_frames(source: BinaryIO | str | bytes, *, start: float | None = None, end: float | None = None,
                  fps: float = 30, planar: bool = True) -> np.ndarray:
    """Decode the frames presented in [start, end) seconds.

    Returns [N, H*3/2, W] uint8 raw yuv420p planes when `planar` (bit-exact comparisons, no
    colour conversion), else [N, H, W, 3] RGB.
    """
    if isinstance(source, bytes):
        source = io.BytesIO(source)
    container = _open_input(source)
    try:
        stream = _video_stream(container)
        low, high = _bounds(stream, start, end, fps)
        _seek(container, stream, low)
        out = []
        for frame in container.decode(stream):
            if frame.pts is None:
                continue
            if high is not None and frame.pts >= high:
                break
            if low is None or frame.pts >= low:
                out.append(frame.to_ndarray() if planar else frame.to_ndarray(format="rgb24"))
        return np.stack(out) if out else np.zeros((0,), np.uint8)
    except av.error.FFmpegError as error:
        raise VideoError(f"cannot decode video: {error}") from error
    finally:
        container.close()
