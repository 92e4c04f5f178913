"""--table_format=lance storage: --incremental takes unchanged sequences' rows and blob videos from
the previous version (changed ones converted again, deleted ones gone, ONE new version, the
previous one still readable by number), and the rows are compressed while the blobs are not."""

from __future__ import annotations

import io

import numpy as np
import pytest

from formats.read.reader import open_dataset
from pipelines import conversion, validate
from tests.nightly import write_night

lance = pytest.importorskip("lance", reason="pylance is installed by setup.py's lance and test extras")


def _run(src, dst, *extra) -> str:
    out, console = io.StringIO(), io.StringIO()
    code = conversion.run([f"--input={src}", f"--output={dst}", "--progress=off", "--num_shards=2", *extra], out=out, console=console)
    assert code == 0, console.getvalue()
    return out.getvalue()


def _contents(dataset) -> dict:
    """sequence id -> (every non-video cell, as bytes where it is an array; each video's bytes)."""
    found = {}
    for sequence_id in dataset.sequence_ids():
        row = dataset.sequence(sequence_id)
        cells = {name: value.tobytes() if isinstance(value, np.ndarray) else value
                 for name, value in row.items() if name not in dataset.video_columns}
        videos = {}
        for column in dataset.video_columns:
            with dataset.video_file(sequence_id, column) as handle:
                videos[column] = handle.read()
        found[sequence_id] = (cells, videos)
    return found


@pytest.mark.parametrize("videos", ["blob", "reference"])
def test_incremental_lance_reuses_unchanged_sequences_and_commits_one_new_version(tmp_path, videos):
    src, dst = tmp_path / "src", tmp_path / "out"
    write_night(src, (6, 5, 7, 4))
    _run(src, dst, "--table_format=lance", f"--lance_videos={videos}")
    first = _contents(open_dataset(str(dst)))
    write_night(src, (6, 5, 8))  # episode 2 modified (longer), episode 3 deleted
    summary = _run(src, dst, "--table_format=lance", f"--lance_videos={videos}", "--incremental")
    reference = tmp_path / "reference"
    _run(src, reference)  # the standalone output of tonight's source, converted from scratch
    latest = open_dataset(str(dst))
    assert latest.version == 2 and len(lance.dataset(str(dst)).versions()) == 2
    assert latest.metadata["incremental"]["reused_sequences"] == 2 and latest.metadata["incremental"]["converted_units"] == 1
    assert "2 unchanged sequences reused" in summary.strip().splitlines()[-1]
    second = _contents(latest)
    assert second == _contents(open_dataset(str(reference)))  # exactly tonight's dataset, blobs = the standalone MP4s
    assert sorted(second) == sorted(first)[:3]  # episode 3 is gone
    unchanged = sorted(first)[:2]
    assert {k: second[k] for k in unchanged} == {k: first[k] for k in unchanged}  # rows and blobs byte for byte
    changed = sorted(first)[2]
    assert second[changed][0]["length"] == 8 and first[changed][0]["length"] == 7
    assert validate.validate(str(dst)) == []
    if videos == "blob":  # (files beside the dataset are the latest run's: docs/lance.md)
        assert _contents(open_dataset(str(dst), version=1)) == first  # the previous version, still readable by number
    else:
        assert sorted(open_dataset(str(dst), version=1).sequence_ids()) == sorted(first)


def test_incremental_lance_with_nothing_changed_reuses_everything(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "out"
    write_night(src, (5, 4))
    _run(src, dst, "--table_format=lance")
    before = _contents(open_dataset(str(dst)))
    _run(src, dst, "--table_format=lance", "--incremental")
    after = open_dataset(str(dst))
    assert after.version == 2 and after.metadata["incremental"] == {**after.metadata["incremental"], "reused_sequences": 2,
                                                                    "converted_units": 0}
    assert _contents(after) == before


def test_lance_rows_are_zstd_compressed_except_blobs_and_fixed_size_lists(tmp_path):
    """What lance_table writes: file version 2.2, zstd on leaves (a compressible binary column
    shrinks), blob columns verbatim (random MP4-like bytes take their full size and read back
    identical), fixed-size lists left as Lance stores them."""
    import pyarrow as pa

    from formats.mixtrain.tables import lance as lance_table

    rng = np.random.default_rng(0)
    videos = [rng.integers(0, 256, 20_000, dtype=np.uint8).tobytes() for _ in range(20)]
    cells = [bytes(8_000) for _ in range(20)]  # zeros: zstd shrinks them to almost nothing
    table = pa.table({"sequence_id": [f"e{i}" for i in range(20)], "action": pa.array(cells, pa.binary()),
                      "state": pa.array([[[1.0, 2.0]] * 10] * 20, pa.list_(pa.list_(pa.float32(), 2))),
                      "video_front": pa.array(videos, pa.large_binary())})
    schema = lance_table.lance_schema(table.schema, ["video_front"])
    assert schema.field("action").metadata == {b"lance-encoding:compression": b"zstd"}
    assert b"lance-encoding:compression" not in (schema.field("video_front").metadata or {})
    dst = tmp_path / "ds"
    lance.write_dataset(pa.Table.from_batches(table.to_batches(), schema), str(dst), data_storage_version=lance_table.FILE_VERSION)
    dataset = lance.dataset(str(dst))
    size = sum(p.stat().st_size for p in (dst / "data").rglob("*") if p.is_file())
    assert sum(map(len, videos)) <= size < sum(map(len, videos)) + sum(map(len, cells)) // 10
    assert [blob.readall() for blob in dataset.take_blobs("video_front", indices=list(range(20)))] == videos
    assert dataset.to_table(columns=["action"]).column(0).to_pylist() == cells
    assert {(f.file_major_version, f.file_minor_version) for fragment in dataset.get_fragments()
            for f in fragment.metadata.data_files()} == {(2, 2)}


def test_validate_deep_on_a_lance_dataset_passes_and_says_what_it_did_not_compare(tmp_path, capsys):
    """Plain validate said ok and --deep said "not a valid Mixtrain dataset" (exit 1)."""
    src, dst = tmp_path / "src", tmp_path / "lance"
    write_night(src, (4, 5))
    _run(src, dst, "--table_format=lance")
    capsys.readouterr()
    assert validate.main([str(dst), "--deep"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out == ["a Lance dataset: its structure is checked; --deep's frame-by-frame comparison with the source is made on "
                   "standalone (--table_format=parquet) datasets",
                   f"ok: {dst} is a valid Mixtrain dataset (deep: statistics and videos not compared with the source)"]
