"""The toy source's sample writer: what its contract tests and `make_sample` write."""

from __future__ import annotations

import json
import os

import av
import numpy as np

from formats import samples
from tests.toy_source.rows import FORMAT, INDEX


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
