"""The toy source's worker side: one planned episode, loaded from its .npz and MP4s."""

from __future__ import annotations

import dataclasses
import io

import numpy as np

from formats import storage
from formats.errors import ConversionError, FormatError, in_context
from formats.sequence import Sequence, VideoSegment, rebased_timestamps
from formats.sources import SourceReader, SourceRef

FORMAT = "npz_toy"
INDEX = "toy.json"


@dataclasses.dataclass(frozen=True)
class EpisodeRef(SourceRef):
    sequence_id: str
    episode: str  # episodes/<name>.npz, relative to the root
    length: int
    videos: tuple[tuple[str, str], ...]  # (column, path relative to the root)

    @property
    def estimated_steps(self) -> int:
        return self.length

    @property
    def unit_files(self) -> tuple[str, ...]:
        return (self.episode, *(path for _, path in self.videos))


def arrays_of(fs, path: str) -> dict[str, np.ndarray]:
    with storage.open_input(fs, path) as handle:
        with np.load(io.BytesIO(handle.read())) as data:
            return {name: data[name] for name in data.files}


class Reader(SourceReader):
    def load(self, ref: EpisodeRef) -> Sequence:
        path = storage.resolve_inside(self.root, ref.episode, what="episode file", fs=self.fs)
        try:
            arrays = arrays_of(self.fs, path)
            if len(arrays["timestamp"]) != ref.length:
                raise FormatError(f"{len(arrays['timestamp'])} steps, planned {ref.length}")
            sequence = Sequence(ref.sequence_id, ref.length, rebased_timestamps(arrays["timestamp"], self.meta.fps))
        except ConversionError as error:
            raise in_context(error, file=path, sequence=ref.sequence_id) from error
        sequence.scalars.update(length=ref.length, duration_seconds=ref.length / self.meta.fps)
        sequence.trajectories["obs_state"] = arrays["state"]
        sequence.trajectories["action"] = arrays["action"]
        sequence.videos.update({column: VideoSegment(path, ref.length) for column, path in ref.videos})
        return sequence


