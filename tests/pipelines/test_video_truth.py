"""Videos that do not say what the dataset declares are refused with one line naming the file and
the sequence, never published: a camera file of another size than the camera's declared resolution
(column_types would state one size for files of two), and a variable-frame-rate file whose frame i
is not presented at timestep i (the reader, which decodes timesteps by time, then finds fewer
frames than steps). Over LeRobot (cut out of a file shared by episodes, and one file per
episode) and ORTF (one file per episode, copied whole), in copy and re-encode modes."""

from __future__ import annotations

import fractions
import io
import json
import pathlib

import av
import pytest

from formats.read.reader import open_dataset
from formats.sources.lerobot_v3.sample import SyntheticLeRobot, synthetic_frames
from formats.sources.lerobot_v3.sample import write_dataset as write_lerobot
from formats.sources.ortf.sample import SyntheticORTF
from formats.sources.ortf.sample import write_dataset as write_ortf
from formats.video import encode_frames, probe
from formats.video.policy import EncodeOptions
from pipelines import conversion

FPS = 15


def _lerobot(src: pathlib.Path, per_file: int) -> tuple[pathlib.Path, int, str]:
    """(the video file holding the second episode, its frame count, the first episode it holds)."""
    write_lerobot(str(src), SyntheticLeRobot(lengths=(6, 7, 5), codec="h264", gop=None, fps=FPS, episodes_per_video_file=per_file,
                                             cameras=("observation.images.front",)))
    files = sorted((src / "videos/observation.images.front").rglob("*.mp4"))
    return (files[1], 7, "episode_000001") if per_file == 1 else (files[0], 13, "episode_000000")


def _ortf(src: pathlib.Path) -> tuple[pathlib.Path, int, str]:
    write_ortf(str(src), SyntheticORTF(lengths=(6, 7, 5), fps=FPS, cameras=("cam_wrist",), depth_format=None, audio=False,
                                       annotations=False, failed_episodes=(), sequential_ids=True))
    return src / "videos/cam_wrist/chunk-000/episode_000001.mp4", 7, "000001"


def _ortf_slow(src: pathlib.Path) -> tuple[pathlib.Path, int, str]:
    """A camera at half the step rate: its frames are re-timed (frame_index = step // 2)."""
    write_ortf(str(src), SyntheticORTF(lengths=(6, 7, 5), fps=FPS, cameras=("cam_overhead",), slow_camera="cam_overhead",
                                       depth_format=None, audio=False, annotations=False, failed_episodes=(), sequential_ids=True))
    path = src / "videos/cam_overhead/chunk-000/episode_000001.mp4"
    return path, probe(str(path)).frames, "000001"


SOURCES = {"lerobot-shared-file": lambda src: _lerobot(src, 2), "lerobot-own-file": lambda src: _lerobot(src, 1), "ortf": _ortf}
SIZE_SOURCES = {**SOURCES, "ortf-slow-camera": _ortf_slow}


def _write_vfr(path: pathlib.Path, frames: int, width: int, height: int) -> None:
    """`frames` frames, each a tick of 1/(2 fps) after the previous but every third one two ticks:
    the frame count is right, the times drift off i / fps."""
    with av.open(str(path), "w") as output:
        stream = output.add_stream("libx264", rate=FPS * 2)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.codec_context.time_base = fractions.Fraction(1, FPS * 2)
        pts = 0
        for index, image in enumerate(synthetic_frames(3, 0, frames, height, width)):
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            frame.pts = pts
            frame.time_base = fractions.Fraction(1, FPS * 2)
            pts += 4 if index % 3 == 2 else 2
            for packet in stream.encode(frame):
                output.mux(packet)
        for packet in stream.encode(None):
            output.mux(packet)


def _convert(src, dst, *extra) -> tuple[int, str]:
    console = io.StringIO()
    code = conversion.run([f"--input={src}", f"--output={dst}", "--progress=off", *extra], out=io.StringIO(), console=console)
    return code, console.getvalue()


def _declared(src: pathlib.Path, source: str) -> tuple[int, int]:
    if source.startswith("ortf"):
        sensors = json.loads((src / "meta/manifest.json").read_text())["sensors"]
        resolution = next(s for s in sensors if s["type"] == "camera")["resolution"]
        return resolution["width"], resolution["height"]
    info = json.loads((src / "meta/info.json").read_text())["features"]["observation.images.front"]["info"]
    return info["video.width"], info["video.height"]


@pytest.mark.parametrize("mode", ["copy", "reencode"])
@pytest.mark.parametrize("source", sorted(SIZE_SOURCES))
def test_a_camera_file_of_another_size_is_refused_naming_file_and_sequence(tmp_path, source, mode):
    src = tmp_path / "src"
    path, frames, sequence = SIZE_SOURCES[source](src)
    width, height = _declared(src, source)
    with open(path, "wb") as handle:  # same frames and rate, half the declared size
        encode_frames(synthetic_frames(1, 0, frames, height // 2, width // 2), handle, fps=FPS, options=EncodeOptions("h264", crf=18))
    code, console = _convert(src, tmp_path / "out", f"--video={mode}")
    line = console.splitlines()[0]
    assert code == 1 and line.startswith("error: ") and path.name in line and sequence in line, console
    assert f"{width // 2}x{height // 2}" in line and f"{width}x{height}" in line, line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("mode", ["copy", "reencode"])
@pytest.mark.parametrize("source", sorted(SOURCES))
def test_a_variable_frame_rate_file_is_refused_naming_file_and_sequence_or_re_timed(tmp_path, source, mode):
    """Copy mode keeps the file's times: refused. A re-encode writes frame i at timestep i: faithful
    where the source maps frames to steps by index (ORTF, one file per episode), refused where
    it maps them by time (LeRobot: the episode's time range holds fewer frames than steps)."""
    src = tmp_path / "src"
    path, frames, sequence = SOURCES[source](src)
    _write_vfr(path, frames, *_declared(src, source))
    code, console = _convert(src, tmp_path / "out", f"--video={mode}")
    if source == "ortf" and mode == "reencode":
        assert code == 0, console
        dataset = open_dataset(str(tmp_path / "out"))
        assert all(len(dataset.frames(sid, "video_cam_wrist", 0, dataset.sequence(sid)["length"])) == dataset.sequence(sid)["length"]
                   for sid in dataset.sequence_ids())
        return
    line = console.splitlines()[0]
    assert code == 1 and line.startswith("error: ") and path.name in line and sequence in line, console
    if mode == "copy" and source == "ortf":  # LeRobot cuts by time: the cut holds fewer frames (refused before)
        assert "frame timing differs from the declared rate: frame 3 is presented at 0.2667 s, timestep 3 at 0.2 s (15 fps)" in line, line
    assert not (tmp_path / "out").exists()


def test_the_variable_frame_rate_file_reads_wrong_if_published(tmp_path):
    """Why it is refused: copied as it is, the reader finds fewer frames than steps."""
    from formats.video import iter_frames

    path = tmp_path / "vfr.mp4"
    _write_vfr(path, 7, 64, 48)
    assert sum(1 for _ in iter_frames(str(path), start=0, end=7 / FPS, fps=FPS)) < 7
