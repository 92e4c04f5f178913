"""End to end: RLDS -> Mixtrain through the CLI, without TensorFlow."""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from formats import video
from formats.sources.rlds.sample import SyntheticRLDS, write_dataset
from pipelines import validate

ROOT = pathlib.Path(__file__).resolve().parents[2]
BRIDGE = ROOT.parent / "shared" / "fixtures" / "rlds" / "bridge_dataset" / "1.0.0"


def _rows(dst):
    return pa.concat_tables([pq.read_table(p) for p in sorted((dst / "data").glob("*.parquet"))]).sort_by("sequence_id")


def _run_without_tensorflow(*args) -> subprocess.CompletedProcess:
    """The CLI in a fresh interpreter that reports whether TensorFlow got imported."""
    # TensorFlow is not installed here, so "not in sys.modules" alone proves little: a finder
    # first on sys.meta_path records every attempt to import it, in this process and the workers
    # (which inherit nothing: the runner below is in-process unless asked otherwise).
    script = (
        "import sys\n"
        "attempts = []\n"
        "class Spy:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'tensorflow' or name.startswith('tensorflow.'):\n"
        "            attempts.append(name)\n"
        "        return None\n"
        "sys.meta_path.insert(0, Spy())\n"
        "from pipelines import convert\n"
        "code = convert.run(sys.argv[1:])\n"
        "print('TENSORFLOW_IMPORTED' if attempts or 'tensorflow' in sys.modules else 'NO_TENSORFLOW', attempts)\n"
        "sys.exit(code)\n"
    )
    return subprocess.run([sys.executable, "-c", script, "--progress=off", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=600)


def test_bridge_both_splits_converts_without_tensorflow(tmp_path):
    if not BRIDGE.is_dir():
        pytest.skip(f"real fixture not found at {BRIDGE} (../shared/fixtures is absent in a plain clone)")
    dst = tmp_path / "bridge"
    done = _run_without_tensorflow(f"--input={BRIDGE}", f"--output={dst}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "NO_TENSORFLOW" in done.stdout
    assert validate.validate(str(dst)) == []
    rows = _rows(dst)
    assert rows.num_rows == 50 and rows.column("split").to_pylist().count("val") == 25
    assert rows.column("sequence_id").to_pylist()[0] == "train_00000_000000"
    assert set(rows.column("length").to_pylist()) == {10}
    for camera in range(4):
        for path in rows.column(f"video_image_{camera}").to_pylist()[:3]:
            info = video.probe(str(dst / path))
            assert (info.codec, info.frames, info.width, info.height) == ("h264", 10, 64, 64)
    findings, summary = validate.deep_check(str(dst))
    assert findings == []
    lines = {line.split(":")[0]: line for line in summary}
    assert sorted(lines) == [f"video_image_{camera}" for camera in range(4)]
    # docs/rlds.md: luma PSNR >= 41.7 dB at the defaults (measured: 41.79 dB on image_1, PyAV 18's
    # x264). image_3 holds frames the encode keeps exactly: every video pixel-identical, no PSNR printed.
    psnr = {name: float(line.split("PSNR ")[1].split(" dB")[0]) for name, line in lines.items() if name != "video_image_3"}
    assert min(psnr.values()) >= 41.7, psnr
    assert lines["video_image_3"] == "video_image_3: 50 videos, 500 frames, 50/50 pixel-identical"
    sidecar = json.loads((dst / "mixtrain.json").read_text())
    assert sidecar["column_types"]["video_image_0"]["source"] == "observation/image_0"
    assert sidecar["column_types"]["action"] == {"type": "trajectory", "dim": 7, "dtype": "float32", "source": "action",
                                                 "description": sidecar["column_types"]["action"]["description"]}
    assert sidecar["source"]["fps"] == 5.0


def test_written_dataset_two_workers_one_split(tmp_path):
    src = tmp_path / "synthetic_rlds" / "1.0.0"
    spec = SyntheticRLDS(depth_camera=True)
    truth = write_dataset(str(src), spec)
    dst = tmp_path / "out"
    done = _run_without_tensorflow(f"--input={src}", f"--output={dst}", "--fps=10", "--split=train", "--num_shards=2",
                                   "--direct_num_workers=2", "--direct_running_mode=multi_processing")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "NO_TENSORFLOW" in done.stdout
    assert validate.validate(str(dst)) == []
    rows = _rows(dst)
    # {split}_{shard position}_{record index}: 5 episodes over 3 shards as TFDS spreads them.
    assert rows.column("sequence_id").to_pylist() == ["train_00000_000000", "train_00000_000001", "train_00001_000000",
                                                      "train_00001_000001", "train_00002_000000"]
    assert rows.column("length").to_pylist() == list(spec.splits["train"])
    assert set(rows.column("split").to_pylist()) == {"train"}
    tasks = rows.column("task").to_pylist()
    assert tasks.count(None) == len(spec.varying_instruction_episodes)
    varying = rows.column("language_instruction").to_pylist()
    assert [v for v in varying if v is not None] == [truth["train"][3]["instructions"]]
    assert rows.column("truncated").to_pylist() == [number not in spec.terminal_episodes for number in range(5)]
    lengths = rows.column("length").to_pylist()
    for path, length in zip(rows.column("video_depth").to_pylist(), lengths):
        frames = [frame.to_ndarray() for frame in video.iter_frames(str(dst / path))]
        assert len(frames) == length and frames[0].dtype == np.uint16
    findings, _ = validate.deep_check(str(dst))
    assert findings == []
