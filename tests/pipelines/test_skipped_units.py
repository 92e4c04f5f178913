"""A source unit skipped whole (an RLDS shard that cannot be indexed) under --on_error=skip: its record
names the shard, the count says how many episodes went with it, and --incremental retries it."""

import json
import shutil

import pyarrow.parquet as pq

from formats.sources.rlds import tfrecord
from formats.sources.rlds.sample import SyntheticRLDS
from formats.sources.rlds.sample import write_dataset as write_rlds
from pipelines import convert

SHARD0 = "synthetic_rlds-train.tfrecord-00000-of-00002"


def _convert(src, dst, *extra):
    return convert.run([f"--input={src}", f"--output={dst}", "--progress=off", "--fps=10", "--on_error=skip", "--max_skipped=100%", *extra])


def _corrupt_mid_shard_header(path, record=2):
    """Flip the length checksum of a record's header: the records before it index fine, the shard does not."""
    data = bytearray(path.read_bytes())
    with open(path, "rb") as handle:
        offsets = list(tfrecord.scan(handle, len(data)))
    data[offsets[record][0] - 4] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_skipped_shard_is_named_counted_and_retried_by_incremental(tmp_path, capsys):
    src = tmp_path / "rlds" / "1.0.0"
    write_rlds(str(src), SyntheticRLDS(splits={"train": (3, 4, 5, 3, 4, 5, 3)}, shards={"train": 2}))  # shard 0: 4 episodes, shard 1: 3
    original = (src / SHARD0).read_bytes()
    _corrupt_mid_shard_header(src / SHARD0)
    dst = tmp_path / "out"
    # --max_skipped weighs the shard by its 4 episodes, not as one record
    assert convert.run([f"--input={src}", f"--output={dst}", "--progress=off", "--fps=10", "--on_error=skip"]) == convert.EXIT_FAILED
    assert f"error: {dst}: 4 of 7 sequences were skipped, more than --max_skipped=10%; nothing was published" in capsys.readouterr().err
    assert _convert(src, dst) == convert.EXIT_SKIPPED
    assert "converted 3 sequences" in (out := capsys.readouterr().out) and "skipped 4 bad sequence(s), listed in" in out
    records = [json.loads(line) for line in (dst / "_errors.jsonl").read_text().splitlines()]
    assert len(records) == 1 and records[0]["source_file"] == str(src / SHARD0) and records[0]["sequences"] == 4
    assert records[0]["stage"] == "index" and "train shard 0: record 2: length checksum mismatch" in records[0]["error"]
    assert json.loads((dst / "mixtrain.json").read_text())["num_skipped"] == 4
    assert SHARD0 not in json.loads((dst / "_fingerprints.json").read_text())["units"]  # not recorded as converted
    # Nothing changed: the failed shard is tried again (and fails again), never silently dropped.
    assert _convert(src, dst, "--incremental") == convert.EXIT_SKIPPED
    assert json.loads((dst / "mixtrain.json").read_text())["incremental"]["converted_units"] == 1
    # Repaired: the next incremental run converts its episodes and reuses the other shard's.
    (src / SHARD0).write_bytes(original)
    assert _convert(src, dst, "--incremental") == convert.EXIT_OK
    sidecar = json.loads((dst / "mixtrain.json").read_text())
    assert (sidecar["incremental"]["reused_sequences"], sidecar["incremental"]["converted_units"], sidecar["num_sequences"]) == (3, 1, 7)
    assert sorted(pq.read_table(dst / "data").column("sequence_id").to_pylist())[:4] == [f"train_00000_{i:06d}" for i in range(4)]


def test_a_shard_cut_at_a_record_boundary_is_named_too(tmp_path):
    src = tmp_path / "rlds" / "1.0.0"
    write_rlds(str(src), SyntheticRLDS(splits={"train": (3, 4, 5, 3)}, shards={"train": 2}))
    data = (src / SHARD0).read_bytes()
    with open(src / SHARD0, "rb") as handle:
        offsets = list(tfrecord.scan(handle, len(data)))
    (src / SHARD0).write_bytes(data[: offsets[1][0] - 12])  # record 1 gone whole: the framing is intact
    dst = tmp_path / "out"
    assert _convert(src, dst) == convert.EXIT_SKIPPED
    [record] = [json.loads(line) for line in (dst / "_errors.jsonl").read_text().splitlines()]
    assert record["source_file"] == str(src / SHARD0) and record["sequences"] == 2
    assert record["error"].endswith(f"{SHARD0}: 1 records, dataset_info.json shardLengths says 2")
    assert SHARD0 not in json.loads((dst / "_fingerprints.json").read_text())["units"]


def test_without_shard_lengths_the_summary_says_the_count_is_unknown(tmp_path, capsys):
    src = tmp_path / "rlds" / "1.0.0"
    write_rlds(str(src), SyntheticRLDS(splits={"train": (3, 4, 5, 3)}, shards={"train": 2}))
    info = json.loads((src / "dataset_info.json").read_text())
    info["splits"][0]["numShards"] = str(len(info["splits"][0].pop("shardLengths")))
    (src / "dataset_info.json").write_text(json.dumps(info))
    _corrupt_mid_shard_header(src / "synthetic_rlds-train.tfrecord-00001-of-00002", record=1)
    dst = tmp_path / "out"
    assert _convert(src, dst) == convert.EXIT_SKIPPED
    assert "skipped 1 unreadable source unit(s) whose sequences could not be counted, listed in" in capsys.readouterr().out
    sidecar = json.loads((dst / "mixtrain.json").read_text())
    assert sidecar["num_sequences"] == 2 and "num_skipped" not in sidecar and sidecar["num_skipped_units"] == 1
    [record] = [json.loads(line) for line in (dst / "_errors.jsonl").read_text().splitlines()]
    assert record["sequences"] is None and record["source_file"].endswith("tfrecord-00001-of-00002")
    shutil.rmtree(dst)
