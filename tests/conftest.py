"""Shared test fixtures: the real datasets in ../shared/fixtures and synthetic LeRobot datasets."""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import subprocess

# Before anything imports gcsfs, which reads this once, at import: its experimental GCS
# (zonal/hierarchical buckets) probes every bucket over gRPC, which the tests' GCS emulator does not
# speak. Set only in the fixtures that use the emulator, it came too late whenever an earlier test
# in the same process had imported gcsfs (the Dask, Dataflow and determinism tests): the Iceberg-on-
# GCS test then hung in the probe (tests/pipelines/test_lake_gcs.py after test_dask_runner.py).
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

import pytest  # noqa: E402

from formats.sources.lerobot_v3.sample import SyntheticLeRobot, write_dataset  # noqa: E402

os.environ.setdefault("SVT_LOG", "1")

SHARED_FIXTURES = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "fixtures"
SO100_TINY = SHARED_FIXTURES / "lerobot_v3" / "so100_tiny"


@pytest.fixture(scope="session")
def so100_tiny() -> pathlib.Path:
    """lerobot 0.4.4's own so100_tiny dataset (AV1, two cameras, 5 episodes)."""
    if not SO100_TINY.is_dir():
        pytest.skip(f"real fixture not found at {SO100_TINY} (../shared/fixtures is absent in a plain clone)")
    return SO100_TINY


@pytest.fixture(scope="session")
def shared_fixtures() -> pathlib.Path:
    """../shared/fixtures: the datasets other people's tools wrote."""
    if not SHARED_FIXTURES.is_dir():
        pytest.skip(f"real fixtures not found at {SHARED_FIXTURES} (../shared/fixtures is absent in a plain clone)")
    return SHARED_FIXTURES


@pytest.fixture(scope="session")
def sample_inputs(tmp_path_factory) -> dict:
    """Every bundled sample, small (formats.samples), and the options its conversion needs:
    {source id: (its folder, [options])}. Written once per test process; read, never changed."""
    from formats import samples

    folder = tmp_path_factory.mktemp("samples")
    written = {}
    for source_id, sample in sorted(samples.SAMPLES.items()):
        sample.small(str(folder / source_id / "1.0.0"))
        written[source_id] = (folder / source_id / "1.0.0", list(sample.convert_args))
    return written


@pytest.fixture
def writable_so100(tmp_path, so100_tiny) -> pathlib.Path:
    """A private, writable copy of so100_tiny for tests that corrupt it."""
    target = tmp_path / "so100_copy"
    shutil.copytree(so100_tiny, target)
    for file in target.rglob("*"):
        file.chmod(0o644 if file.is_file() else 0o755)
    return target


# Several data files, video files and chunk folders; H.264 with B-frames; a multi-task episode;
# per-step scalar, bool and float64 features.
MULTI_FILE_SPEC = SyntheticLeRobot(
    lengths=(20, 15, 33, 12, 9, 27, 14),
    codec="h264",
    gop=None,
    episodes_per_data_file=2,
    episodes_per_video_file=3,
    episodes_per_meta_file=3,
    chunks_size=2,
    multi_task_episodes=(1,),
    extra_step_features=True,
    splits={"train": "0:5", "val": "5:7"},
)


@pytest.fixture(scope="session")
def multi_file_dataset(tmp_path_factory):
    """(path, truth) of a synthetic LeRobot v3 dataset spread over many files and chunks."""
    root = tmp_path_factory.mktemp("lerobot_multi") / "ds"
    truth = write_dataset(str(root), MULTI_FILE_SPEC)
    return root, truth


@pytest.fixture(scope="session")
def hevc_dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("lerobot_hevc") / "ds"
    spec = SyntheticLeRobot(lengths=(16, 11, 20), codec="hevc", gop=None, episodes_per_video_file=2, cameras=("observation.images.top",))
    return root, write_dataset(str(root), spec)


def shared_lerobot(name: str) -> pathlib.Path:
    """A real LeRobot dataset under ../shared/fixtures/lerobot_v3 (skips with the reason when absent)."""
    path = SHARED_FIXTURES / "lerobot_v3" / name
    if not path.is_dir():
        pytest.skip(f"real fixture not found at {path} (../shared/fixtures is absent in a plain clone)")
    return path


@contextlib.contextmanager
def small_tmpfs(folder, size: str):
    """A tmpfs of `size` mounted at `folder` (needs root, as on this project's machines and CI; the
    test skips, saying so, where it cannot), unmounted afterwards."""
    folder.mkdir(exist_ok=True)
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({made.stderr.strip()}): the disk test needs root")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)
