"""The source dataset as a nightly sync leaves it, for the tests of repeated --incremental runs."""

from __future__ import annotations

import pathlib
import shutil
import tempfile

from formats.sources.lerobot_v3.sample import SyntheticLeRobot, write_dataset


def write_night(src: pathlib.Path, lengths, seed: int = 1) -> None:
    """The source as it is tonight: a LeRobot dataset of one H.264 camera whose episodes have
    `lengths`; files whose bytes did not change keep their mtime (as a sync tool leaves them), so
    --incremental sees which episodes changed."""
    fresh = pathlib.Path(tempfile.mkdtemp(dir=src.parent)) / "ds"
    write_dataset(str(fresh), SyntheticLeRobot(lengths=lengths, codec="h264", gop=None, episodes_per_video_file=1,
                                               episodes_per_data_file=1, cameras=("observation.images.front",), seed=seed))
    for path in sorted(src.rglob("*"), reverse=True) if src.exists() else []:
        if not (fresh / path.relative_to(src)).exists():
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    for path in sorted(fresh.rglob("*")):
        target = src / path.relative_to(fresh)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        elif not target.exists() or target.read_bytes() != path.read_bytes():
            shutil.copyfile(path, target)
    shutil.rmtree(fresh.parent)
