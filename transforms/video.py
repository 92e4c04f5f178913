"""WriteVideos: each sequence's camera segments become files/<column>/<sequence_id>.mp4.

Runs in the same fused stage as the load, so video bytes never cross a shuffle: only the
relative path travels on in the Sequence.
"""

from __future__ import annotations

import io
import sys

import apache_beam as beam
from apache_beam.metrics import Metrics

from formats import mixtrain, storage, video
from formats.errors import ConversionError, in_context
from formats.sequence import Sequence, VideoSegment

__all__ = ["WriteVideos"]


class _WriteVideosFn(beam.DoFn):
    def __init__(self, source_url: str, staging_url: str, fps: float, progress_every: int):
        self._source_url = source_url
        self._staging_url = staging_url
        self._fps = fps
        self._progress_every = progress_every
        self._copied = Metrics.counter("mixtrain", "video_segments_copied")
        self._reencoded = Metrics.counter("mixtrain", "video_segments_reencoded")
        self._sequences = Metrics.counter("mixtrain", "sequences_loaded")

    def setup(self):
        self._source_fs, self._source_root = storage.open_root(self._source_url)
        self._out_fs, self._out_root = storage.open_root(self._staging_url)
        self._done = 0

    def process(self, sequence: Sequence):
        for column, segment in sorted(sequence.videos.items()):
            if isinstance(segment, VideoSegment):
                sequence.videos[column] = self._copy(sequence, column, segment)
        self._sequences.inc()
        self._done += 1
        if self._progress_every and self._done % self._progress_every == 0:
            print(f"[mixtrain-convert] worker progress: {self._done} sequences converted", file=sys.stderr, flush=True)
        yield sequence

    def _copy(self, sequence: Sequence, column: str, segment: VideoSegment) -> str:
        path = storage.resolve_inside(self._source_root, segment.path, what="video file")
        relative = mixtrain.video_path(column, sequence.sequence_id)
        try:
            if not self._source_fs.exists(path):
                raise video.VideoError("video file not found")
            buffer = io.BytesIO()
            with self._source_fs.open(path, "rb") as handle:
                result = video.copy_segment(handle, buffer, start=segment.start, end=segment.end,
                                            frames=segment.frames, fps=self._fps)
        except ConversionError as error:
            raise in_context(error, file=path, sequence=sequence.sequence_id) from error
        (self._reencoded if result.reencoded else self._copied).inc()
        target = storage.join(self._out_root, relative)
        self._out_fs.makedirs(storage.join(self._out_root, mixtrain.FILES_DIR, column), exist_ok=True)
        self._out_fs.pipe_file(target, buffer.getvalue())
        return relative


class WriteVideos(beam.PTransform):
    """Copy each sequence's video segments into the staging output (copy mode: packet remux).

    Args:
      source_url: the source dataset root (video paths in segments are relative to it).
      staging_url: where this run writes before it publishes.
      fps: the dataset frame rate (places the half-frame tolerance around segment bounds).
      progress_every: print a worker progress line every N sequences (0: never).
    """

    def __init__(self, source_url: str, staging_url: str, fps: float, progress_every: int = 100):
        super().__init__()
        self._fn = _WriteVideosFn(source_url, staging_url, fps, progress_every)

    def expand(self, sequences):
        return sequences | "CopySegments" >> beam.ParDo(self._fn)
