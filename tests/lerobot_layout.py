"""An independent reader of LeRobot v3.0 datasets for the tests, written from lerobot's documented
layout (meta/info.json's path templates, the episodes table's file indices and timestamps) with
pyarrow and PyAV only: nothing of the converter's own reading code."""

from __future__ import annotations

import io
import json
import pathlib

import av
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq


class LeRobotV3:
    def __init__(self, root: pathlib.Path | str) -> None:
        self.root = pathlib.Path(root)
        self.info = json.loads((self.root / "meta" / "info.json").read_text())
        files = sorted((self.root / "meta" / "episodes").glob("chunk-*/file-*.parquet"))
        table = pa.concat_tables([pq.read_table(path) for path in files], promote_options="default")
        self.episodes = table.take(pc.sort_indices(table, [("episode_index", "ascending")])).to_pylist()
        tasks = pq.read_table(self.root / "meta" / "tasks.parquet")
        text = tasks.column("task" if "task" in tasks.column_names else "__index_level_0__").to_pylist()
        self.tasks = dict(zip(tasks.column("task_index").to_pylist(), text))
        self._data: dict[str, pa.Table] = {}

    @property
    def video_keys(self) -> list[str]:
        return [key for key, feature in self.info["features"].items() if feature["dtype"] == "video"]

    def frames(self, episode: int) -> pa.Table:
        """The episode's rows of its data file, in frame order."""
        entry = self.episodes[episode]
        path = self.info["data_path"].format(chunk_index=entry["data/chunk_index"], file_index=entry["data/file_index"])
        if path not in self._data:
            self._data[path] = pq.read_table(self.root / path)
        table = self._data[path]
        table = table.filter(pc.equal(table.column("episode_index"), entry["episode_index"]))
        return table.take(pc.sort_indices(table, [("frame_index", "ascending")]))

    def video(self, episode: int, key: str) -> list[np.ndarray]:
        """The camera's frames of the episode: those of its file shown in [from_timestamp, to_timestamp)."""
        entry = self.episodes[episode]
        prefix = f"videos/{key}/"
        path = self.info["video_path"].format(video_key=key, chunk_index=entry[prefix + "chunk_index"],
                                              file_index=entry[prefix + "file_index"])
        low, high = entry[prefix + "from_timestamp"], entry[prefix + "to_timestamp"]
        out = []
        with av.open(str(self.root / path)) as container:
            stream = container.streams.video[0]
            for frame in container.decode(stream):
                seconds = float(frame.pts * stream.time_base)
                if low - 1e-4 <= seconds < high - 1e-4:
                    out.append(frame.to_ndarray(format=_plain_format(frame.format.name)))
        return out


class LeRobotV21:
    """lerobot 0.3's v2.1 layout: one data file and one MP4 per episode, meta/*.jsonl."""

    def __init__(self, root: pathlib.Path | str) -> None:
        self.root = pathlib.Path(root)
        self.info = json.loads((self.root / "meta" / "info.json").read_text())
        self.episodes = sorted(_json_lines(self.root / "meta" / "episodes.jsonl"), key=lambda entry: entry["episode_index"])
        self.tasks = {entry["task_index"]: entry["task"] for entry in _json_lines(self.root / "meta" / "tasks.jsonl")}
        self.stats = {entry["episode_index"]: entry["stats"] for entry in _json_lines(self.root / "meta" / "episodes_stats.jsonl")}

    @property
    def video_keys(self) -> list[str]:
        return [key for key, feature in self.info["features"].items() if feature["dtype"] == "video"]

    def _chunk(self, episode: int) -> int:
        return episode // self.info["chunks_size"]

    def frames(self, episode: int) -> pa.Table:
        path = self.info["data_path"].format(episode_chunk=self._chunk(episode), episode_index=episode)
        return pq.read_table(self.root / path)

    def video_path(self, episode: int, key: str) -> pathlib.Path:
        return self.root / self.info["video_path"].format(episode_chunk=self._chunk(episode), video_key=key, episode_index=episode)

    def video(self, episode: int, key: str) -> list[np.ndarray]:
        with av.open(str(self.video_path(episode, key))) as container:
            return [frame.to_ndarray(format=_plain_format(frame.format.name)) for frame in container.decode(video=0)]


def image_keys(info: dict) -> list[str]:
    return [key for key, feature in info["features"].items() if feature["dtype"] == "image"]


def images(table: pa.Table, key: str) -> list[np.ndarray]:
    """An image feature's frames from a data file's rows (Hugging Face Image storage: bytes, path),
    decoded: [H, W] for gray, [H, W, 3] RGB."""
    out = []
    for cell in table.column(key).to_pylist():
        with av.open(io.BytesIO(cell["bytes"])) as container:
            frame = next(container.decode(video=0))
            out.append(frame.to_ndarray() if frame.format.name.startswith("gray") else frame.to_ndarray(format="rgb24"))
    return out


def _json_lines(path: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _plain_format(name: str) -> str:
    """Samples compared as they are: gray and deep formats as themselves, the rest as planar YUV or RGB."""
    if name.startswith("gray") or name in ("yuv420p", "yuv422p", "yuv444p"):
        return name
    return "rgb24"
