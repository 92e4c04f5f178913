"""Copy mode: cut a time range out of an MP4 by packet copy, so the output decodes to the
source's pixels bit for bit.

The packets of [start, end) are copied into a new MP4 whose timestamps start at 0. Plain MP4s are
cut on their sample tables (`formats.video.mp4`, no per-packet work); anything else is remuxed through
PyAV. Packets can be copied alone only when they are one unbroken decode-order run starting on a
keyframe that is shown first: lerobot's recorder writes each episode as its own GOP run, but
convert_image_to_video_dataset encodes many episodes in one stream (episodes start inside GOPs,
HEVC B-frames reference frames of the next episode). Such a segment is decoded and encoded
losslessly in the source's pixel format (x264 lossless for 8-bit YUV, else FFV1), checked by
decoding it again, so it still decodes to the source's pixels; `CopyResult.note()` says so for
mixtrain.json. A remuxed or encoded segment's frame count is counted by decoding the written file.

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
from fractions import Fraction
from typing import BinaryIO

import av
import numpy as np

from formats.errors import VideoError
from formats.video import (
    FrameCallback,
    VideoInfo,
    _bounds,
    _fmt,
    _info_of,
    _open_input,
    _rewind,
    _seek,
    _segment_frames,
    _truncate,
    _video_stream,
    bitstream,
    encode_frames,
    first_time,
    mp4,
    probe,
    stream_info,
)
from formats.video.policy import lossless_options

__all__ = ["CopyResult", "copy_segment", "verify_decodes", "check_copied", "LOSSLESS", "VERIFY_MODES", "SAMPLES", "FULL", "OFF"]

# What copy mode checks of the samples it copied (`--verify_copies`): their framing and the first
# picture (`verify_samples`, the default), every picture decoded (`verify_decodes`), or nothing.
SAMPLES, FULL, OFF = "samples", "full", "off"
VERIFY_MODES = (SAMPLES, FULL, OFF)

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


def copy_segment(
    source: BinaryIO | str,
    destination: BinaryIO,
    *,
    start: float | None,
    end: float | None,
    frames: int,
    fps: float,
    verify: str = SAMPLES,
) -> CopyResult:
    """Remux the packets presented in [start, end) seconds into a new MP4 starting at t=0.

    Args:
      source: readable, seekable file object (or path) of the source MP4.
      destination: writable, seekable file object; receives a complete MP4.
      start, end: segment bounds in seconds of the source's presentation time; None = open end.
      frames: the number of frames the segment must hold (the sequence length).
      fps: frame rate used to place the half-frame tolerance around the bounds.
      verify: SAMPLES (check the written samples' framing and decode the first, `verify_samples`),
        FULL (decode the written file once, `verify_decodes`) or OFF; the sample-table path
        otherwise copies bytes it never looked at.

    Raises:
      VideoError: unreadable input, or a segment whose frame count is not `frames`.
    """
    copied = _copy_by_sample_table(source, destination, start=start, end=end, frames=frames, fps=fps)
    if copied is not None:
        result, cut = copied
        if verify == FULL:
            verify_decodes(destination, frames)
        elif verify == SAMPLES:
            data = _written_bytes(destination)
            sizes = cut.table.sizes[cut.first:cut.stop]
            verify_samples(data, cut.table.stsd, len(data) - int(sizes.sum()) + np.cumsum(sizes) - sizes, sizes, frames)
        return result
    return _copy_by_remux(source, destination, start=start, end=end, frames=frames, fps=fps)


def copy_whole(source: BinaryIO | str, destination: BinaryIO | str, *, frames: int, fps: float, verify: str = SAMPLES) -> CopyResult | None:
    """A file that is exactly the episode: copied byte for byte (checked to hold its `frames`;
    None). A longer one is cut to its first frames (`copy_segment`'s result, which says whether
    the cut had to be encoded losslessly)."""
    if isinstance(source, str):
        with open(source, "rb") as handle:
            data = handle.read()
    else:
        data = source.read()
    held = probe(io.BytesIO(data)).frames
    first = first_time(io.BytesIO(data))
    if held > frames or first:  # the episode is the file's first frames, or its clock starts later: cut, from 0
        return copy_segment(io.BytesIO(data), destination, start=first, end=first + frames / fps, frames=frames, fps=fps, verify=verify)
    if held != frames:
        raise VideoError(f"video holds {held} frames, the episode has {frames} steps")
    table = mp4.read_sample_table(io.BytesIO(data)) if verify == SAMPLES else None
    if table is not None:
        verify_samples(data, table.stsd, table.offsets, table.sizes, frames)
    elif verify != OFF:
        verify_decodes(io.BytesIO(data), frames)
    if isinstance(destination, str):
        with open(destination, "wb") as handle:
            handle.write(data)
    else:
        destination.write(data)
    return None


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


def check_copied(written: BinaryIO | str, frames: int, fps: float, declared: tuple[int, int] | None) -> None:
    """What a copy keeps from its source that the dataset must not contradict, from the written
    file's headers and packet times (no decoding): frames of the declared (width, height), and
    frame i presented at timestep i (within half a frame, where the reader looks for it). A
    variable-frame-rate source can hold the right number of frames at other times: the reader,
    which decodes timesteps by time, would then find fewer frames than steps."""
    _rewind(written)
    times = _presentation_times(written)  # read before the demuxer opens the file object: it keeps its own position
    _rewind(written)
    container = _open_input(written)
    try:
        stream = _video_stream(container)
        size = (stream.codec_context.width, stream.codec_context.height)
        if declared is not None and size != tuple(declared):
            raise VideoError(f"frames are {size[0]}x{size[1]}, the metadata declares {declared[0]}x{declared[1]}")
        if times is None:  # not the plain MP4 the sample table reads: the demuxer's packets
            base = stream.time_base
            pts = np.array([packet.pts for packet in container.demux(stream) if packet.size > 0 and packet.pts is not None], np.int64)
            times = np.sort(pts) * base.numerator / base.denominator
    except av.error.FFmpegError as error:
        raise VideoError(f"cannot read video: {error}") from error
    finally:
        container.close()
        _rewind(written)
    steps = np.arange(min(frames, len(times))) / fps
    late = np.flatnonzero(np.abs(times[:len(steps)] - steps) >= 0.5 / fps)
    if len(late):
        index = int(late[0])
        raise VideoError(f"frame timing differs from the declared rate: frame {index} is presented at {times[index]:.4g} s, timestep {index} at "
                         f"{index / fps:.4g} s ({fps:g} fps); copied as it is, the reader would not find it there")


def _presentation_times(written: BinaryIO | str) -> np.ndarray | None:
    """The written file's sample presentation times in seconds, ascending, from its own sample table
    (edit list applied, as the demuxer presents them): the times of 150 samples without making 150
    packet objects and fractions (that was 60 % of copy mode's CPU at 3,200 episodes). None where
    the file is not the plain one-track MP4 the table reads."""
    with contextlib.ExitStack() as stack:
        handle = stack.enter_context(open(written, "rb")) if isinstance(written, str) else written
        table = mp4.read_sample_table(handle)
    if table is None:
        return None
    pts = table.pts[table.sizes > 0]
    # An edit that starts between two frames, or of no duration: the demuxer snaps or stretches
    # the times (frames before it discarded, the next shown at 0), which the table does not.
    if table.edit is not None and (table.edit[0] == 0 or (len(pts) and int(pts.min()) != 0)):
        return None
    return np.sort(pts) / table.timescale


def verify_samples(data: bytes, stsd: bytes, offsets: np.ndarray, sizes: np.ndarray, frames: int) -> None:
    """Copy mode's default check of a written file `data` whose samples lie at `offsets` / `sizes`:
    every sample's framing (`bitstream.check_samples`), then its first sample (a keyframe) decoded
    alone by a bare decoder, at a small fraction of `verify_decodes`'s CPU. A codec whose framing is not parsed here is decoded
    whole instead. Damaged samples are a VideoError worded as `verify_decodes` words them."""
    form = bitstream.sample_format(stsd)
    if form is None:
        verify_decodes(io.BytesIO(data), frames)
        return
    problem = bitstream.check_samples(form, data, offsets, sizes)
    if problem is None and len(sizes) != frames:
        problem = f"{len(sizes)} samples, expected {frames}"
    if problem is None and frames:
        try:
            first, size = int(offsets[0]), int(sizes[0])
            if not _decodes_alone(form, data[first:first + size]):
                problem = "its first sample decodes to no picture"
        except av.error.FFmpegError as error:
            problem = str(error)
    if problem is not None:
        raise VideoError(f"the copied samples do not decode ({problem}); the source video is damaged")


def _decodes_alone(form: bitstream.SampleFormat, sample: bytes) -> bool:
    """Whether a (key) sample decodes to a picture on its own, given its track's configuration: a
    bare decoder on one thread (opening the file with PyAV, which probes it, cost 3-7x as much, and a
    thread per core more than the one picture)."""
    decoder = av.CodecContext.create(bitstream.DECODERS[form.kind], "r")
    decoder.extradata = form.config
    decoder.thread_count = 1
    return bool(decoder.decode(av.Packet(sample)) or decoder.decode(None))


def _written_bytes(destination: BinaryIO | str) -> bytes:
    """What was written to `destination` (a path or a seekable file object), left rewound."""
    if isinstance(destination, str):
        with open(destination, "rb") as handle:
            return handle.read()
    if isinstance(destination, io.BytesIO):
        _rewind(destination)
        return destination.getvalue()
    destination.seek(0)
    data = destination.read()
    destination.seek(0)
    return data


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
                          frames: int, fps: float) -> tuple[CopyResult, mp4.Cut] | None:
    """The fast path of `copy_segment` (see formats.video.mp4), with the cut it wrote; None when the file
    or the cut is not the plain case: then every error is left to the PyAV path, which words it."""
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
        return CopyResult(frames=frames, reencoded=False, info=dataclasses.replace(facts[1], frames=frames)), cut
    finally:
        if handle is not source:
            handle.close()
        else:
            handle.seek(0)


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


