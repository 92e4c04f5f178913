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
from pipelines import convert, validate

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


# --- ArrayRecord shards (TFDS file_format=array_record) ----------------------------------------------

def _published(dst: pathlib.Path) -> dict[str, bytes]:
    return {str(path.relative_to(dst)): path.read_bytes() for path in sorted(dst.rglob("*")) if path.is_file()}


def assert_same_output_whatever_the_container(tfrecord_out: pathlib.Path, array_record_out: pathlib.Path) -> None:
    """Byte-identical outputs, but for what names the input: mixtrain.json's `source.uri` (the input
    folder), `source.file_format` (the container it was read from) and `created_at` (the clock), and
    _fingerprints.json's unit keys (the shard file names) and fingerprints (they hash each shard
    file's name and signature, which is their job: a changed source file must reconvert its unit).
    Its context (options, converter, schema) and unit prefixes are the same."""
    left, right = _published(tfrecord_out), _published(array_record_out)
    assert sorted(left) == sorted(right)
    differing = sorted(name for name in left if left[name] != right[name])
    assert differing == ["_fingerprints.json", "mixtrain.json"], differing
    assert any(name.endswith(".mp4") for name in left) and any(name.startswith("data/") for name in left)
    sidecars = [json.loads(side["mixtrain.json"]) for side in (left, right)]
    assert [s["source"]["file_format"] for s in sidecars] == ["tfrecord", "array_record"]
    for sidecar in sidecars:
        del sidecar["source"]["file_format"], sidecar["source"]["uri"], sidecar["created_at"]
    assert sidecars[0] == sidecars[1]
    prints = [json.loads(side["_fingerprints.json"]) for side in (left, right)]
    assert prints[0]["context"] == prints[1]["context"]
    assert [(key.replace(".tfrecord-", ".array_record-"), unit["prefix"]) for key, unit in prints[0]["units"].items()] == \
        [(key, unit["prefix"]) for key, unit in prints[1]["units"].items()]


def test_the_same_dataset_in_tfrecord_and_array_record_converts_to_the_same_bytes(tmp_path):
    outputs = {}
    for file_format in ("tfrecord", "array_record"):
        src = tmp_path / file_format / "synthetic_rlds" / "1.0.0"
        write_dataset(str(src), SyntheticRLDS(file_format=file_format, splits={"train": (5, 4, 3), "val": (3,)},
                                              shards={"train": 2, "val": 1}, depth_camera=True, width=32, height=24))
        outputs[file_format] = tmp_path / f"out_{file_format}"
        if file_format == "array_record":  # and without TensorFlow, array_record's reader included
            done = _run_without_tensorflow(f"--input={src}", f"--output={outputs[file_format]}", "--fps=10")
            assert done.returncode == 0 and "NO_TENSORFLOW" in done.stdout, done.stderr[-2000:]
        else:
            assert convert.run([f"--input={src}", f"--output={outputs[file_format]}", "--fps=10", "--progress=off"]) == convert.EXIT_OK
    assert_same_output_whatever_the_container(outputs["tfrecord"], outputs["array_record"])
    rows = _rows(outputs["array_record"])
    assert rows.column("length").to_pylist() == [5, 4, 3, 3]


def test_bridge_rewritten_as_array_record_converts_to_the_same_bytes(tmp_path):
    from tests.formats.test_rlds_arrayrecord import bridge_as_array_record

    if not BRIDGE.is_dir():
        pytest.skip(f"real fixture not found at {BRIDGE} (../shared/fixtures is absent in a plain clone)")
    src = bridge_as_array_record(tmp_path / "bridge_dataset" / "1.0.0")
    for name, root in (("tfrecord", BRIDGE), ("array_record", src)):
        assert convert.run([f"--input={root}", f"--output={tmp_path / name}", "--split=val", "--progress=off"]) == convert.EXIT_OK
    assert_same_output_whatever_the_container(tmp_path / "tfrecord", tmp_path / "array_record")
    assert _rows(tmp_path / "array_record").num_rows == 25


def _array_record_copy(tmp_path) -> pathlib.Path:
    src = tmp_path / "synthetic_rlds" / "1.0.0"
    write_dataset(str(src), SyntheticRLDS(file_format="array_record", splits={"train": (3, 4)}, shards={"train": 1}))
    return src


SHARD = "synthetic_rlds-train.array_record-00000-of-00001"


def _lengths(src, value):
    info = json.loads((src / "dataset_info.json").read_text())
    info["splits"][0]["shardLengths"] = [value]
    (src / "dataset_info.json").write_text(json.dumps(info))


def _rewrite(change):
    def edit(src):
        shard = src / SHARD
        shard.write_bytes(change(shard.read_bytes()))
    return edit


def _flip(at):
    def change(data):
        data = bytearray(data)
        data[at] ^= 0xFF
        return bytes(data)
    return change


@pytest.mark.parametrize("corrupt, message", [
    (lambda src: _lengths(src, "3"), f"{SHARD}: 2 records, dataset_info.json shardLengths says 3"),
    (_rewrite(lambda data: data[:-10]), f"{SHARD}: train shard 0: not a readable ArrayRecord file: Invalid Riegeli/records file: "
                                        "chunk boundary is {size} but block header at 65536 implies a different previous chunk "
                                        "boundary: 65536; at byte 65560; Failed to read RiegeliPostscript"),
    (_rewrite(_flip(300)), f"{SHARD}: train_00000_000000: record 0: Corrupted Riegeli/records file: chunk data hash mismatch"),
    (lambda src: (src / SHARD).unlink(), f"{SHARD}: shard 0 of split 'train' not found "
                                         "(from filepathTemplate '{{DATASET}}-{{SPLIT}}.{{FILEFORMAT}}-{{SHARD_X_OF_Y}}')"),
], ids=["shard_lengths_disagree", "truncated", "flipped_byte_in_an_episode", "missing_shard"])
def test_hostile_array_record_shards_end_in_one_error_line(tmp_path, capsys, corrupt, message):
    src = _array_record_copy(tmp_path)
    size = (src / SHARD).stat().st_size
    corrupt(src)
    status = convert.run([f"--input={src}", f"--output={tmp_path / 'out'}", "--fps=10", "--progress=off"])
    lines = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert status == convert.EXIT_FAILED and len(errors) == 1, lines
    assert "Traceback" not in "\n".join(lines)
    # {size}: where array_record looks for the postscript, 64 KiB before the end of the cut file
    assert errors[0].startswith(f"error: {src}/{message.format(size=size - 10 - 65536)}"), errors[0]
    assert not (tmp_path / "out").exists()
