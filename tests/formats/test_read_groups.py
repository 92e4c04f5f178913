"""Read groups: refs loaded one after another by one reader decode their shared source data once
(LeRobot and ORTF row groups, L5Kit zarr chunks), and every sequence is the one an episode read
alone gives (values, lengths, timestamps), in order, out of order, sorted key or not."""

from __future__ import annotations

import collections
import dataclasses
import glob

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from formats import storage
from formats.errors import FormatError
from formats.sources import l5kit, lerobot_v3, ortf, parquet_rows
from formats.sources.l5kit import sample as l5kit_sample
from formats.sources.l5kit import zarr_v2
from formats.sources.lerobot_v3.sample import SyntheticLeRobot, write_dataset
from formats.sources.ortf import sample as ortf_sample

LENGTHS = [7 + (13 * i) % 23 for i in range(24)]  # 7..29 steps, 12 episodes per data file


class _ParquetReads:
    """Counts row groups decoded through pyarrow (read_row_group(s) / iter_batches), by file, and
    the decoding calls (`calls`: the row groups each one decoded)."""

    def __init__(self, monkeypatch):
        self.groups: list[tuple[str, int]] = []
        self.calls: list[list[int]] = []
        reads = self

        def opened(source, where=None, **options):
            parquet = pq.ParquetFile(source, page_checksum_verification=True, **options)
            name = source if isinstance(source, str) else getattr(source, "path", getattr(source, "name", "?"))
            read_row_group, read_row_groups, iter_batches = parquet.read_row_group, parquet.read_row_groups, parquet.iter_batches

            def read_one(group, *args, **kwargs):
                reads.groups.append((str(name), group))
                reads.calls.append([group])
                return read_row_group(group, *args, **kwargs)

            def read_some(groups, *args, **kwargs):
                reads.groups.extend((str(name), group) for group in groups)
                reads.calls.append(list(groups))
                return read_row_groups(groups, *args, **kwargs)

            def batches(*args, row_groups=None, **kwargs):
                reads.groups.extend((str(name), group) for group in row_groups)
                reads.calls.append(list(row_groups))
                return iter_batches(*args, row_groups=row_groups, **kwargs)

            parquet.read_row_group, parquet.read_row_groups, parquet.iter_batches = read_one, read_some, batches
            return parquet

        monkeypatch.setattr(storage, "parquet_file", opened)


def _lerobot(tmp_path, rewrite: str | None = None, **spec):
    """A 2-file LeRobot dataset; `rewrite`: data files rewritten with shuffled rows (key not sorted)."""
    truth = write_dataset(str(tmp_path / "ds"), SyntheticLeRobot(lengths=LENGTHS, cameras=(), episodes_per_data_file=12,
                                                                 extra_step_features=True, multi_task_episodes=(3, 14), **spec))
    if rewrite == "shuffled":
        for path in glob.glob(str(tmp_path / "ds/data/*/*.parquet")):
            table = pq.read_table(path)
            pq.write_table(table.take(np.random.default_rng(7).permutation(table.num_rows)), path, row_group_size=50)
    fs, root = storage.open_root(str(tmp_path / "ds"))
    meta, refs = lerobot_v3.plan(fs, root)
    return fs, root, meta, refs, truth


def _same(a, b) -> None:
    """Two Sequences hold the same values, dtypes and lengths."""
    assert (a.sequence_id, a.length) == (b.sequence_id, b.length)
    assert a.timestamp.dtype == b.timestamp.dtype and a.timestamp.tobytes() == b.timestamp.tobytes()
    assert a.scalars == b.scalars
    assert a.trajectories.keys() == b.trajectories.keys() and a.steps.keys() == b.steps.keys()
    for name in a.trajectories:
        assert a.trajectories[name].dtype == b.trajectories[name].dtype
        assert a.trajectories[name].shape == b.trajectories[name].shape
        assert a.trajectories[name].tobytes() == b.trajectories[name].tobytes()
    for name in a.steps:
        left, right = a.steps[name], b.steps[name]
        if isinstance(left, np.ndarray):
            assert left.dtype == right.dtype and left.tobytes() == right.tobytes()
        else:
            assert left.type == right.type and left.to_pylist() == right.to_pylist()
    assert a.videos == b.videos and a.files == b.files


def _check_lerobot_truth(sequence, truth, fps=30) -> None:
    i = sequence.scalars["episode_index"]
    assert sequence.length == LENGTHS[i]
    assert sequence.trajectories["obs_state"].tobytes() == truth["state"][i].tobytes()
    assert sequence.trajectories["action"].tobytes() == truth["action"][i].tobytes()
    np.testing.assert_array_equal(sequence.trajectories["obs_sensor"], truth["sensor"][i])
    np.testing.assert_array_equal(sequence.steps["next_reward"], truth["reward"][i])
    np.testing.assert_array_equal(sequence.timestamp, (np.arange(LENGTHS[i]) / fps).astype(np.float32).astype(np.float64))


@pytest.mark.parametrize("layout", ["one_group_per_file", "groups_cutting_episodes", "one_group_per_episode", "shuffled"])
def test_lerobot_group_in_order_decodes_each_row_group_once_and_gives_the_alone_values(tmp_path, monkeypatch, layout):
    spec = {"one_group_per_file": {"data_row_group_rows": 10_000}, "groups_cutting_episodes": {"data_row_group_rows": 23},
            "one_group_per_episode": {}, "shuffled": {}}[layout]
    fs, root, meta, refs, truth = _lerobot(tmp_path, "shuffled" if layout == "shuffled" else None, **spec)
    alone = [lerobot_v3.Reader(fs, root, meta).load(ref) for ref in refs]  # each episode by a fresh reader
    reads = _ParquetReads(monkeypatch)
    reader = lerobot_v3.Reader(fs, root, meta)
    loaded = [reader.load(ref) for ref in refs]  # plan order: read groups one after another
    for sequence, single in zip(loaded, alone):
        _same(sequence, single)
        _check_lerobot_truth(sequence, truth)
    files = sorted(glob.glob(str(tmp_path / "ds/data/*/*.parquet")))
    every_group = sorted((path, group) for path in files for group in range(pq.ParquetFile(path).metadata.num_row_groups))
    assert sorted(reads.groups) == every_group  # each row group of each file decoded exactly once
    if layout == "one_group_per_episode":  # a file's first episode, then the other 11 in one decode
        assert [len(call) for call in reads.calls] == [1, 11, 1, 11]
    # Whatever the row groups: a data file's episodes are one read group (12 per file here).
    assert [ref.read_group for ref in refs] == [f"data/chunk-000/file-00{i // 12}.parquet" for i in range(24)]


def test_lerobot_episodes_spanning_two_row_groups_load_whole_alone_and_out_of_order(tmp_path):
    fs, root, meta, refs, truth = _lerobot(tmp_path, data_row_group_rows=23)
    starts = np.cumsum([0] + LENGTHS[:12])  # file 0: rows of episode i are starts[i]..starts[i+1]
    assert {ref.read_group for ref in refs[:12]} == {"data/chunk-000/file-000.parquet"}
    spanning = [ref for ref in refs[:12] if starts[ref.episode_index] // 23 != (starts[ref.episode_index + 1] - 1) // 23]
    assert spanning  # the layout does cut episodes
    reader = lerobot_v3.Reader(fs, root, meta)
    for ref in spanning:  # alone, out of order: each still whole
        _check_lerobot_truth(reader.load(ref), truth)


def test_lerobot_refs_out_of_order_and_a_cache_miss_give_the_same_sequences(tmp_path):
    fs, root, meta, refs, truth = _lerobot(tmp_path, data_row_group_rows=23)
    reader = lerobot_v3.Reader(fs, root, meta)
    order = np.random.default_rng(3).permutation(len(refs)).tolist() + list(range(len(refs)))[::-1]
    for position in order:
        _check_lerobot_truth(reader.load(refs[position]), truth)


def test_lerobot_episode_inside_the_kept_row_group_reads_nothing_more(tmp_path, monkeypatch):
    fs, root, meta, refs, truth = _lerobot(tmp_path, data_row_group_rows=10_000)
    reads = _ParquetReads(monkeypatch)
    reader = lerobot_v3.Reader(fs, root, meta)
    reader.load(refs[0])
    assert len(reads.groups) == 1
    for ref in refs[1:12]:
        _check_lerobot_truth(reader.load(ref), truth)
    assert len(reads.groups) == 1  # the other 11 episodes of the file were cut out of the kept row group


def test_lerobot_long_row_groups_are_still_decoded_in_batches(tmp_path, monkeypatch):
    fs, root, meta, refs, truth = _lerobot(tmp_path, data_row_group_rows=10_000)
    monkeypatch.setattr(parquet_rows, "READ_BATCH_ROWS", 16)  # every row group is "long" now
    batch_sizes = []
    real = pq.ParquetFile.iter_batches

    def iter_batches(self, batch_size=65536, **kwargs):
        batch_sizes.append(batch_size)
        return real(self, batch_size=batch_size, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", iter_batches)
    reader = lerobot_v3.Reader(fs, root, meta)
    for ref in refs:
        _check_lerobot_truth(reader.load(ref), truth)
    assert batch_sizes == [16, 16]  # one decode per data file, batch by batch


def test_lerobot_unsorted_rows_are_filtered_not_sliced(tmp_path):
    fs, root, meta, refs, truth = _lerobot(tmp_path, "shuffled")
    assert {ref.read_group for ref in refs[:12]} == {"data/chunk-000/file-000.parquet"}
    reader = lerobot_v3.Reader(fs, root, meta)
    for ref in refs:
        _check_lerobot_truth(reader.load(ref), truth)


def test_lerobot_fixture_read_groups_and_fingerprints(so100_tiny):
    fs, root = storage.open_root(str(so100_tiny))
    meta, refs = lerobot_v3.plan(fs, root)
    # lerobot's writer: one row group per episode; the file's episodes still travel as one batch.
    assert [ref.read_group for ref in refs] == ["data/chunk-000/file-000.parquet"] * 5


def test_lerobot_offsets_past_the_file_still_name_the_episode_with_a_kept_row_group(tmp_path):
    fs, root, meta, refs, _ = _lerobot(tmp_path, data_row_group_rows=10_000)
    reader = lerobot_v3.Reader(fs, root, meta)
    reader.load(refs[10])
    last = refs[11]  # the last episode of the first data file, its rows in the kept row group
    bad = dataclasses.replace(last, to_index=last.to_index + 3, length=last.length + 3)
    with pytest.raises(FormatError, match=rf"data/chunk-000/file-000.parquet: episode_000011: episode 11: offsets index "
                                          rf"{bad.from_index}..{bad.to_index} point past the data file \({last.length} of "
                                          rf"{bad.length} rows found\)"):
        reader.load(bad)


# --- ORTF -----------------------------------------------------------------------------------------


def _ortf(tmp_path, rewrite: str | None = None):
    truth = ortf_sample.write_dataset(str(tmp_path / "ortf"), ortf_sample.SyntheticORTF(
        lengths=(20, 31, 25, 36, 30, 24, 35, 29), episodes_per_chunk=4, cameras=("cam_wrist",), depth_format=None, audio=False))
    for path in glob.glob(str(tmp_path / "ortf/data/*/steps.parquet")):
        table = pq.read_table(path)
        if rewrite == "one_group":
            pq.write_table(table, path, row_group_size=table.num_rows)
        elif rewrite == "shuffled":
            pq.write_table(table.take(np.random.default_rng(5).permutation(table.num_rows)), path, row_group_size=40)
    fs, root = storage.open_root(str(tmp_path / "ortf"))
    meta, refs = ortf.plan(fs, root)
    return fs, root, meta, refs, truth


@pytest.mark.parametrize("rewrite", [None, "one_group", "shuffled"])
def test_ortf_group_in_order_decodes_each_row_group_once_and_gives_the_alone_values(tmp_path, monkeypatch, rewrite):
    fs, root, meta, refs, truth = _ortf(tmp_path, rewrite)
    alone = [ortf.Reader(fs, root, meta).load(ref) for ref in refs]
    reads = _ParquetReads(monkeypatch)
    reader = ortf.Reader(fs, root, meta)
    loaded = [reader.load(ref) for ref in refs]
    for sequence, single, episode in zip(loaded, alone, truth["episodes"]):
        _same(sequence, single)
        assert sequence.length == episode["length"]
        assert sequence.trajectories["action"].tobytes() == episode["action"].tobytes()
        np.testing.assert_array_equal(sequence.timestamp, episode["timestamp"] - episode["timestamp"][0])
    files = sorted(glob.glob(str(tmp_path / "ortf/data/*/steps.parquet")))
    decoded = collections.Counter(reads.groups)
    assert set(decoded.values()) == {1}  # no row group decoded twice
    assert sorted(decoded) == sorted((path, group) for path in files for group in range(pq.ParquetFile(path).metadata.num_row_groups))
    if rewrite == "one_group":
        assert [ref.read_group for ref in refs] == [f"data/chunk-00{i // 4}/steps.parquet" for i in range(8)]
    # Out of order, with the cache missing every time it can: the same sequences.
    backwards = ortf.Reader(fs, root, meta)
    for ref, single in list(zip(refs, alone))[::-1]:
        _same(backwards.load(ref), single)


# --- L5Kit ----------------------------------------------------------------------------------------


def test_l5kit_scenes_in_order_decode_each_chunk_once(tmp_path, monkeypatch):
    spec = l5kit_sample.SyntheticL5Kit(scene_lengths=(30, 45, 12, 50, 8, 40, 33), frames_chunk=32, agents_chunk=60, faces_chunk=25)
    l5kit_sample.write_dataset(str(tmp_path / "l5"), spec)
    fs, root = storage.open_root(str(tmp_path / "l5"))
    meta, refs = l5kit.plan(fs, root)
    starts = np.cumsum([0, *spec.scene_lengths])
    assert [ref.read_group for ref in refs] == [f"frames#{start // 32}" for start in starts[:-1]]
    alone = [l5kit.Reader(fs, root, meta).load(ref) for ref in refs]
    fetched = []
    real = zarr_v2.ZarrArray._fetch

    def fetch(self, index):
        fetched.append((self.path.rsplit("/", 1)[-1], index))
        return real(self, index)

    monkeypatch.setattr(zarr_v2.ZarrArray, "_fetch", fetch)
    reader = l5kit.Reader(fs, root, meta)
    for ref, single in zip(refs, alone):
        sequence = reader.load(ref)
        assert sequence.sequence_id == single.sequence_id and sequence.length == single.length
        assert sequence.timestamp.tobytes() == single.timestamp.tobytes()
        for name in single.trajectories:
            assert sequence.trajectories[name].tobytes() == single.trajectories[name].tobytes()
        for name in ("agents", "traffic_light_faces", "timestamp_ns"):
            left, right = sequence.steps[name], single.steps[name]
            assert (left.to_pylist() == right.to_pylist()) if isinstance(left, pa.Array) else left.tobytes() == right.tobytes()
    counts = collections.Counter(fetched)
    assert set(counts.values()) == {1}  # every chunk of every array decoded once
    arrays = {name: zarr_v2.ZarrArray(fs, f"{root}/{name}") for name in ("frames", "agents", "traffic_light_faces")}
    assert {(name, index) for name, array in arrays.items() for index in range(array.chunk_count)} <= set(counts)


@dataclasses.dataclass
class _RowGroupMeta:
    num_rows: int
    total_byte_size: int


class _Footer:
    """What DecodedRowGroups reads of a Parquet footer: row groups' rows and (uncompressed) bytes."""

    def __init__(self, rows: list[int], nbytes: int = 1000):
        self._groups = [_RowGroupMeta(count, nbytes) for count in rows]
        self.num_row_groups = len(rows)

    def row_group(self, index: int):
        return self._groups[index]


def _decoding(calls: list[list[int]]):
    def decode(groups):
        calls.append(list(groups))
        return {group: f"g{group}" for group in groups}
    return decode


def test_decoded_row_groups_keep_only_what_the_last_episode_needed():
    decoded, calls = parquet_rows.DecodedRowGroups(), []
    decode = _decoding(calls)
    footer = _Footer([parquet_rows.READ_BATCH_ROWS + 1] * 3)  # long row groups: nothing is read ahead
    assert decoded.get("a", footer, ["x"], [0], decode) == ["g0"]
    assert decoded.get("a", footer, ["x"], [0, 1], decode) == ["g0", "g1"]
    assert decoded.get("a", footer, ["x"], [1], decode) == ["g1"]
    assert decoded.get("a", footer, ["x"], [0], decode) == ["g0"]  # 0 was dropped when only 1 was needed
    assert decoded.get("a", _Footer([5000] * 3), ["x"], [0], decode) == ["g0"]  # another footer: the file re-read
    assert decoded.get("b", footer, ["x"], [0], decode) == ["g0"]
    assert decoded.get("b", footer, ["y"], [0], decode) == ["g0"]  # other columns
    assert calls == [[0], [1], [0], [0], [0], [0]]


def test_decoded_row_groups_read_ahead_only_forward_and_within_one_batch():
    """Reading forward, the next small row groups come in the same decode, up to READ_BATCH_ROWS
    rows in all; kept until an episode past them is read; out of order, nothing ahead."""
    decoded, calls = parquet_rows.DecodedRowGroups(), []
    decode = _decoding(calls)
    footer = _Footer([1000] * 10)
    assert decoded.get("a", footer, None, [0], decode) == ["g0"]  # a file's first read: nothing ahead
    assert decoded.get("a", footer, None, [1], decode) == ["g1"]  # forward: 1, with 2, 3 and 4 ahead (4,000 rows)
    assert sorted(decoded._groups) == [1] and sorted(decoded._ahead) == [2, 3, 4]
    assert decoded.get("a", footer, None, [2], decode) == ["g2"]
    assert decoded.get("a", footer, None, [3], decode) == ["g3"]
    assert sorted(decoded._groups) == [3] and sorted(decoded._ahead) == [4]  # what was read before is let go
    assert decoded.get("a", footer, None, [4, 5], decode) == ["g4", "g5"]  # forward again: 6, 7 and 8 ahead
    assert decoded.get("a", footer, None, [2], decode) == ["g2"]  # backward: nothing ahead
    assert calls == [[0], [1, 2, 3, 4], [5, 6, 7, 8], [2]]
    jumping, calls[:] = parquet_rows.DecodedRowGroups(), []
    for group in (0, 5, 2, 3):  # a jump forward is not reading forward; 2 then 3 is
        assert jumping.get("a", footer, None, [group], decode) == [f"g{group}"]
    assert calls == [[0], [5], [2], [3, 4, 5, 6]]  # 5 was let go when 2 came: kept only what was read ahead


def test_decoded_row_groups_hold_one_episodes_groups_and_one_batch_whatever_the_order():
    """Episodes read backwards (or in any order but the file's) keep only their own row groups:
    what was kept above the current one was never let go, and a file read from its end came to
    hold every row group."""
    decoded, calls = parquet_rows.DecodedRowGroups(), []
    decode = _decoding(calls)
    footer = _Footer([1000] * 200)
    for group in range(199, -1, -1):
        assert decoded.get("a", footer, None, [group], decode) == [f"g{group}"]
        assert len(decoded._groups) + len(decoded._ahead) == 1
    orders = {"shuffled": np.random.default_rng(5).permutation(200).tolist(),
              "pairs down the file, each read upwards": [group for pair in range(99, -1, -1) for group in (2 * pair, 2 * pair + 1)]}
    for order in orders.values():
        for group in order:
            decoded.get("a", footer, None, [group], decode)
            assert len(decoded._groups) == 1 and len(decoded._ahead) <= 3  # one batch: 4,096 rows in all


def test_a_row_group_run_whose_rows_disagree_with_the_footer_is_refused(tmp_path, monkeypatch):
    """Runs of row groups are cut apart by the footer's row counts: a decode that returns another
    number of rows would shift every episode after it, so it is refused."""
    path = str(tmp_path / "f.parquet")
    pq.write_table(pa.table({"k": np.arange(30, dtype=np.int64)}), path, row_group_size=10)
    fs, _ = storage.open_root(str(tmp_path))
    metadata = pq.ParquetFile(path).metadata
    assert [table.column("k").to_pylist() for table in parquet_rows.read_row_groups(fs, path, metadata, [0, 1, 2]).values()] == \
        [list(range(0, 10)), list(range(10, 20)), list(range(20, 30))]
    real = pq.ParquetFile.read_row_groups
    monkeypatch.setattr(pq.ParquetFile, "read_row_groups", lambda self, groups, **kw: real(self, groups, **kw).slice(1))
    with pytest.raises(FormatError, match=r"f.parquet: row groups 0..2 hold 29 rows, not the 30 the footer counts"):
        parquet_rows.read_row_groups(fs, path, metadata, [0, 1, 2])
    assert parquet_rows.READ_BATCH_ROWS == 4096


def test_decoded_row_groups_read_ahead_within_the_byte_budget(monkeypatch):
    decoded, calls = parquet_rows.DecodedRowGroups(), []
    decode = _decoding(calls)
    footer = _Footer([10] * 8, nbytes=3 << 20)  # few rows, many bytes: 8 MiB holds two
    for group in range(8):
        assert decoded.get("a", footer, None, [group], decode) == [f"g{group}"]
    assert calls == [[0], [1, 2], [3, 4], [5, 6], [7]]


def test_lerobot_one_row_group_per_episode_opens_each_data_file_once(tmp_path, monkeypatch):
    """lerobot writes a row group per episode: the file stays open across its episodes instead of
    being opened again for each (which cost more than decoding the episode)."""
    fs, root, meta, refs, truth = _lerobot(tmp_path)
    opened = []
    original = storage.parquet_file

    def counting(source, where=None, **options):
        if options.get("metadata") is not None:  # a decode's open (footers are read without one)
            opened.append(str(source))
        return original(source, where, **options)

    monkeypatch.setattr(storage, "parquet_file", counting)
    reader = lerobot_v3.Reader(fs, root, meta)
    for ref in refs:
        _check_lerobot_truth(reader.load(ref), truth)
    assert len(opened) == 2 and len(set(opened)) == 2  # two data files, one open each
    reader.load(refs[0])  # back to the first file: opened again, the second closed
    assert len(opened) == 3 and opened[2] == opened[0]


@pytest.mark.parametrize("seed", range(6))
def test_row_groups_holding_by_binary_search_matches_the_scan(tmp_path, seed):
    """Ascending statistics are searched, anything else scanned: the same row groups either way."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 9, size=40)
    keys = np.repeat(np.arange(len(sizes)), sizes) if seed % 2 else np.sort(rng.integers(0, 60, size=int(sizes.sum())))
    if seed == 4:
        keys = rng.permutation(keys)  # not ascending: scanned
    path = str(tmp_path / "f.parquet")
    pq.write_table(pa.table({"k": keys.astype(np.int64)}), path, row_group_size=int(rng.integers(3, 12)))
    fs, _ = storage.open_root(str(tmp_path))
    footers = storage.ParquetFooters(fs)
    ranges = parquet_rows.key_ranges(footers, path, "k")
    assert (parquet_rows._sorted_bounds(footers, path, "k") is None) == (seed == 4)
    for low in range(-2, 62, 3):
        for high in (low, low + 1, low + 7):
            scanned = [group for group, bounds in enumerate(ranges) if parquet_rows._holds(bounds, low, high)]
            assert parquet_rows.row_groups_holding(footers, path, "k", low, high) == scanned
    assert parquet_rows.row_groups_holding(footers, path, "k", "a", "b") == list(range(len(ranges)))  # keys of another kind
