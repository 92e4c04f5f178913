"""--array_layout=bytes and --table_format=lance on every source's fixtures: the same values, files and frames
as the standalone lists output, read back through formats.read.reader."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pyarrow.parquet as pq
import pytest

from formats.mixtrain.tables import lance as lance_table
from formats.read.reader import open_dataset
from pipelines import convert, validate

lance = pytest.importorskip("lance", reason="pylance is installed by setup.py's lance and test extras")

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT.parent / "shared" / "fixtures"
SOURCES = {
    "lerobot_v3": FIXTURES / "lerobot_v3" / "so100_tiny",
    "rlds": FIXTURES / "rlds" / "bridge_dataset" / "1.0.0",
    "l5kit": FIXTURES / "l5kit" / "single_scene.zarr",
    "ortf": None,  # written by formats.sources.ortf.sample
}


def _convert(src, dst, *extra) -> None:
    assert convert.run([f"--input={src}", f"--output={dst}", "--progress=off", "--num_shards=2", *extra]) == 0


@pytest.fixture(scope="module", params=sorted(SOURCES))
def outputs(request, tmp_path_factory):
    """(standalone lists, standalone bytes, lance) outputs of one source."""
    work = tmp_path_factory.mktemp(request.param)
    src = SOURCES[request.param]
    if src is None:
        from formats.sources.ortf.sample import write_dataset
        src = work / "source"
        write_dataset(str(src))
    elif not src.exists():
        pytest.skip(f"real fixture not found at {src} (../shared/fixtures is absent in a plain clone)")
    _convert(src, work / "lists")
    _convert(src, work / "bytes", "--array_layout=bytes")
    _convert(src, work / "lance", "--table_format=lance")
    return work / "lists", work / "bytes", work / "lance"


def _same(left, right) -> bool:
    if isinstance(left, np.ndarray):
        return isinstance(right, np.ndarray) and left.dtype == right.dtype and left.shape == right.shape and left.tobytes() == right.tobytes()
    return left == right


def test_bytes_layout_round_trips_every_trajectory_bit_for_bit_and_keeps_validate_and_stats(outputs):
    lists, raw, _ = outputs
    a, b = open_dataset(str(lists)), open_dataset(str(raw))
    trajectories = a.columns("trajectory")
    assert trajectories and b.columns("trajectory") == trajectories
    for name in trajectories:
        entry = b.column_types[name]
        assert entry["layout"] == "bytes" and entry["byte_order"] == "little" and entry["cell_shape"] == [-1, entry["dim"]]
        assert {k: v for k, v in entry.items() if k not in ("layout", "byte_order", "cell_shape")} == a.column_types[name]  # shape, names kept
        assert pq.read_schema(next((raw / "data").glob("*.parquet"))).field(name).type == "binary"
    ids = a.sequence_ids()
    assert ids == b.sequence_ids()
    for sequence_id in ids:
        left, right = a.trajectories(sequence_id), b.trajectories(sequence_id)
        assert list(left) == list(right) == trajectories
        for name in trajectories:
            assert _same(left[name], right[name]), (sequence_id, name)
            assert right[name].shape[1] == a.column_types[name]["dim"]
        full_left, full_right = a.sequence(sequence_id), b.sequence(sequence_id)  # every other column too
        assert all(_same(full_left[k], full_right[k]) for k in full_left)
    assert validate.validate(str(lists)) == [] and validate.validate(str(raw)) == []
    assert json.loads((lists / "stats.json").read_text()) == json.loads((raw / "stats.json").read_text())


def test_bytes_layout_cell_is_a_view_of_the_read_buffer(outputs):
    _, raw, _ = outputs
    dataset = open_dataset(str(raw))
    array = dataset.trajectories(dataset.sequence_ids()[0])[dataset.columns("trajectory")[0]]
    assert array.base is not None and not array.flags.owndata  # np.frombuffer over Arrow's buffer, no copy


def test_validate_finds_a_bytes_cell_that_does_not_match_length(outputs, tmp_path):
    _, raw, _ = outputs
    import shutil

    import pyarrow as pa
    broken = tmp_path / "broken"
    shutil.copytree(raw, broken)
    shard = next(p for p in sorted((broken / "data").glob("*.parquet")) if pq.read_metadata(p).num_rows)
    table = pq.read_table(shard)
    name = open_dataset(str(raw)).columns("trajectory")[0]
    cells = table.column(name).to_pylist()
    cells[0] = cells[0][:-1]  # one byte short: not a whole number of steps
    table = table.set_column(table.schema.get_field_index(name), name, pa.array(cells, pa.binary()))
    pq.write_table(table, shard)
    findings = validate.validate(str(broken))
    sequence_id = table.column("sequence_id")[0].as_py()
    assert any(f"{sequence_id}: column {name!r} has -1 steps" in finding for finding in findings), findings


def test_lance_rows_equal_the_standalone_output_and_blobs_are_the_mp4_files(outputs):
    lists, _, lance_root = outputs
    a, b = open_dataset(str(lists)), open_dataset(str(lance_root))
    assert not (lance_root / "mixtrain.json").exists() and lance_table.is_dataset(b.fs, b.root)
    assert b.metadata["table_format"] == "lance" and b.metadata["num_sequences"] == a.metadata["num_sequences"]
    assert {k: {x: y for x, y in v.items() if x != "stored_as"} for k, v in b.column_types.items()} == a.column_types
    assert b.stats() == json.loads((lists / "stats.json").read_text())
    assert b.schema.names == a.schema.names
    ids = a.sequence_ids()
    assert b.sequence_ids() == ids
    dataset = lance.dataset(str(lance_root))
    ids_in_rows = dataset.to_table(columns=["sequence_id"]).column(0).to_pylist()
    for sequence_id in ids:
        left, right = a.sequence(sequence_id), b.sequence(sequence_id)
        for name in left:
            if name in a.video_columns:
                continue
            assert _same(left[name], right[name]), (sequence_id, name)
        for column in a.video_columns:
            relative = left[column]
            if relative is None:
                assert right[column] is None
                continue
            standalone = (lists / relative).read_bytes()
            blob = dataset.take_blobs(column, indices=[ids_in_rows.index(sequence_id)])[0]
            assert blob.read() == standalone  # verbatim, through Lance's own API
            with b.video_file(sequence_id, column) as handle:
                assert handle.read() == standalone
    if a.video_columns:  # decoding the blob gives the standalone file's frames
        sequence_id, column = ids[0], a.video_columns[0]
        assert np.array_equal(a.frames(sequence_id, column), b.frames(sequence_id, column))


def test_lance_files_that_are_not_videos_stay_files_beside_the_dataset(outputs):
    lists, _, lance_root = outputs
    standalone = {p.relative_to(lists) for p in (lists / "files").rglob("*") if p.is_file()}
    videos = set(open_dataset(str(lists)).video_columns)
    kept = {p.relative_to(lance_root) for p in (lance_root / "files").rglob("*") if p.is_file()} if (lance_root / "files").exists() else set()
    assert kept == {p for p in standalone if p.parts[1] not in videos}


def test_every_lance_run_is_a_new_version_and_old_versions_stay_readable(tmp_path):
    from formats.sources.ortf.sample import SyntheticORTF, write_dataset
    first, second, dst = tmp_path / "a", tmp_path / "b", tmp_path / "out"
    write_dataset(str(first), SyntheticORTF(lengths=(12, 9), failed_episodes=()))
    write_dataset(str(second), SyntheticORTF(lengths=(12, 9, 15), failed_episodes=()))
    _convert(first, dst, "--table_format=lance")
    assert convert.run([f"--input={second}", f"--output={dst}", "--progress=off", "--table_format=lance"]) == 1  # not without --overwrite
    assert convert.run([f"--input={second}", f"--output={dst}", "--progress=off", "--overwrite"]) == 1  # not as Parquet over it
    _convert(second, dst, "--table_format=lance", "--overwrite")
    assert len(open_dataset(str(dst))) == 3 and open_dataset(str(dst)).version == 2
    old = open_dataset(str(dst), version=1)
    assert len(old) == 2 and len(old.sequence_ids()) == 2
    sequence_id, column = old.sequence_ids()[0], old.video_columns[0]
    assert old.frames(sequence_id, column).shape[0] == old.sequence(sequence_id)["length"]
    lance.dataset(str(dst), version=1).restore()  # rollback: version 1's rows become version 3
    assert open_dataset(str(dst)).version == 3 and len(open_dataset(str(dst))) == 2


# Only the sources whose fixtures have cameras and sequences of different lengths (L5Kit has no
# camera; every bridge episode is 10 steps): elsewhere the case cannot be made, and a skip there
# was taken on every run.
@pytest.mark.parametrize("outputs", ["lerobot_v3", "ortf"], indirect=True)
def test_validate_checks_a_lance_dataset_and_finds_a_video_of_the_wrong_length(outputs, tmp_path):
    lists, _, lance_root = outputs
    assert validate.validate(str(lance_root)) == []
    dataset = open_dataset(str(lance_root))
    assert dataset.video_columns
    column = dataset.video_columns[0]
    rows = lance.dataset(str(lance_root))
    plain = [f.name for f in rows.schema if f.name not in dataset.video_columns]
    table = rows.to_table(columns=plain)
    lengths = table.column("length").to_pylist()
    others = [i for i, n in enumerate(lengths) if n != lengths[0]]
    assert others, lengths
    first, other = 0, others[0]
    blobs = [None if b is None else b.read() for b in rows.take_blobs(column, indices=list(range(len(lengths))))]
    blobs[first] = blobs[other]  # another sequence's video: its frame count is not this row's length
    import pyarrow as pa
    for name in dataset.video_columns:
        cells = blobs if name == column else [None if b is None else b.read() for b in rows.take_blobs(name, indices=list(range(len(lengths))))]
        table = table.append_column(pa.field(name, pa.large_binary(), metadata=lance_table.BLOB_METADATA), pa.array(cells, pa.large_binary()))
    table = table.replace_schema_metadata(rows.schema.metadata)
    broken = tmp_path / "broken"
    lance.write_dataset(table, str(broken))
    sequence_id = table.column("sequence_id")[first].as_py()
    assert f"{sequence_id}: {column} has {lengths[other]} frames, length is {lengths[first]}" in "\n".join(validate.validate(str(broken)))


def test_lance_with_video_references_keeps_the_files_and_reads_the_same_frames(tmp_path):
    from formats.sources.ortf.sample import SyntheticORTF, write_dataset
    src = tmp_path / "src"
    write_dataset(str(src), SyntheticORTF(lengths=(12, 9), failed_episodes=()))
    _convert(src, tmp_path / "lists")
    _convert(src, tmp_path / "ref", "--table_format=lance", "--lance_videos=reference")
    a, b = open_dataset(str(tmp_path / "lists")), open_dataset(str(tmp_path / "ref"))
    assert "stored_as" not in b.column_types[a.video_columns[0]]
    assert lance.dataset(str(tmp_path / "ref")).schema.field(a.video_columns[0]).type == "string"
    for sequence_id in a.sequence_ids():
        for column in a.video_columns:
            relative = a.sequence(sequence_id)[column]
            assert b.sequence(sequence_id)[column] == relative
            assert (tmp_path / "ref" / relative).read_bytes() == (tmp_path / "lists" / relative).read_bytes()
    assert np.array_equal(a.frames(a.sequence_ids()[0], a.video_columns[0]), b.frames(a.sequence_ids()[0], a.video_columns[0]))
    assert validate.validate(str(tmp_path / "ref")) == []
    assert convert.run([f"--input={src}", f"--output={tmp_path / 'x'}", "--progress=off", "--lance_videos=blob"]) == convert.EXIT_USAGE


def test_lance_fragments_are_written_by_the_shard_writers_and_committed_as_one_version(tmp_path, monkeypatch):
    from formats.mixtrain import tables
    from formats.sources.ortf.sample import SyntheticORTF, write_dataset
    src = tmp_path / "src"
    write_dataset(str(src), SyntheticORTF(lengths=(12, 9, 15, 7), failed_episodes=()))
    callers = []
    original = lance_table._write_fragments

    def spy(fs, staging, shard, blobs):
        import inspect
        callers.append((inspect.stack()[1].function, shard))
        return original(fs, staging, shard, blobs)

    monkeypatch.setattr(lance_table, "_write_fragments", spy)
    _convert(src, tmp_path / "out", "--table_format=lance")  # --num_shards=2
    assert sorted(callers) == [("stage_shard", "data/part-00000.parquet"), ("stage_shard", "data/part-00001.parquet")]
    dataset = lance.dataset(str(tmp_path / "out"))
    assert dataset.version == 1 and len(dataset.get_fragments()) == 2 and dataset.count_rows() == 4
    tables.stage_shard(None, "/nowhere", "data/part-00000.parquet", [], tables.TableSettings())  # parquet: no shard step


def test_incremental_reuses_bytes_rows_unchanged_and_a_layout_change_converts_again(tmp_path):
    from formats.sources.ortf.sample import SyntheticORTF, write_dataset
    src, dst = tmp_path / "src", tmp_path / "out"
    write_dataset(str(src), SyntheticORTF(lengths=(12, 9, 15), failed_episodes=()))
    _convert(src, dst, "--array_layout=bytes")
    before = {p.name: p.read_bytes() for p in (dst / "data").glob("*.parquet")}
    _convert(src, dst, "--array_layout=bytes", "--incremental")
    assert json.loads((dst / "mixtrain.json").read_text())["incremental"]["reused_sequences"] == 3
    assert {p.name: p.read_bytes() for p in (dst / "data").glob("*.parquet")} == before
    _convert(src, dst, "--incremental")  # lists now: the rows' types changed, nothing is reused
    sidecar = json.loads((dst / "mixtrain.json").read_text())
    assert sidecar["incremental"]["reused_sequences"] == 0 and "layout" not in sidecar["column_types"]["action"]
