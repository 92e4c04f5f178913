"""A toy fifth source, known only to the tests: a folder of .npz episodes with an MP4 per camera.

It exists to prove that a source is one folder (as each built-in one under formats/sources/):
the Source here, the worker side in `rows.py`, the sample writer in `sample.py`; it registers both from
here, and runs through convert, validate and the contract tests (tests/contract.py) with no other
file of the product changed. Layout:

    toy.json                          {"fps": 10, "cameras": ["front"]}
    episodes/episode_NNN.npz          timestamp [T] float64 s, state [T, 3] float32, action [T, 2] float32
    videos/<camera>/episode_NNN.mp4   T frames, H.264
"""

from __future__ import annotations

import fsspec
import numpy as np
import pyarrow as pa

from formats import samples, sources, storage, video
from formats.sequence import VIDEO, ColumnSpec, DatasetMeta, base_columns, column_name
from formats.sources import Source
from tests.toy_source.rows import FORMAT, INDEX, EpisodeRef, Reader, arrays_of

__all__ = ["FORMAT", "SOURCE", "register", "unregister", "write_dataset"]


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
            timestamp = arrays_of(fs, storage.join(root, "episodes", f"{name}.npz"))["timestamp"]
            videos = tuple((column_name(camera, camera=True), f"videos/{camera}/{name}.mp4") for camera in cameras)
            refs.append(EpisodeRef(name, f"episodes/{name}.npz", len(timestamp), videos))
        first = arrays_of(fs, storage.join(root, refs[0].episode)) if refs else {"state": np.zeros((0, 3)), "action": np.zeros((0, 2))}
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



def register() -> None:
    from tests.toy_source.sample import SAMPLE

    sources.register(SOURCE)
    samples.register(SAMPLE)


def unregister() -> None:
    sources.unregister(FORMAT)
    samples.unregister(FORMAT)


def write_dataset(path: str, **options) -> dict:
    """The toy layout written at `path` (tests.toy_source.sample.write_dataset)."""
    from tests.toy_source.sample import write_dataset as write

    return write(path, **options)
