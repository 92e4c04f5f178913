"""The shard writer streams: rows spilled per worker, read back in id order, row groups by size."""

import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from formats import mixtrain, storage
from formats.errors import FormatError
from formats.mixtrain.stats import ColumnStats, table_stats
from formats.sequence import SCALAR, ColumnSpec, Sequence, base_columns
from transforms import write


def _columns():
    return base_columns() + [ColumnSpec.trajectory("action", np.float32, 16, source="action"),
                             ColumnSpec.steps("reward", pa.float32(), source="reward"),
                             ColumnSpec("task", SCALAR, pa.string())]


def _sequence(i: int, length: int) -> Sequence:
    rng = np.random.default_rng(i)
    return Sequence(sequence_id=f"s{i:03d}", length=length, timestamp=np.arange(length) / 10.0,
                    scalars={"length": length, "duration_seconds": length / 10.0, "task": f"t{i % 3}"},
                    trajectories={"action": rng.normal(size=(length, 16)).astype(np.float32)},
                    steps={"reward": rng.random(length).astype(np.float32)},
                    extra_stats={"video.cam": ColumnStats.of(np.full((4, 3), float(i)))})


def _spill_and_write(tmp_path, sequences, monkeypatch, spill_bytes: int, group_bytes: int):
    monkeypatch.setattr(write, "SPILL_BYTES", spill_bytes)
    monkeypatch.setattr(mixtrain, "ROW_GROUP_BYTES", group_bytes)
    staging = storage.url_for(*storage.open_root(str(tmp_path / "staging")))
    spill = write._SpillRowsFn(staging, _columns(), num_shards=1)
    spill.setup()
    records = []
    for bundle in (sequences[::2], sequences[1::2]):  # two bundles, as two workers would give
        spill.start_bundle()
        for sequence in bundle:
            records += list(spill.process(sequence))
        records += [wv.value for wv in spill.finish_bundle()]
    shard = write._WriteShardFn(staging, _columns())
    shard.setup()
    [result] = list(shard.process((0, [spilled for _, spilled in records])))
    return records, result, tmp_path / "staging" / mixtrain.shard_path(0)


def test_rows_come_back_in_id_order_with_row_groups_by_size(tmp_path, monkeypatch):
    sequences = [_sequence(i, n) for i, n in enumerate([300, 5, 1200, 40, 800, 77, 600])]
    records, result, path = _spill_and_write(tmp_path, sequences, monkeypatch, spill_bytes=60_000, group_bytes=100_000)
    spill_files = {spilled.path for _, spilled in records}
    assert len(spill_files) == len(records) > 2  # a record per file  # the buffer spilled mid-bundle, not only at bundle ends
    table = pq.read_table(path)
    assert table.column("sequence_id").to_pylist() == sorted(s.sequence_id for s in sequences)
    by_id = {s.sequence_id: s for s in sequences}
    for row, sequence_id in enumerate(table.column("sequence_id").to_pylist()):
        cell = table.column("action")[row].values.flatten().to_numpy().reshape(-1, 16)
        assert np.array_equal(cell, by_id[sequence_id].trajectories["action"])
    metadata = pq.ParquetFile(path).metadata
    sizes = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
    assert sum(sizes) == 7 and 1 < len(sizes) < 7  # closed by size, several rows in some groups
    assert result.rows == 7 and result.timesteps == sum(s.length for s in sequences)
    every = np.concatenate([s.trajectories["action"] for s in sequences]).astype(np.float64)
    np.testing.assert_allclose(result.stats["action"].mean, every.mean(0), rtol=1e-12)
    np.testing.assert_array_equal(result.stats["action"].max, every.max(0))
    assert result.stats["video.cam"].count == 28  # upstream statistics ride along with the row


def test_float_leaves_are_not_dictionary_encoded(tmp_path, monkeypatch):
    _, _, path = _spill_and_write(tmp_path, [_sequence(i, 50) for i in range(3)], monkeypatch, 1 << 20, 1 << 20)
    metadata = pq.ParquetFile(path).metadata.row_group(0)
    encodings = {metadata.column(i).path_in_schema: metadata.column(i).encodings for i in range(metadata.num_columns)}
    assert "RLE_DICTIONARY" not in encodings["action.list.element.list.element"]
    assert "RLE_DICTIONARY" not in encodings["timestamp.list.element"]
    assert "RLE_DICTIONARY" in encodings["task"] and "RLE_DICTIONARY" in encodings["sequence_id"]


def test_published_output_has_no_spill_files(tmp_path, multi_file_dataset):
    from pipelines import convert

    source, _ = multi_file_dataset
    assert convert.run([f"--input={source}", f"--output={tmp_path / 'out'}", "--progress=off"]) == 0
    assert not list((tmp_path / "out").rglob(write.SPILL_DIR))
    assert not list((tmp_path / "out").rglob("*.arrow"))


def test_long_inputs_are_summarised_in_blocks_exactly():
    values = np.random.default_rng(3).normal(size=(50_000, 4)).astype(np.float32)
    stats = ColumnStats.of(values)
    exact = values.astype(np.float64)
    np.testing.assert_allclose(stats.mean, exact.mean(0), rtol=1e-10)
    np.testing.assert_allclose(np.sqrt(stats.m2 / stats.count), exact.std(0), rtol=1e-10)
    assert stats.count == 50_000 and np.array_equal(stats.min, exact.min(0))
    q50 = stats.quantiles()["q50"]
    ranks = (exact < q50).mean(0)
    assert np.all(np.abs(ranks - 0.5) < 0.01)


def test_spill_files_stay_large_however_many_shards(tmp_path, monkeypatch):
    """Buffers are per shard: 4 shards do not turn every spill into 4 small files."""
    monkeypatch.setattr(write, "SPILL_BYTES", 100_000)
    staging = storage.url_for(*storage.open_root(str(tmp_path / "staging")))
    spill = write._SpillRowsFn(staging, _columns(), num_shards=4)
    spill.setup()
    spill.start_bundle()
    sequences = [_sequence(i, 60) for i in range(200)]
    records = [record for sequence in sequences for record in spill.process(sequence)]
    records += [wv.value for wv in spill.finish_bundle()]
    total = sum(write._approximate_bytes(s) for s in sequences)
    files = {spilled.path for _, spilled in records}
    assert sum(len(spilled.rows()) for _, spilled in records) == 200 and {shard for shard, _ in records} == {0, 1, 2, 3}
    assert len(files) <= total // write.SPILL_BYTES + 4  # one partial file per shard at most


def test_null_numeric_step_cells_are_left_out_of_statistics():
    sequences = [_sequence(0, 5), _sequence(1, 7)]
    sequences[1].steps["reward"] = None  # a row without this column (a null cell)
    stats = table_stats(mixtrain.sequences_to_table(sequences, _columns()), _columns())
    assert stats["reward"].count == 5


def test_spill_files_hold_rows_in_id_order_in_batches_of_a_few_rows(tmp_path, monkeypatch):
    """A row group takes a range of each spill file's ids, read a batch (<= SPILL_BATCH_ROWS rows or
    SPILL_BATCH_BYTES) at a time; a row past SPILL_BATCH_BYTES is a batch of its own."""
    monkeypatch.setattr(write, "SPILL_BATCH_ROWS", 4)
    monkeypatch.setattr(write, "SPILL_BATCH_BYTES", 40_000)
    lengths = [5] * 9 + [900] + [5] * 3  # s009: 900 x 16 float32 = 57.6 kB, more than a batch holds
    sequences = [_sequence(i, n) for i, n in enumerate(lengths)][::-1]  # arriving in reverse id order
    records, result, path = _spill_and_write(tmp_path, sequences, monkeypatch, spill_bytes=1 << 30, group_bytes=2_000)
    for _, spilled in records:
        assert list(spilled.sequence_ids) == sorted(spilled.sequence_ids)
        with pa.OSFile(spilled.path) as source:
            reader = pa.ipc.open_file(source)
            batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
        ends = list(np.cumsum([batch.num_rows for batch in batches]))
        assert list(spilled.batch_ends) == ends and max(batch.num_rows for batch in batches) <= 4
        assert [batch.column("sequence_id").to_pylist() for batch in batches if "s009" in batch.column("sequence_id").to_pylist()] \
            in ([], [["s009"]])
    table = pq.read_table(path)
    assert table.column("sequence_id").to_pylist() == [f"s{i:03d}" for i in range(len(lengths))]
    assert table.column("length").to_pylist() == lengths
    assert pq.ParquetFile(path).metadata.num_row_groups > 2  # groups cut across the files' batches


def test_a_spilled_row_that_holds_another_sequence_is_refused(tmp_path, monkeypatch):
    """The staging is checked as it is read back: a spill file damaged or swapped under the run."""
    monkeypatch.setattr(write, "SPILL_BYTES", 1 << 30)
    staging = storage.url_for(*storage.open_root(str(tmp_path / "staging")))
    spill = write._SpillRowsFn(staging, _columns(), num_shards=1)
    spill.setup()
    spill.start_bundle()
    for sequence in [_sequence(i, 5) for i in range(3)]:
        assert not list(spill.process(sequence))
    [(_, spilled)] = [wv.value for wv in spill.finish_bundle()]
    lying = write.SpilledFile(spilled.path, ("s000", "s001", "s005"), spilled.nbytes, spilled.extra_stats, spilled.video_notes,
                              spilled.batch_ends)
    shard = write._WriteShardFn(staging, _columns())
    shard.setup()
    with pytest.raises(FormatError, match=re.escape(f"the spilled row of s005 in {spilled.path} holds another sequence (damaged staging)")):
        list(shard.process((0, [lying])))


def _checked_write(tmp_path, bundles, on_error="fail", spill_checks=True):
    from formats.mixtrain import quality

    checks = write.Checks(10.0, quality.Thresholds())
    staging = storage.url_for(*storage.open_root(str(tmp_path / "staging")))
    spill = write._SpillRowsFn(staging, _columns(), num_shards=1, checks=checks if spill_checks else None)
    spill.setup()
    records = []
    for bundle in bundles:
        spill.start_bundle()
        for sequence in bundle:
            records += list(spill.process(sequence))
        records += [wv.value for wv in spill.finish_bundle()]
    shard = write._WriteShardFn(staging, _columns(), on_error, checks=checks)
    shard.setup()
    [result] = list(shard.process((0, [spilled for _, spilled in records])))
    return records, result, checks


def test_quality_checks_ride_with_the_spill_files_and_equal_the_writers_own(tmp_path):
    """The converting workers check the rows they spill (the shard writer, the run's tail, only
    merges): the same findings as the shard writer checking every row itself (a resumption's rows)."""
    from formats.mixtrain import quality

    sequences = [_sequence(i, n) for i, n in enumerate([30, 5, 1, 40, 80, 7, 60])]
    sequences[3].trajectories["action"][4, 2] = np.nan
    records, result, checks = _checked_write(tmp_path / "a", (sequences[::2], sequences[1::2]))
    assert all(spilled.quality is not None for _, spilled in records)
    header, findings = quality.finish(result.quality, _columns(), checks.thresholds)
    assert [(f["check"], f["sequence_id"]) for f in findings if f["check"] in ("non_finite", "short")] == [
        ("non_finite", "s003"), ("short", "s002")]
    records, own, _ = _checked_write(tmp_path / "b", (sequences[::2], sequences[1::2]), spill_checks=False)
    assert all(spilled.quality is None for _, spilled in records)
    assert quality.finish(own.quality, _columns(), checks.thresholds) == (header, findings)



def test_a_shard_that_drops_duplicate_ids_checks_only_what_it_writes(tmp_path):
    """Two spill files holding the same id, skipped (every copy): no finding names it."""
    from formats.mixtrain import quality

    first, second = _sequence(1, 20), _sequence(1, 20)
    first.trajectories["action"][3, 0] = np.nan
    _, result, checks = _checked_write(tmp_path, ([first, _sequence(2, 20)], [second]), on_error="skip")
    header, findings = quality.finish(result.quality, _columns(), checks.thresholds)
    assert result.rows == 1 and header["sequences"] == 1
    assert [f["sequence_id"] for f in findings if f["sequence_id"]] == []
