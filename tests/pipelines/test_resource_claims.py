"""Sizes claimed by headers are checked before allocation (issue 27, item 4): a Parquet file whose
last 8 bytes claim a 4 GB footer (a sparse file: 4 GB long, a few kB on disk) is refused with one
line naming it, by every surface that reads Parquet (a source's data or episode index, a
published shard through the reader, validate and inspect), in well under 500 MB and seconds.
Before: pyarrow read the claimed 4 GB into memory first (3.9 GB peak RSS, 20 s)."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

import pytest

from formats.sources.lerobot_v3.sample import SyntheticLeRobot
from formats.sources.lerobot_v3.sample import write_dataset as write_lerobot
from formats.sources.ortf.sample import SyntheticORTF
from formats.sources.ortf.sample import write_dataset as write_ortf
from pipelines import convert
from tests.formats import h264_lies

ROOT = pathlib.Path(__file__).resolve().parents[2]
PEAK_LIMIT_MB = 500
# Runs a command line and reports its exit status, stderr and peak RSS (its own: no other child counts).
MEASURE = """
import json, resource, subprocess, sys
done = subprocess.run(sys.argv[1:], capture_output=True, text=True)
peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(json.dumps({"rc": done.returncode, "out": done.stdout, "err": done.stderr, "peak_mb": peak_mb}))
"""
READ = """
import sys
from formats.errors import FormatError
from formats.read import reader
try:
    dataset = reader.open_dataset(sys.argv[1])
    dataset.sequence(dataset.sequence_ids()[0])
except FormatError as error:
    print(f"error: {error}", file=sys.stderr)
    sys.exit(1)
"""


def _sparse_footer_claim(path: pathlib.Path, claimed: int = 4_000_000_000) -> None:
    """Replace `path` by a file `claimed` + 4 kB long (sparse: holes, nearly nothing on disk) whose
    tail says its footer is `claimed` bytes."""
    path.unlink()
    with open(path, "wb") as handle:
        handle.write(b"PAR1")
        handle.truncate(claimed + 4096 - 8)
        handle.seek(claimed + 4096 - 8)
        handle.write(claimed.to_bytes(4, "little") + b"PAR1")


def _measured(*command: str) -> dict:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", MEASURE, *command], capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    result = json.loads(done.stdout)
    result["seconds"] = time.monotonic() - started
    return result


def _one_line_naming(result: dict, path: pathlib.Path) -> None:
    assert result["rc"] == 1, result
    lines = result["err"].splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in result["err"], result["err"]
    assert errors[0].startswith(f"error: {path}: its Parquet footer claims 4,000,000,000 bytes, more than the 64 MiB"), errors[0]
    assert result["peak_mb"] < PEAK_LIMIT_MB and result["seconds"] < 60, result
    print(f"{path.name}: peak {result['peak_mb']:.0f} MB, {result['seconds']:.1f} s")


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    base = tmp_path_factory.mktemp("claims")
    write_lerobot(str(base / "src"), SyntheticLeRobot(lengths=(5, 4), codec="h264", gop=None, cameras=()))
    assert convert.run([f"--input={base / 'src'}", f"--output={base / 'dst'}", "--progress=off"]) == 0
    return base


SOURCES = {
    "lerobot_v3": (lambda root: write_lerobot(str(root), SyntheticLeRobot(lengths=(5, 4), cameras=())), "data/chunk-000/file-000.parquet"),
    "ortf_episodes": (lambda root: write_ortf(str(root), SyntheticORTF(lengths=(4, 5))), "meta/episodes.parquet"),
    "ortf_steps": (lambda root: write_ortf(str(root), SyntheticORTF(lengths=(4, 5))), "data/chunk-000/steps.parquet"),
}


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_a_source_parquet_claiming_a_4gb_footer_is_refused_cheaply(tmp_path, source):
    write, relative = SOURCES[source]
    write(tmp_path / "src")
    _sparse_footer_claim(tmp_path / "src" / relative)
    result = _measured(sys.executable, "-m", "pipelines.convert", f"--input={tmp_path / 'src'}", f"--output={tmp_path / 'dst'}",
                       "--progress=off")
    _one_line_naming(result, tmp_path / "src" / relative)
    assert not (tmp_path / "dst" / "mixtrain.json").exists()


@pytest.mark.parametrize("surface", ["reader", "validate", "inspect"])
def test_a_published_shard_claiming_a_4gb_footer_is_refused_cheaply(published, tmp_path, surface):
    copy = tmp_path / "copy"
    shutil.copytree(published / "dst", copy)
    shard = copy / "data/part-00000.parquet"
    _sparse_footer_claim(shard)
    command = {"reader": [sys.executable, "-c", READ, str(copy)], "validate": [sys.executable, "-m", "pipelines.validate", str(copy)],
               "inspect": [sys.executable, "-m", "pipelines.inspect", str(copy)]}[surface]
    result = _measured(*command)
    if surface == "validate":  # validate lists findings on stdout (the shard is one of them), their count on stderr
        result["err"] = "".join(f"error: {line}\n" for line in result["out"].splitlines() if "Parquet footer" in line)
    _one_line_naming(result, shard)


# --- MP4: the picture size its headers declare --------------------------------------------------

# (rewrite, what the one line says): an SPS the decoder would size 8000x8000 frames by (issue 27:
# 1.25 GB and 11 s to decode 30 frames, published as 8000x8000), a sample entry claiming it, and
# sizes within the limits that disagree between the two.
MP4_LIES = {
    "sps_8000": (lambda data: h264_lies.declare_sps_size(data, 8000, 8000),
                 "its H.264 sequence parameter set declares 8000x8000 pixels, more than this converter decodes"),
    "entry_8000": (lambda data: h264_lies.declare_entry_size(data, 8000, 8000),
                   "its MP4 sample entry declares 8000x8000 pixels, more than this converter decodes"),
    "sps_640": (lambda data: h264_lies.declare_sps_size(data, 640, 480),
                "its H.264 sequence parameter set declares 640x480 pixels, its MP4 sample entry 64x48: a damaged or forged header"),
    "entry_640": (lambda data: h264_lies.declare_entry_size(data, 640, 480),
                  "its H.264 sequence parameter set declares 64x48 pixels, its MP4 sample entry 640x480: a damaged or forged header"),
}
VIDEO_SOURCES = {
    "lerobot_v3": (lambda root: write_lerobot(str(root), SyntheticLeRobot(lengths=(5, 4), codec="h264", gop=None,
                                                                           cameras=("observation.images.front",))),
                   "videos/observation.images.front/chunk-000/file-000.mp4"),
    "ortf": (lambda root: write_ortf(str(root), SyntheticORTF(lengths=(4, 5))), "videos/cam_overhead/chunk-000/episode_000000.mp4"),
}


def _lie(path: pathlib.Path, lie: str) -> None:
    path.write_bytes(MP4_LIES[lie][0](path.read_bytes()))


@pytest.mark.parametrize("lie", sorted(MP4_LIES))
@pytest.mark.parametrize("source", sorted(VIDEO_SOURCES))
def test_a_source_video_declaring_another_size_is_refused_before_decoding(tmp_path, source, lie):
    write, relative = VIDEO_SOURCES[source]
    write(tmp_path / "src")
    _lie(tmp_path / "src" / relative, lie)
    result = _measured(sys.executable, "-m", "pipelines.convert", f"--input={tmp_path / 'src'}", f"--output={tmp_path / 'dst'}",
                       "--progress=off")
    assert result["rc"] == 1, result
    errors = [line for line in result["err"].splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in result["err"], result["err"]
    assert str(tmp_path / "src" / relative) in errors[0] and MP4_LIES[lie][1] in errors[0], errors[0]
    assert result["peak_mb"] < PEAK_LIMIT_MB and result["seconds"] < 60, result
    print(f"peak {result['peak_mb']:.0f} MB, {result['seconds']:.1f} s")
    assert not (tmp_path / "dst" / "mixtrain.json").exists()


@pytest.fixture(scope="module")
def published_video(tmp_path_factory):
    base = tmp_path_factory.mktemp("claims_video")
    write_lerobot(str(base / "src"), SyntheticLeRobot(lengths=(5, 4), codec="h264", gop=None, cameras=("observation.images.front",)))
    assert convert.run([f"--input={base / 'src'}", f"--output={base / 'dst'}", "--progress=off"]) == 0
    return base / "dst"


FRAMES = """
import sys
from formats.errors import FormatError
from formats.read import reader
try:
    dataset = reader.open_dataset(sys.argv[1])
    dataset.frames("episode_000000", "video_front")
except FormatError as error:
    print(f"error: {error}", file=sys.stderr)
    sys.exit(1)
"""


@pytest.mark.parametrize("surface", ["reader", "validate", "validate --deep", "inspect --html"])
@pytest.mark.parametrize("lie", ["sps_8000", "entry_640"])  # one over the limits, one disagreement (convert above takes all four)
def test_a_published_video_declaring_another_size_is_refused_before_decoding(published_video, tmp_path, surface, lie):
    copy = tmp_path / "copy"
    shutil.copytree(published_video, copy)
    video = copy / "files/video_front/episode_000000.mp4"
    _lie(video, lie)
    command = {"reader": [sys.executable, "-c", FRAMES, str(copy)],
               "validate": [sys.executable, "-m", "pipelines.validate", str(copy)],
               "validate --deep": [sys.executable, "-m", "pipelines.validate", str(copy), "--deep"],
               "inspect --html": [sys.executable, "-m", "pipelines.inspect", str(copy), f"--html={tmp_path / 'report.html'}"]}[surface]
    result = _measured(*command)
    assert result["peak_mb"] < PEAK_LIMIT_MB and result["seconds"] < 60, result
    print(f"peak {result['peak_mb']:.0f} MB, {result['seconds']:.1f} s")
    if surface == "inspect --html":  # the page is written, each thumbnail of that video saying why it is absent
        page = (tmp_path / "report.html").read_text()
        assert result["rc"] == 0 and page.count(MP4_LIES[lie][1]) == 3 and str(video) in page, result
        return
    assert result["rc"] == 1, result
    # validate lists findings on stdout (this video is one of them); the reader prints one error line
    lines = result["out"].splitlines() if surface.startswith("validate") else result["err"].splitlines()
    found = [line for line in lines if MP4_LIES[lie][1] in line]
    assert len(found) == 1 and str(video) in found[0] and "Traceback" not in result["err"], result
