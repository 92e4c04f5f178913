"""Lake outputs (--table_format=iceberg|delta): what the table gives back equals the standalone
output, row for row, file for file; every run is a snapshot; a killed run changes nothing."""

from __future__ import annotations

import glob
import importlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from formats.mixtrain.tables import TableSettings, lake
from formats.sources.lerobot_v3.sample import SyntheticLeRobot
from formats.sources.lerobot_v3.sample import write_dataset as write_lerobot
from formats.sources.ortf.sample import SyntheticORTF
from formats.sources.ortf.sample import write_dataset as write_ortf
from pipelines import convert, validate
from tests.nightly import write_night

pytest.importorskip("pyiceberg")
pytest.importorskip("deltalake")

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT.parent / "shared" / "fixtures"
FORMATS = ("iceberg", "delta")
# Keys of the sidecar that say where files are or when the run was: the lake's are relative to the
# table location, and `table` names the format and run.
LOCATION_KEYS = {"created_at", "stats", "shards", "errors", "quality", "table"}


def _without_location(sidecar: dict) -> dict:
    """The sidecar without what differs by table format on purpose (LOCATION_KEYS, the --table_format option)."""
    options = {k: v for k, v in sidecar["converter"]["options"].items() if k != "table_format"}
    return {**{k: v for k, v in sidecar.items() if k not in LOCATION_KEYS}, "converter": {**sidecar["converter"], "options": options}}


def _convert(src, dst, *extra):
    return convert.run([f"--input={src}", f"--output={dst}", "--progress=off", *extra])


def _standalone_rows(dst) -> pa.Table:
    return pa.concat_tables([pq.read_table(p) for p in sorted((dst / "data").glob("part-*.parquet"))]).sort_by("sequence_id")


def _lake_rows(dst, table_format, version=None) -> pa.Table:
    return lake.read_rows(f"file://{dst}", TableSettings(format=table_format), version).sort_by("sequence_id")


def _duckdb():
    """DuckDB with the iceberg, avro and delta extensions of the pinned PyPI wheels (no download)."""
    duckdb = pytest.importorskip("duckdb")
    import tempfile

    connection = duckdb.connect(config={"extension_directory": tempfile.mkdtemp(), "autoinstall_known_extensions": "false",
                                        "autoload_known_extensions": "false"})
    for name in ("avro", "iceberg", "delta"):
        try:
            module = importlib.import_module(f"duckdb_extension_{name}")
        except ImportError:
            pytest.skip(f"duckdb-extension-{name} is not installed (pip install -e '.[test]')")
        binary = glob.glob(os.path.join(os.path.dirname(module.__file__), "extensions", "*", f"{name}.duckdb_extension"))[0]
        connection.execute(f"LOAD '{binary}'")
    return connection


def _duckdb_rows(dst, table_format) -> pa.Table:
    connection = _duckdb()
    if table_format == "iceberg":
        from formats.mixtrain.tables import iceberg

        metadata = iceberg.open_table(f"file://{dst}").metadata_location.removeprefix("file://")  # the catalog's current one
        query = f"SELECT * FROM iceberg_scan('{metadata}')"
    else:
        query = f"SELECT * FROM delta_scan('file://{dst}')"
    return connection.execute(query).fetch_arrow_table().sort_by("sequence_id")


def _file_columns(sidecar: dict) -> list[str]:
    return [name for name, entry in sidecar["column_types"].items() if entry.get("type") == "video" or entry.get("file_reference")]


def _strip_run(value, run: str):
    prefix = lake.run_prefix(run)
    if isinstance(value, str):
        assert value.startswith("runs/"), value  # relative to the table location
        return value[len(value.split("/files/", 1)[0]) + 1:]
    if isinstance(value, list):
        return [_strip_run(v, run) for v in value]
    assert prefix
    return value


def _assert_same_dataset(standalone, lake_dst, table_format, rows: pa.Table):
    """Rows value for value (trajectories as arrays), property == sidecar, referenced files identical."""
    sidecar = json.loads((standalone / "mixtrain.json").read_text())
    expected = _standalone_rows(standalone)
    assert rows.num_rows == expected.num_rows and sorted(rows.column_names) == sorted(expected.column_names)
    files = _file_columns(sidecar)
    prop = lake.current_property(f"file://{lake_dst}", TableSettings(format=table_format))
    run = prop["table"]["run"]
    for name in expected.column_names:
        got = rows.column(name).to_pylist()
        if name in files:
            for value, original in zip(got, expected.column(name).to_pylist()):
                if value is None:
                    assert original is None
                    continue
                assert _strip_run(value, run) == original
                for lake_path, path in zip([value] if isinstance(value, str) else value, [original] if isinstance(original, str) else original):
                    assert (lake_dst / lake_path).read_bytes() == (standalone / path).read_bytes()
        else:
            assert got == expected.column(name).to_pylist(), name
    assert prop["converter"]["options"]["table_format"] == table_format
    assert sidecar["converter"]["options"]["table_format"] == "parquet"
    assert _without_location(prop) == _without_location(sidecar)
    assert json.loads((lake_dst / prop["stats"]).read_text()) == json.loads((standalone / "stats.json").read_text())
    assert prop["table"] == {"format": table_format, "run": run, "file_references": "relative to the table location"}
    run_copy = json.loads((lake_dst / "runs" / run / "mixtrain.json").read_text())
    assert {**run_copy, "shards": prop["shards"]} == prop


def _ortf(tmp):
    src = tmp / "ortf"
    write_ortf(str(src), SyntheticORTF(lengths=(6, 5, 7), slow_camera=None))
    return src, ()


def _lerobot(tmp):
    path = FIXTURES / "lerobot_v3" / "so100_tiny"
    if not path.is_dir():
        pytest.skip(f"real fixture not found at {path} (../shared/fixtures is absent in a plain clone)")
    return path, ()


def _bridge(tmp):
    path = FIXTURES / "rlds" / "bridge_dataset" / "1.0.0"
    if not path.is_dir():
        pytest.skip(f"real fixture not found at {path} (../shared/fixtures is absent in a plain clone)")
    return path, ("--split=train",)


def _l5kit(tmp):
    path = FIXTURES / "l5kit" / "single_scene.zarr"
    if not path.is_dir():
        pytest.skip(f"real fixture not found at {path} (../shared/fixtures is absent in a plain clone)")
    return path, ()


SOURCES = {"so100_tiny": _lerobot, "rlds_bridge": _bridge, "l5kit": _l5kit, "ortf": _ortf}


@pytest.fixture(scope="module", params=sorted(SOURCES))
def standalone(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(request.param)
    src, extra = SOURCES[request.param](tmp)
    dst = tmp / "standalone"
    assert _convert(src, dst, "--num_shards=2", *extra) == 0
    return src, extra, dst


@pytest.mark.parametrize("table_format", FORMATS)
def test_every_fixture_reads_back_from_the_table_as_the_standalone_output(standalone, table_format, tmp_path):
    src, extra, reference = standalone
    dst = tmp_path / "lake"
    assert _convert(src, dst, "--num_shards=2", f"--table_format={table_format}", *extra) == 0
    _assert_same_dataset(reference, dst, table_format, _lake_rows(dst, table_format))
    _assert_same_dataset(reference, dst, table_format, _duckdb_rows(dst, table_format))
    assert validate.validate(str(dst)) == []


def _night(src_spec):
    return SyntheticLeRobot(**src_spec)


def _snapshot_dataset(dst, table_format, version) -> dict:
    rows = _lake_rows(dst, table_format, version)
    return {sequence_id: (length, (dst / path).read_bytes())
            for sequence_id, length, path in zip(rows.column("sequence_id").to_pylist(), rows.column("length").to_pylist(),
                                                 rows.column("video_front").to_pylist())}


def _reference_dataset(src, tmp, name) -> dict:
    dst = tmp / name
    assert _convert(src, dst, "--num_shards=2") == 0
    rows = _standalone_rows(dst)
    return {sequence_id: (length, (dst / path).read_bytes())
            for sequence_id, length, path in zip(rows.column("sequence_id").to_pylist(), rows.column("length").to_pylist(),
                                                 rows.column("video_front").to_pylist())}


@pytest.mark.parametrize("table_format", FORMATS)
def test_three_nights_leave_three_snapshots_each_reading_back_that_nights_dataset(tmp_path, table_format):
    src, dst = tmp_path / "src", tmp_path / "lake"
    nights = []
    write_night(src, (6, 5, 7), seed=1)
    assert _convert(src, dst, "--num_shards=3", f"--table_format={table_format}") == 0
    nights.append(_reference_dataset(src, tmp_path, "night1"))
    write_night(src, (6, 9, 7, 4), seed=1)  # episode 1 modified (longer), episode 3 appended
    assert _convert(src, dst, "--num_shards=3", f"--table_format={table_format}", "--incremental") == 0
    nights.append(_reference_dataset(src, tmp_path, "night2"))
    write_night(src, (6, 9, 7), seed=1)  # episode 3 deleted
    assert _convert(src, dst, "--num_shards=3", f"--table_format={table_format}", "--incremental") == 0
    nights.append(_reference_dataset(src, tmp_path, "night3"))
    committed = lake.versions(f"file://{dst}", TableSettings(format=table_format))
    assert len(committed) == 3
    for night, version in zip(nights, committed):
        assert _snapshot_dataset(dst, table_format, version["version"]) == night
    assert nights[0] != nights[1] != nights[2]
    assert [entry["current"] for entry in committed] == [False, False, True]
    second = json.loads((dst / "runs" / committed[1]["run"] / "mixtrain.json").read_text())
    # Episode 0 reused; 1 changed, 3 new, and 2's global frame `index` moved behind the longer episode 1.
    assert (second["incremental"]["reused_sequences"], second["incremental"]["converted_units"]) == (1, 3)
    assert validate.validate(str(dst)) == []
    lake.rollback(f"file://{dst}", TableSettings(format=table_format), committed[0]["version"])  # back to the first night
    assert _snapshot_dataset(dst, table_format, None) == nights[0]
    assert lake.current_property(f"file://{dst}", TableSettings(format=table_format))["table"]["run"] == committed[0]["run"]
    after = lake.versions(f"file://{dst}", TableSettings(format=table_format))  # the rollback's own commit adds no run
    assert [entry["current"] for entry in after] == [True, False, False]
    assert [entry["run"] for entry in after] == [entry["run"] for entry in committed]
    assert validate.validate(str(dst)) == []


def test_a_sigkill_during_the_second_night_leaves_the_first_snapshot_current(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "lake"
    write_night(src, (6, 5, 7), seed=1)
    assert _convert(src, dst, "--num_shards=2", "--table_format=iceberg") == 0
    first = _snapshot_dataset(dst, "iceberg", None)
    before = lake.versions(f"file://{dst}", TableSettings(format="iceberg"))
    write_night(src, [12] * 16, seed=2)
    command = [sys.executable, "-m", "pipelines.convert", f"--input={src}", f"--output={dst}", "--progress=off", "--num_shards=2",
               "--table_format=iceberg", "--incremental", "--video=reencode"]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    started = time.monotonic()
    while process.poll() is None and time.monotonic() - started < 120:
        if any(p for p in (dst / "runs").glob("*/files/*/*") if before[0]["run"] not in str(p)):  # videos being written
            break
        time.sleep(0.005)
    # Frozen first, then checked: the run has not finished and has not committed, so the kill that
    # follows lands before the commit (a frozen process commits nothing), not after it by chance.
    process.send_signal(signal.SIGSTOP)
    assert process.poll() is None, "the run ended before it could be killed: give it more to convert"
    assert lake.versions(f"file://{dst}", TableSettings(format="iceberg")) == before, "the run committed before the kill"
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert lake.versions(f"file://{dst}", TableSettings(format="iceberg")) == before
    assert _snapshot_dataset(dst, "iceberg", None) == first
    assert validate.validate(str(dst)) == []
    assert lake.orphans(f"file://{dst}", TableSettings(format="iceberg")) != []  # the killed run's folder, found
    assert _convert(src, dst, "--num_shards=2", "--table_format=iceberg", "--incremental") == 0
    assert len(_snapshot_dataset(dst, "iceberg", None)) == 16


@pytest.mark.parametrize("table_format", FORMATS)
def test_a_new_feature_adds_a_column_and_a_changed_type_is_refused(tmp_path, table_format, capsys):
    src, dst = tmp_path / "src", tmp_path / "lake"
    write_lerobot(str(src), SyntheticLeRobot(lengths=(4, 3), codec="h264", gop=None, cameras=("observation.images.front",)))
    assert _convert(src, dst, f"--table_format={table_format}") == 0
    before = set(_lake_rows(dst, table_format).column_names)
    write_lerobot(str(src), SyntheticLeRobot(lengths=(4, 3), codec="h264", gop=None, cameras=("observation.images.front",),
                                             extra_step_features=True))  # the robot gained sensors overnight
    assert _convert(src, dst, f"--table_format={table_format}", "--incremental") == 0
    rows = _lake_rows(dst, table_format)
    added = set(rows.column_names) - before
    assert added and all(None not in rows.column(name).to_pylist() for name in added)
    committed = lake.versions(f"file://{dst}", TableSettings(format=table_format))
    old = _lake_rows(dst, table_format, committed[0]["version"])  # the first night still reads as it was
    assert all(set(old.column(name).to_pylist()) == {None} for name in added if name in old.column_names)
    assert set(old.column_names) >= before

    # episode_id: a string in ORTF, an int64 in RLDS: the same column cannot change type.
    ortf, rlds, typed = tmp_path / "ortf", tmp_path / "rlds" / "1.0.0", tmp_path / "typed"
    write_ortf(str(ortf), SyntheticORTF(lengths=(4, 5), slow_camera=None))
    from formats.sources.rlds.sample import SyntheticRLDS
    from formats.sources.rlds.sample import write_dataset as write_rlds

    write_rlds(str(rlds), SyntheticRLDS(splits={"train": (3, 4)}, shards={"train": 1}))
    assert _convert(ortf, typed, f"--table_format={table_format}") == 0
    capsys.readouterr()
    state = lake.versions(f"file://{typed}", TableSettings(format=table_format))
    assert _convert(rlds, typed, f"--table_format={table_format}", "--overwrite", "--fps=10") == 1
    error = capsys.readouterr().err.strip().splitlines()
    assert "column episode_id changed type from string to " in error[0] and error[0].startswith("error: ")
    assert lake.versions(f"file://{typed}", TableSettings(format=table_format)) == state
    assert len(os.listdir(typed / "runs")) == 1  # the failed run's folder was removed


@pytest.mark.parametrize("table_format", FORMATS)
def test_two_writers_one_commits_the_other_fails_with_one_line(tmp_path, table_format):
    from formats.errors import ConversionError
    from formats.mixtrain import tables

    src, dst = tmp_path / "src", tmp_path / "lake"
    write_night(src, (6, 5), seed=1)
    assert _convert(src, dst, "--num_shards=2", f"--table_format={table_format}") == 0
    settings = TableSettings(format=table_format, run_id="late", base="")  # planned before the table existed
    first = dst / "runs" / os.listdir(dst / "runs")[0]
    staging = dst / "runs" / "late"
    (staging / "data").mkdir(parents=True)
    sidecar = json.loads((first / "mixtrain.json").read_text())
    for shard in sidecar["shards"]:
        (staging / shard).write_bytes((first / shard).read_bytes())
    before = lake.versions(f"file://{dst}", TableSettings(format=table_format))
    from fsspec.implementations.local import LocalFileSystem

    with pytest.raises(ConversionError, match="another writer committed (snapshot|version) .* after this run started; "
                                              "nothing was committed"):
        tables.publish(LocalFileSystem(), str(staging), str(dst), sidecar, settings)
    assert lake.versions(f"file://{dst}", TableSettings(format=table_format)) == before
    assert lake.orphans(f"file://{dst}", TableSettings(format=table_format)) == ["runs/late"]
    # validate reads the table: a referenced video that disappeared is a finding naming it.
    video = _lake_rows(dst, table_format).column("video_front")[0].as_py()
    (dst / video).unlink()
    findings = validate.validate(str(dst))
    assert len(findings) == 1 and f"video_front file {video} is missing" in findings[0]


def test_partitioning_by_split_prunes_files_and_keeps_every_row(tmp_path, capsys):
    src, dst = tmp_path / "src", tmp_path / "lake"
    write_lerobot(str(src), SyntheticLeRobot(lengths=(4, 3, 5, 6, 2), codec="h264", gop=None, cameras=("observation.images.front",),
                                             splits={"train": "0:3", "val": "3:5"}))
    reference = tmp_path / "standalone"
    assert _convert(src, reference, "--num_shards=2") == 0
    assert _convert(src, dst, "--num_shards=2", "--table_format=iceberg", "--partition_by=split") == 0
    _assert_same_dataset(reference, dst, "iceberg", _lake_rows(dst, "iceberg"))
    from formats.mixtrain.tables import iceberg

    table = iceberg.open_table(f"file://{dst}")
    assert [field.name for field in table.spec().fields] == ["split"]
    val = list(table.scan(row_filter="split == 'val'").plan_files())
    assert val and all(".split=val." in task.file.file_path for task in val)
    assert table.scan(row_filter="split == 'val'").to_arrow().column("sequence_id").to_pylist() == ["episode_000003", "episode_000004"]
    assert _convert(src, dst, "--num_shards=2", "--table_format=iceberg", "--partition_by=split", "--incremental") == 0
    assert table.refresh().current_snapshot().summary["mixtrain.kept-files"] == str(len(list(table.scan().plan_files())))
    assert _convert(src, dst, "--num_shards=2", "--table_format=iceberg", "--partition_by=task", "--overwrite") == 1
    assert "the table is partitioned by (split), this run asks for --partition_by=task" in capsys.readouterr().err
    assert _convert(src, tmp_path / "other", "--table_format=iceberg", "--partition_by=video_front") == 2
    assert capsys.readouterr().err.splitlines()[0] == (
        "error: --partition_by=video_front: not a scalar column of this lerobot_v3 dataset that a table can partition by (a video "
        "column); columns it can partition by: length, duration_seconds, episode_index, task, split")
    assert _convert(src, tmp_path / "other", "--table_format=iceberg", "--partition_by=tasks") == 2  # list<string>
    assert capsys.readouterr().err.splitlines()[0] == (
        "error: --partition_by=tasks: not a scalar column of this lerobot_v3 dataset that a table can partition by (a list<string> "
        "column); columns it can partition by: length, duration_seconds, episode_index, task, split")
    assert validate.validate(str(dst)) == []


def _set_episode_column(src, name, values):
    """An extra per-episode column of the ORTF episode table (a feature the source added)."""
    path = src / "meta" / "episodes.parquet"
    table = pq.read_table(path)
    column = values if isinstance(values, pa.Array) else pa.array(values)
    table = table.set_column(table.column_names.index(name), name, column) if name in table.column_names else table.append_column(name, column)
    pq.write_table(table, path)


@pytest.mark.parametrize("table_format", FORMATS)
def test_a_column_no_row_filled_joins_the_table_when_a_later_night_fills_it(tmp_path, table_format):
    src, dst = tmp_path / "ortf", tmp_path / "lake"
    write_ortf(str(src), SyntheticORTF(lengths=(6, 5, 7), slow_camera=None))
    settings = TableSettings(format=table_format)
    _set_episode_column(src, "quality", pa.nulls(3))  # declared by the source, no episode filled it yet
    assert _convert(src, dst, f"--table_format={table_format}") == 0
    first = lake.current_property(f"file://{dst}", settings)
    assert first["table"]["untyped_columns"] == ["quality"]
    assert "quality" not in _lake_rows(dst, table_format).column_names
    _set_episode_column(src, "quality", [0.5, 1.5, 2.5])
    assert _convert(src, dst, f"--table_format={table_format}", "--incremental") == 0
    rows = _lake_rows(dst, table_format)
    assert rows.schema.field("quality").type == pa.float64() and rows.column("quality").to_pylist() == [0.5, 1.5, 2.5]
    assert "untyped_columns" not in lake.current_property(f"file://{dst}", settings)["table"]
    _set_episode_column(src, "quality", pa.nulls(3))  # a night that fills it nowhere: null rows, the column stays
    assert _convert(src, dst, f"--table_format={table_format}", "--incremental") == 0
    assert _lake_rows(dst, table_format).column("quality").to_pylist() == [None, None, None]
    committed = lake.versions(f"file://{dst}", settings)
    assert len(committed) == 3
    assert _lake_rows(dst, table_format, committed[1]["version"]).column("quality").to_pylist() == [0.5, 1.5, 2.5]
    assert validate.validate(str(dst)) == []


def test_iceberg_promotes_int_to_long_and_float_to_double(tmp_path):
    src, dst = tmp_path / "ortf", tmp_path / "lake"
    write_ortf(str(src), SyntheticORTF(lengths=(6, 5, 7), slow_camera=None))
    _set_episode_column(src, "attempt", pa.array([1, 2, 3], pa.int32()))
    _set_episode_column(src, "score", pa.array([0.5, 1.5, 2.5], pa.float32()))
    assert _convert(src, dst, "--table_format=iceberg") == 0
    _set_episode_column(src, "attempt", pa.array([4, 5, 2 ** 40], pa.int64()))
    _set_episode_column(src, "score", pa.array([0.25, 1.25, 1e300], pa.float64()))
    assert _convert(src, dst, "--table_format=iceberg", "--incremental") == 0
    rows = _lake_rows(dst, "iceberg")
    assert (rows.schema.field("attempt").type, rows.schema.field("score").type) == (pa.int64(), pa.float64())
    assert rows.column("attempt").to_pylist() == [4, 5, 2 ** 40] and rows.column("score").to_pylist() == [0.25, 1.25, 1e300]
    first = lake.versions(f"file://{dst}", TableSettings(format="iceberg"))[0]["version"]
    assert _lake_rows(dst, "iceberg", first).column("attempt").to_pylist() == [1, 2, 3]
    assert validate.validate(str(dst)) == []


@pytest.mark.parametrize("name, first, second, types", [("attempt", pa.int32(), pa.int64(), "int32 to int64"),
                                                        ("score", pa.float32(), pa.float64(), "float to double")])
def test_delta_refuses_the_promotions_iceberg_accepts(tmp_path, capsys, name, first, second, types):
    """docs/lake.md: Delta keeps every column's type exactly; a promotion is refused with one line
    and nothing is committed (the run's folder removed, the table's versions and rows as they were)."""
    src, dst = tmp_path / "ortf", tmp_path / "lake"
    write_ortf(str(src), SyntheticORTF(lengths=(6, 5, 7), slow_camera=None))
    _set_episode_column(src, name, pa.array([1, 2, 3], first))
    assert _convert(src, dst, "--table_format=delta") == 0

    def state():
        return lake.versions(f"file://{dst}", TableSettings(format="delta")), _lake_rows(dst, "delta"), sorted(os.listdir(dst / "runs"))

    before = state()
    capsys.readouterr()
    _set_episode_column(src, name, pa.array([4, 5, 6], second))
    assert _convert(src, dst, "--table_format=delta", "--incremental") == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: file://{dst}: column {name} changed type from {types}; a table keeps its column types "
        "(convert to a new --output, or rename the column at the source)"]
    after = state()
    assert after[0] == before[0] and after[1].equals(before[1]) and after[2] == before[2]
    assert validate.validate(str(dst)) == []


@pytest.mark.parametrize("table_format", FORMATS)
def test_a_refused_lake_run_leaves_the_output_as_it_was(tmp_path, table_format, capsys):
    src = tmp_path / "ortf"
    write_ortf(str(src), SyntheticORTF(lengths=(4, 5), slow_camera=None))
    new, empty = tmp_path / "new", tmp_path / "empty"
    empty.mkdir()
    extra = ("--partition_by=nosuch",) if table_format == "iceberg" else ("--fps=3",)  # refused once the source is read
    for dst in (new, empty):
        assert _convert(src, dst, f"--table_format={table_format}", *extra) == 2
        assert capsys.readouterr().err.startswith("error: --")
    assert not new.exists() and empty.is_dir() and os.listdir(empty) == []
    assert _convert(src, new) == 0 and _convert(src, empty) == 0  # a standalone run may use them as before


@pytest.mark.parametrize("statistics", [True, False])
def test_uint64_values_beyond_int64_are_refused_with_or_without_parquet_statistics(tmp_path, statistics):
    from fsspec.implementations.local import LocalFileSystem

    from formats.errors import ConversionError

    def shard(name, values, nested):
        path = tmp_path / f"{name}.parquet"
        table = pa.table({"sequence_id": [f"s{i}" for i in range(len(values))], "count": pa.array(values, pa.uint64()),
                          "nested": pa.array([[value] for value in nested], pa.list_(pa.uint64()))})
        pq.write_table(table, path, write_statistics=statistics)
        return str(path)

    fs, small, big = LocalFileSystem(), [1, 2 ** 63 - 1], [0, 2 ** 63]
    fitting = shard("fits", small, small)
    schema = pq.read_schema(fitting)
    lake.check_unsigned(fs, [fitting], schema)  # every value fits int64: accepted
    with pytest.raises(ConversionError, match="^column count: uint64 values exceed int64"):
        lake.check_unsigned(fs, [fitting, shard("top", big, small)], schema)
    with pytest.raises(ConversionError, match="^column nested: uint64 values exceed int64"):
        lake.check_unsigned(fs, [shard("inner", small, big)], schema)
    assert lake.unsigned_64_fit(fs, [fitting]) == {"count": True, "nested": True}


def test_a_delta_run_is_one_log_entry_holding_its_rows_and_its_property(tmp_path):
    from deltalake import DeltaTable
    from fsspec.implementations.local import LocalFileSystem

    from formats.mixtrain.tables import delta

    src, dst = tmp_path / "src", tmp_path / "lake"
    write_night(src, (6, 5, 7), seed=1)
    assert _convert(src, dst, "--num_shards=2", "--table_format=delta") == 0
    write_night(src, (6, 9, 7, 4), seed=1)
    assert _convert(src, dst, "--num_shards=2", "--table_format=delta", "--incremental") == 0
    assert sorted(os.listdir(dst / "_delta_log")) == ["00000000000000000000.json", "00000000000000000001.json"]
    committed = lake.versions(f"file://{dst}", TableSettings(format="delta"))
    assert [entry["version"] for entry in committed] == ["0", "1"]
    for entry, rows in zip(committed, (3, 4)):
        version = DeltaTable(f"file://{dst}", version=int(entry["version"]))
        value = json.loads(version.metadata().configuration["mixtrain"])  # every version: its own run's metadata
        assert value["table"]["run"] == entry["run"] and value["num_sequences"] == rows == version.to_pyarrow_table().num_rows
    entry = dst / "_delta_log" / "00000000000000000001.json"
    before = entry.read_bytes()
    assert not delta._put_if_absent(LocalFileSystem(), str(entry), b"{}\n")  # a writer racing for a taken version loses
    assert entry.read_bytes() == before and [p.name for p in (dst / "_delta_log").iterdir() if p.name.startswith(".")] == []
    assert validate.validate(str(dst)) == []
    lake.rollback(f"file://{dst}", TableSettings(format="delta"), "0")  # one entry too: the first night's rows and property
    assert len(os.listdir(dst / "_delta_log")) == 3
    restored = DeltaTable(f"file://{dst}")
    assert restored.to_pyarrow_table().num_rows == 3 and json.loads(restored.metadata().configuration["mixtrain"])["table"]["run"] \
        == committed[0]["run"]
    assert _duckdb_rows(dst, "delta").column("sequence_id").to_pylist() == restored.to_pyarrow_table().sort_by("sequence_id").column(
        "sequence_id").to_pylist()
    assert validate.validate(str(dst)) == []


@pytest.mark.parametrize("checkpoint", ["written", "fails"])
def test_a_delta_checkpoint_every_100_versions_and_a_failed_one_leaves_the_commit(tmp_path, monkeypatch, caplog, checkpoint):
    """docs/lake.md: a checkpoint every 100 versions, as delta-rs does; one that cannot be written
    is a warning in the log and the commit stands (a checkpoint only shortens the log's replay)."""
    from deltalake import DeltaTable

    src, dst = tmp_path / "src", tmp_path / "lake"
    write_night(src, (6, 5, 7), seed=1)
    assert _convert(src, dst, "--table_format=delta") == 0
    for version in range(1, 100):  # another tool's commits that change nothing: the version moves on
        entry = {"commitInfo": {"timestamp": 1, "operation": "OPTIMIZE", "engineInfo": "test"}}
        (dst / "_delta_log" / f"{version:020d}.json").write_text(json.dumps(entry) + "\n")
    write_night(src, (6, 9, 7, 4), seed=1)
    if checkpoint == "fails":
        def refuse(self, *args, **kwargs):
            raise OSError("No space left on device")

        monkeypatch.setattr(DeltaTable, "create_checkpoint", refuse)
    with caplog.at_level("WARNING", logger="formats.mixtrain.tables.delta"):
        assert _convert(src, dst, "--table_format=delta", "--incremental") == 0  # version 100
    table = DeltaTable(f"file://{dst}")
    assert table.version() == 100 and table.to_pyarrow_table().num_rows == 4
    written = sorted(p.name for p in (dst / "_delta_log").glob("*.checkpoint.parquet"))
    warnings = [r.getMessage() for r in caplog.records if r.name == "formats.mixtrain.tables.delta"]
    if checkpoint == "fails":
        assert written == [] and not (dst / "_delta_log" / "_last_checkpoint").exists()
        assert warnings == [f"file://{dst}: version 100 is committed, its checkpoint was not written (readers replay the log "
                            "instead): OSError: No space left on device"]
        return
    assert written == ["00000000000000000100.checkpoint.parquet"] and warnings == []
    assert json.loads((dst / "_delta_log" / "_last_checkpoint").read_text())["version"] == 100
    for version in range(100):  # the checkpoint alone holds the table: versions 0..99 are not needed to read 100
        (dst / "_delta_log" / f"{version:020d}.json").unlink()
    alone = DeltaTable(f"file://{dst}").to_pyarrow_table().sort_by("sequence_id")
    assert alone.equals(table.to_pyarrow_table().sort_by("sequence_id"))
    assert json.loads(DeltaTable(f"file://{dst}").metadata().configuration["mixtrain"])["num_sequences"] == 4


@pytest.mark.parametrize("table_format", FORMATS)
def test_the_reader_and_inspect_open_a_lake_tables_current_run(tmp_path, table_format, capsys):
    import numpy as np

    from formats.errors import FormatError
    from formats.read import reader
    from pipelines import inspect

    src, dst, reference = tmp_path / "src", tmp_path / "lake", tmp_path / "standalone"
    write_night(src, (6, 5, 7), seed=1)
    assert _convert(src, dst, "--num_shards=2", f"--table_format={table_format}") == 0
    write_night(src, (6, 9, 7, 4), seed=1)
    capsys.readouterr()
    assert _convert(src, dst, "--num_shards=2", f"--table_format={table_format}", "--incremental") == 0
    import re

    summary = re.fullmatch(r"published 4 sequences \(--incremental: 3 converted, 1 unchanged sequences reused\), (\d+) timesteps, "
                           r"([0-9.]+) MB in [0-9.]+ s -> (.*): (Iceberg|Delta) table.*",
                           capsys.readouterr().out.splitlines()[-1])
    run = lake.current_property(f"file://{dst}", TableSettings(format=table_format))["table"]["run"]
    written = sum(path.stat().st_size for path in (dst / "runs" / run).rglob("*") if path.is_file())
    assert summary and summary[1] == "26" and summary[2] == f"{written / 1e6:.2f}" and summary[3] == str(dst)
    assert _convert(src, reference, "--num_shards=2") == 0
    lake_ds, standalone = reader.open_dataset(str(dst)), reader.open_dataset(str(reference))
    assert len(lake_ds) == len(standalone) == 4 and sorted(lake_ds.sequence_ids()) == sorted(standalone.sequence_ids())
    for sequence_id in standalone.sequence_ids():
        got, expected = lake_ds.sequence(sequence_id), standalone.sequence(sequence_id)
        assert np.array_equal(got["action"], expected["action"]) and got["length"] == expected["length"]
        assert np.array_equal(lake_ds.frames(sequence_id, "video_front", 0, 3), standalone.frames(sequence_id, "video_front", 0, 3))
    capsys.readouterr()
    assert inspect.main([str(dst)]) == 0
    out = capsys.readouterr().out
    assert "sequences   4" in out and "video_front  h264" in out and "4 files" in out

    empty = tmp_path / "empty_table"
    if table_format == "delta":
        from deltalake import DeltaTable

        DeltaTable.create(f"file://{empty}", schema=pa.schema([pa.field("sequence_id", pa.string())]))
    else:
        from pyiceberg.catalog.sql import SqlCatalog

        empty.mkdir()
        catalog = SqlCatalog("mixtrain", uri=f"sqlite:///{empty}/catalog.db", warehouse=f"file://{empty}")
        catalog.create_namespace("default")
        catalog.create_table("default.dataset", schema=pa.schema([pa.field("sequence_id", pa.string())]), location=f"file://{empty}")
    name, library = {"iceberg": ("an Iceberg", "pyiceberg"), "delta": ("a Delta", "deltalake")}[table_format]
    with pytest.raises(FormatError) as raised:
        reader.open_dataset(str(empty))
    assert str(raised.value) == f"{empty}: {name} table without a readable Mixtrain run: read it with {library}/DuckDB (docs/lake.md)"
    assert inspect.main([str(empty)]) == 1
    assert capsys.readouterr().err == f"error: {empty}: {name} table without a readable Mixtrain run: read it with {library}/DuckDB " \
                                      "(docs/lake.md)\n"


@pytest.mark.parametrize("table_format", FORMATS)
def test_an_incremental_run_that_reuses_everything_says_so(tmp_path, table_format, capsys):
    """All sequences unchanged: the summary says 0 converted, not "converted 3 sequences"."""
    src, dst = tmp_path / "src", tmp_path / "lake"
    write_night(src, (6, 5, 7), seed=1)
    assert _convert(src, dst, f"--table_format={table_format}") == 0
    capsys.readouterr()
    assert _convert(src, dst, f"--table_format={table_format}", "--incremental") == 0
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    assert summary.startswith("published 3 sequences (--incremental: 0 converted, 3 unchanged sequences reused), 18 timesteps, ")


@pytest.mark.parametrize("catalog", ["embedded", "uri", "named"])
def test_the_printed_pyiceberg_call_opens_the_table_as_printed(tmp_path, monkeypatch, capsys, catalog):
    """The summary line's `(pyiceberg: ...)` evaluated as printed loads the table (a --catalog URI's
    hint once raised 'URI missing'); an external catalog's table folder is refused by validate,
    inspect and the reader with one line pointing to pyiceberg, not 'mixtrain.json: not found'."""
    import pyiceberg.catalog
    from pyiceberg.catalog import load_catalog
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.utils.config import Config

    from formats.errors import FormatError
    from formats.read.reader import open_dataset
    from pipelines import inspect

    src, dst = tmp_path / "src", tmp_path / "lake"
    write_night(src, (5, 4), seed=1)
    extra = {"embedded": [], "uri": [f"--catalog=sqlite:///{tmp_path}/catalog.db"], "named": ["--catalog=lake"]}[catalog]
    if catalog == "named":
        monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__TYPE", "sql")
        monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__URI", f"sqlite:///{tmp_path}/named.db")
        monkeypatch.setattr(pyiceberg.catalog, "_ENV_CONFIG", Config())  # read once at import: reread with these
    assert _convert(src, dst, "--table_format=iceberg", *extra) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    call = line[line.index("(pyiceberg: ") + len("(pyiceberg: "):-1]
    table = eval(call, {"load_catalog": load_catalog, "SqlCatalog": SqlCatalog})  # noqa: S307 - the printed hint itself
    assert table.scan().to_arrow().num_rows == 2
    if catalog == "embedded":
        assert call.startswith("SqlCatalog('mixtrain', uri='sqlite:///")
        return
    assert call.startswith({"uri": "load_catalog('mixtrain', type='sql', uri='sqlite:///", "named": "load_catalog('lake')"}[catalog])
    refusal = (f"{dst}: an Iceberg table whose catalog is not in this folder (converted with --catalog): open it with pyiceberg, "
               "load_catalog(NAME, ...).load_table('default.dataset'), as the conversion's summary line printed (docs/lake.md, Catalogs)")
    for command in (validate.main, inspect.main):
        assert command([str(dst)]) == 1
        captured = capsys.readouterr()
        assert (captured.out, captured.err) == ("", f"error: {refusal}\n")
    with pytest.raises(FormatError) as raised:
        open_dataset(str(dst))
    assert str(raised.value) == refusal


@pytest.mark.parametrize("table_format", FORMATS)
def test_polars_reads_the_tables_through_pyarrow_as_docs_lake_md_says(tmp_path, table_format):
    """polars' own readers refuse the trajectory columns (fixed-size lists: `Array(Float32, 6) !=
    target: List(Float32)`); through pyarrow (`use_pyarrow=True`, `reader_override="pyiceberg"`),
    as docs/lake.md shows, every row and value arrives (a trajectory as a list of lists)."""
    polars = pytest.importorskip("polars")
    src, dst, reference = tmp_path / "src", tmp_path / "lake", tmp_path / "standalone"
    write_night(src, (6, 5, 7), seed=1)
    assert _convert(src, dst, f"--table_format={table_format}") == 0
    assert _convert(src, reference) == 0
    if table_format == "delta":
        native, frame = (lambda: polars.scan_delta(str(dst)).collect()), polars.scan_delta(str(dst), use_pyarrow=True)
    else:
        from pyiceberg.catalog.sql import SqlCatalog

        table = SqlCatalog("mixtrain", uri=f"sqlite:///{dst}/catalog.db").load_table("default.dataset")
        native, frame = (lambda: polars.scan_iceberg(table, reader_override="native").collect()), polars.scan_iceberg(
            table, reader_override="pyiceberg")
    with pytest.raises(Exception, match=r"Array\(|Fixed"):  # what docs/lake.md says polars' native readers do today
        native()
    got = frame.collect().sort("sequence_id")
    expected = polars.from_arrow(_standalone_rows(reference)).sort("sequence_id")
    assert got.height == 3 and got["action"].to_list() == expected["action"].to_list()
    assert got["sequence_id"].to_list() == expected["sequence_id"].to_list()
