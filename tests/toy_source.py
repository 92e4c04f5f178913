"""A toy fifth source, known only to the tests: a folder of .npz episodes with an MP4 per camera.

It exists to prove that a source is one module: it registers itself and its sample writer from
here, and runs through convert, validate and the contract tests (tests/contract.py) with no other
file of the product changed. Layout:

    toy.json                          {"fps": 10, "cameras": ["front"]}
    episodes/episode_NNN.npz          timestamp [T] float64 s, state [T, 3] float32, action [T, 2] float32
    videos/<camera>/episode_NNN.mp4   T frames, H.264
"""

from __future__ import annotations

import dataclasses
import io
import json
import os

import av
import fsspec
import numpy as np
import pyarrow as pa

from formats import samples, sources, storage, video
from formats.errors import ConversionError, FormatError, in_context
from formats.sequence import VIDEO, ColumnSpec, DatasetMeta, Sequence, VideoSegment, base_columns, column_name, rebased_timestamps
from formats.source import Source, SourceReader, SourceRef

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


def _arrays(fs, path: str) -> dict[str, np.ndarray]:
    with storage.open_input(fs, path) as handle:
        with np.load(io.BytesIO(handle.read())) as data:
            return {name: data[name] for name in data.files}


class Reader(SourceReader):
    def load(self, ref: EpisodeRef) -> Sequence:
        path = storage.resolve_inside(self.root, ref.episode, what="episode file", fs=self.fs)
        try:
            arrays = _arrays(self.fs, path)
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


class NpzToy(Source):
    id = FORMAT
    expects = f"the toy source {INDEX}"
    shared_files = (INDEX,)

    def detect(self, fs: fsspec.AbstractFileSystem, root: str) -> bool:
        return fs.exists(storage.join(root, INDEX))

    def plan(self, fs: fsspec.AbstractFileSystem, root: str, options: dict) -> tuple[DatasetMeta, list[EpisodeRef]]:
        index = storage.read_json(fs, storage.join(root, INDEX))
        fps, cameras = float(index["fps"]), list(index["cameras"])
        names = sorted(path.rsplit("/", 1)[-1][: -len(".npz")] for path in fs.ls(storage.join(root, "episodes"), detail=False)
                       if path.endswith(".npz"))
        refs = []
        for name in names:
            timestamp = _arrays(fs, storage.join(root, "episodes", f"{name}.npz"))["timestamp"]
            videos = tuple((column_name(camera, camera=True), f"videos/{camera}/{name}.mp4") for camera in cameras)
            refs.append(EpisodeRef(name, f"episodes/{name}.npz", len(timestamp), videos))
        first = _arrays(fs, storage.join(root, refs[0].episode)) if refs else {"state": np.zeros((0, 3)), "action": np.zeros((0, 2))}
        columns = base_columns() + [
            ColumnSpec.trajectory("obs_state", first["state"].dtype, first["state"].shape[1], source="state"),
            ColumnSpec.trajectory("action", first["action"].dtype, first["action"].shape[1], source="action"),
        ]
        for camera in cameras:
            meta = {"source": f"videos/{camera}", "fps": fps}
            if refs:
                with storage.open_input(fs, storage.join(root, f"videos/{camera}/{refs[0].sequence_id}.mp4")) as handle:
                    info = video.stream_info(handle)
                meta.update(codec=info.codec, pix_fmt=info.pix_fmt, resolution={"width": info.width, "height": info.height})
            columns.append(ColumnSpec(column_name(camera, camera=True), VIDEO, pa.string(), meta))
        uri = storage.url_for(fs, root)
        return DatasetMeta(format=FORMAT, uri=uri, fps=fps, columns=columns, source={"format": FORMAT, "uri": uri, "cameras": cameras}), refs

    def open(self, fs: fsspec.AbstractFileSystem, root: str, meta: DatasetMeta) -> Reader:
        return Reader(fs, root, meta)


SOURCE = NpzToy()


def write_dataset(path: str, lengths=(6, 5, 7), cameras=("front",), fps: int = 10, width: int = 32, height: int = 24) -> dict:
    """Write the toy layout; returns {episode name: its arrays} (the truth)."""
    os.makedirs(os.path.join(path, "episodes"), exist_ok=True)
    with open(os.path.join(path, INDEX), "w") as handle:
        json.dump({"fps": fps, "cameras": list(cameras)}, handle)
    truth = {}
    rng = np.random.default_rng(0)
    for number, length in enumerate(lengths):
        name = f"episode_{number:03d}"
        arrays = {"timestamp": np.arange(length) / fps, "state": rng.normal(size=(length, 3)).astype(np.float32),
                  "action": rng.normal(size=(length, 2)).astype(np.float32)}
        np.savez(os.path.join(path, "episodes", f"{name}.npz"), **arrays)
        truth[name] = arrays
        for position, camera in enumerate(cameras):
            os.makedirs(os.path.join(path, "videos", camera), exist_ok=True)
            _write_mp4(os.path.join(path, "videos", camera, f"{name}.mp4"), number, position, length, fps, width, height)
    return truth


def _write_mp4(path: str, episode: int, camera: int, length: int, fps: int, width: int, height: int) -> None:
    y, x = np.mgrid[0:height, 0:width]
    with av.open(path, "w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"g": "2", "bf": "0"}
        for t in range(length):
            frame = np.stack([(x * 4 + t * 3 + episode * 40) % 256, (y * 5 + camera * 90 + t) % 256,
                              ((x + y) * 2 + episode * 17) % 256], axis=-1).astype(np.uint8)
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode())


def _bundled(path: str, episodes: int) -> str:
    lengths = tuple(5 + i % 4 for i in range(episodes))
    write_dataset(path, lengths)
    return f"an {FORMAT} sample with {episodes} episodes ({sum(lengths)} steps)"


SAMPLE = samples.Sample(FORMAT, small=lambda path: write_dataset(path), bundled=_bundled)


def register() -> None:
    sources.register(SOURCE)
    samples.register(SAMPLE)


def unregister() -> None:
    sources.unregister(FORMAT)
    samples.unregister(FORMAT)
