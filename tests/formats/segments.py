"""Every camera segment of a LeRobot v3 dataset, for the video tests."""

from collections.abc import Iterator

from formats import storage
from formats.sequence import VideoSegment
from formats.sources import lerobot_v3


def camera_segments(path) -> Iterator[tuple[str, VideoSegment, float]]:
    """(source video path, segment, fps) for every episode and camera, in plan order."""
    fs, root = storage.open_root(str(path))
    meta, refs = lerobot_v3.plan(fs, root)
    for ref in refs:
        for _, segment in ref.videos:
            yield storage.join(root, segment.path), segment, meta.fps
