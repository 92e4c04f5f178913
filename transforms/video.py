"""WriteVideos: each sequence's cameras become files/<column>/<sequence_id>.mp4.

Runs in the same fused stage as the load, so video bytes never cross a shuffle: only the
relative path travels on in the Sequence. Per column, the plan decided (`video_policy.plan_column`)
whether segments are packet-copied or decoded and encoded; image sequences are always encoded.
With image statistics on, sampled frames are summarised during the decode that encoding does
anyway; copied segments are decoded once for them.
"""

from __future__ import annotations

import contextlib
import io
import os

import apache_beam as beam
import av
from apache_beam.metrics import Metrics

from formats import mixtrain, storage, video
from formats.errors import ConversionError, FormatError, in_context
from formats.mixtrain.stats import ImageStats
from formats.sequence import FileRef, ImageFrames, Sequence, VideoSegment
from formats.video import policy, stream_copy
from transforms import progress
from transforms.errors import ERRORS, FAIL, skip_or_raise
from transforms.progress import report

__all__ = ["WriteVideos", "CODEC_THREADS_ENV"]

# Set in a cluster worker's environment by a runner that knows how many worker threads share its
# machine (pipelines/dask_runner.py): the codec threads of a WriteVideos given None, as the local
# runner's workers get theirs (pipelines/local_workers.py codec_threads). Threads never change the
# bytes written (formats/video: exact decoders, x264/x265 on a fixed count).
CODEC_THREADS_ENV = "MIXTRAIN_CODEC_THREADS"


class _WriteVideosFn(beam.DoFn):
    def __init__(self, source_url: str, staging_url: str, fps: float, encode: dict, sizes: dict, video_stats: bool,
                 on_error: str = FAIL, verify_copies: str = stream_copy.SAMPLES, copied_columns: frozenset = frozenset(),
                 codec_threads: int | None = None):
        self._codec_threads = codec_threads
        self._verify_copies = verify_copies
        self._copied_columns = copied_columns
        self._source_url = source_url
        self._staging_url = staging_url
        self._fps = fps
        self._encode = encode
        self._sizes = sizes
        self._on_error = on_error
        self._video_stats = video_stats
        self._copied = Metrics.counter("mixtrain", "video_segments_copied")
        self._reencoded = Metrics.counter("mixtrain", "video_segments_reencoded")
        self._encoded = Metrics.counter("mixtrain", "video_segments_encoded")
        self._frames = Metrics.counter("mixtrain", "video_frames_encoded")
        self._sequences = Metrics.counter("mixtrain", "sequences_loaded")
        self._files = Metrics.counter("mixtrain", "files_copied")

    def setup(self):
        self._source_fs, self._source_root = storage.open_root(self._source_url)
        self._out_fs, self._out_root = storage.open_root(self._staging_url)
        threads = os.environ.get(CODEC_THREADS_ENV, "")
        if self._codec_threads is None and threads.isascii() and threads.isdigit():  # "²" is a digit to isdigit, not to int
            self._codec_threads = int(threads) or None

    def finish_bundle(self):
        progress.flush()

    def process(self, sequence: Sequence):
        self._written_bytes = 0
        try:
            for column, item in sorted(sequence.videos.items()):
                if isinstance(item, (VideoSegment, ImageFrames)):
                    sequence.videos[column] = self._write(sequence, column, item)
            for column, item in sorted(sequence.files.items()):
                if isinstance(item, FileRef):
                    sequence.files[column] = self._copy_file(sequence, column, item, several=False)
                elif isinstance(item, (list, tuple)):
                    _check_distinct_names(sequence, column, item)
                    sequence.files[column] = [self._copy_file(sequence, column, ref, several=True) for ref in item]
        except ConversionError as error:
            self._discard_written(sequence)
            yield skip_or_raise(error, self._on_error, sequence.sequence_id, "video")
            return
        self._sequences.inc()
        report(sequences=1, timesteps=sequence.length, bytes=self._written_bytes)
        yield sequence

    def _write(self, sequence: Sequence, column: str, item: VideoSegment | ImageFrames) -> str:
        relative = mixtrain.video_path(column, sequence.sequence_id)
        target = storage.join(self._out_root, relative)
        self._out_fs.makedirs(storage.join(self._out_root, mixtrain.FILES_DIR, column), exist_ok=True)
        # Local output: PyAV writes the file itself; remote: through memory, then one upload.
        local_target = storage.local_path(self._out_fs, target)
        destination = local_target or io.BytesIO()
        options = self._encode.get(column)
        size = self._sizes.get(column)
        stats = ImageStats(sequence.length) if self._video_stats else None
        on_frame = _sampler(stats) if stats is not None else None
        path = None
        try:
            if isinstance(item, ImageFrames):
                path = item.source
                if len(item) != sequence.length:
                    raise video.VideoError(f"camera {column!r} has {len(item)} images for {sequence.length} steps")
                result = video.encode_to_floor(lambda: item.frames, destination, fps=self._fps,
                                               options=options or policy.EncodeOptions(), on_frame=on_frame, expected_size=size,
                                               threads=self._codec_threads)
                self._encoded.inc()
                self._frames.inc(result.frames)
                _note_floor(sequence, column, result)
            else:
                path = storage.resolve_inside(self._source_root, item.path, what="video file", fs=self._source_fs)
                if not self._source_fs.exists(path):
                    raise video.VideoError("video file not found")
                with contextlib.ExitStack() as stack:
                    source = storage.local_path(self._source_fs, path) or stack.enter_context(storage.open_input(self._source_fs, path))
                    if item.frame_indices is not None:
                        result = video.retime(source, destination, indices=item.frame_indices, fps=self._fps, options=options,
                                              on_frame=on_frame, threads=self._codec_threads, expected_size=size)
                        (self._encoded if options is not None else self._reencoded).inc()
                        if column in self._copied_columns:  # a copied column, but this episode's frames had to be re-timed
                            sequence.video_notes[column] = {
                                "written_as": "retime", "codec": result.options.codec, "pix_fmt": result.options.pix_fmt,
                                "crf": result.options.crf, "reason": "the source's frame_index is not 0..T-1 (frames skipped or "
                                                                     "repeated): re-timed with a near-lossless encode"}
                        _note_floor(sequence, column, result)
                    elif options is None:
                        # With image statistics the written file is decoded below anyway: verified in that one pass.
                        verify = self._verify_copies if on_frame is None else stream_copy.OFF
                        if item.start is None and item.end is None:
                            copied = stream_copy.copy_whole(source, destination, frames=item.frames, fps=self._fps, verify=verify)
                        else:
                            copied = stream_copy.copy_segment(source, destination, start=item.start, end=item.end, frames=item.frames,
                                                        fps=self._fps, verify=verify)
                        stream_copy.check_copied(destination, item.frames, self._fps, size)
                        (self._reencoded if copied is not None and copied.reencoded else self._copied).inc()
                        if copied is not None and copied.note() is not None:
                            sequence.video_notes[column] = copied.note()
                        if on_frame is not None:
                            stream_copy.verify_decodes(destination, item.frames, on_frame=on_frame)
                    else:
                        result = video.reencode_segment(source, destination, start=item.start, end=item.end, frames=item.frames,
                                                        fps=self._fps, options=options, on_frame=on_frame, expected_size=size,
                                                        threads=self._codec_threads)
                        self._encoded.inc()
                        self._frames.inc(result.frames)
                        _note_floor(sequence, column, result)
            if stats is not None and (summary := stats.result()) is not None:
                sequence.extra_stats[column] = summary
        except ConversionError as error:
            if self._out_fs.exists(target):  # the file being written when it failed: never published
                self._out_fs.rm(target)
            raise in_context(error, file=path, sequence=f"{sequence.sequence_id} ({column})") from error
        if local_target:
            self._written_bytes += os.path.getsize(local_target)
        else:
            self._out_fs.pipe_file(target, destination.getvalue())
            self._written_bytes += destination.getbuffer().nbytes
        return relative


    def _discard_written(self, sequence: Sequence) -> None:
        """A skipped sequence leaves no files behind in the staging output."""
        written = [value for value in sequence.videos.values() if isinstance(value, str)]
        for value in sequence.files.values():
            if isinstance(value, str):
                written.append(value)
            elif isinstance(value, list):
                written += [v for v in value if isinstance(v, str)]
        for relative in written:
            target = storage.join(self._out_root, relative)
            if self._out_fs.exists(target):
                self._out_fs.rm(target)

    def _copy_file(self, sequence: Sequence, column: str, ref: FileRef, several: bool) -> str:
        """Copy a non-video source file (audio, depth NPZ, annotation image) byte for byte."""
        path = storage.resolve_inside(self._source_root, ref.path, what="file", fs=self._source_fs)
        relative = mixtrain.file_path(column, sequence.sequence_id, ref.name or ref.path.rsplit("/", 1)[-1], several)
        target = storage.join(self._out_root, relative)
        try:
            data = self._source_fs.cat_file(path)
        except FileNotFoundError:
            raise in_context(FormatError(f"{column} file not found"), file=path, sequence=sequence.sequence_id) from None
        self._out_fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
        self._out_fs.pipe_file(target, data)
        self._written_bytes += len(data)
        self._files.inc()
        return relative


def _check_distinct_names(sequence: Sequence, column: str, refs: list[FileRef]) -> None:
    """A row's several files go to files/<column>/<id>/<name>: two with one name would be one file
    (the last copied winning), so they are refused before anything is copied."""
    seen: dict[str, str] = {}
    for ref in refs:
        name = ref.name or ref.path.rsplit("/", 1)[-1]
        if name in seen:
            raise in_context(FormatError(f"{column} files {seen[name]!r} and {ref.path!r} would both be written as {name!r}"),
                             sequence=sequence.sequence_id)
        seen[name] = ref.path


def _note_floor(sequence: Sequence, column: str, result: video.EncodeResult) -> None:
    """A segment encoded at a lower crf than its column's, to keep the luma PSNR floor, says so in
    mixtrain.json (`crf_lowered` of the column, or the re-timing note of a copied one)."""
    if result.below_floor is None:
        return
    crf, measured = result.below_floor
    note = sequence.video_notes.setdefault(column, {"written_as": "encode", "codec": result.options.codec,
                                                    "pix_fmt": result.options.pix_fmt})
    note.update(crf=result.options.crf, psnr_min=round(result.psnr_min, 2),
                reason=(f"{note['reason']}; " if "reason" in note else "")
                + f"luma PSNR {measured:.2f} dB at crf {crf} is below the {result.options.min_psnr:g} dB floor")


def _sampler(stats: ImageStats):
    def on_frame(index: int, frame: av.VideoFrame) -> None:
        if index in stats.wanted:
            stats.add(video.image_array(frame))

    return on_frame


class WriteVideos(beam.PTransform):
    """Write each sequence's cameras into the staging output: copy segments or encode them.

    Args:
      source_url: the source dataset root (video paths in segments are relative to it).
      staging_url: where this run writes before it publishes.
      fps: the dataset frame rate (frame timing of encodes, tolerance around segment bounds).
      encode: column -> EncodeOptions, or None to packet-copy that column (from `video_policy.plan_column`).
      sizes: column -> (width, height) the metadata declares for the source frames (checked on encode).
      video_stats: summarise sampled frames per channel into `Sequence.extra_stats`.
      on_error: FAIL stops at the first bad sequence; SKIP drops it (and its files) into the errors output.
      verify_copies: what is checked of every copied file (stream_copy.VERIFY_MODES; damaged source samples
        are refused, not published).
      copied_columns: the columns planned as copies: an episode of one that had to be re-timed is noted.
      codec_threads: threads each encode and decode may use (None: the codecs' own choice, every core;
        encoders whose bytes depend on it keep their fixed count).
    """

    def __init__(self, source_url: str, staging_url: str, fps: float, encode: dict | None = None, sizes: dict | None = None,
                 video_stats: bool = False, on_error: str = FAIL, verify_copies: str = stream_copy.SAMPLES, copied_columns: frozenset = frozenset(),
                 codec_threads: int | None = None):
        super().__init__()
        self._fn = _WriteVideosFn(source_url, staging_url, fps, dict(encode or {}), dict(sizes or {}), video_stats, on_error,
                                  verify_copies, frozenset(copied_columns), codec_threads)

    def expand(self, sequences):
        """Returns {"sequences": ..., "errors": [error records]} (see ReadSequences)."""
        written = sequences | "WriteVideoFiles" >> beam.ParDo(self._fn).with_outputs(ERRORS, main="sequences")
        return {"sequences": written.sequences, ERRORS: [written[ERRORS]]}
