"""formats.read.reader through gs:// against the GCS emulator: the same values, frames and windows as the local copy."""

from __future__ import annotations

import numpy as np
import pytest

from formats import storage
from formats.read import reader
from formats.sources.lerobot_v3.sample import SyntheticLeRobot, write_dataset
from pipelines import convert
from tests.pipelines.test_gcs import gcs  # noqa: F401  (the emulator fixture; skips when gcp-storage-emulator is absent)


@pytest.fixture(scope="module")
def local_dataset(tmp_path_factory):
    base = tmp_path_factory.mktemp("reader_gcs")
    write_dataset(str(base / "src"), SyntheticLeRobot(lengths=(12, 9, 15, 11), codec="h264", gop=None, episodes_per_video_file=2))
    assert convert.run([f"--input={base / 'src'}", f"--output={base / 'dst'}", "--progress=off", "--num_shards=2"]) == 0
    return base / "dst"


def test_gs_url_on_the_emulator(gcs, local_dataset):  # noqa: F811
    fs, root = storage.open_root("gs://bucket/reader/lerobot")
    fs.put(str(local_dataset), root, recursive=True)
    remote, local = reader.open_dataset("gs://bucket/reader/lerobot"), reader.open_dataset(str(local_dataset))
    assert remote.sequence_ids() == local.sequence_ids() and len(local.sequence_ids()) == 4
    drawer = [("task", "=", "Open the drawer.")]
    assert remote.sequence_ids(where=drawer) == local.sequence_ids(where=drawer) != []
    sequence_id = local.sequence_ids()[2]
    got, expected = remote.sequence(sequence_id), local.sequence(sequence_id)
    assert got["action"].tobytes() == expected["action"].tobytes() and got["action"].dtype == np.float32
    assert got["task"] == expected["task"] and got["timestamp"].tobytes() == expected["timestamp"].tobytes()
    frames = remote.frames(sequence_id, "video_wrist", 3, 9)
    assert frames.shape == (6, 48, 64, 3) and np.array_equal(frames, local.frames(sequence_id, "video_wrist", 3, 9))
    assert remote.video_url(sequence_id, "video_wrist") == f"gs://bucket/reader/lerobot/files/video_wrist/{sequence_id}.mp4"
    keys = [(w["sequence_id"], w["start"]) for w in remote.windows(4, 4, 4, seed=1)]
    assert keys == [(w["sequence_id"], w["start"]) for w in local.windows(4, 4, 4, seed=1)] and len(keys) == local.count_windows(4, 4, 4)
    assert remote.stats() == local.stats()
