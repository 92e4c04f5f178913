"""End to end: the CLI on the real fixture and on synthetic multi-file datasets, and bad input."""

import json
import shutil
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from formats import storage, video
from pipelines import convert, validate


def _convert(src, dst, *extra):
    return convert.run([f"--input={src}", f"--output={dst}", "--progress=off", *extra])


def _rows(dst):
    tables = [pq.read_table(p) for p in sorted((dst / "data").glob("part-*.parquet"))]
    return pa.concat_tables(tables).sort_by("sequence_id")


@pytest.fixture(scope="module")
def converted_fixture(so100_tiny, tmp_path_factory):
    dst = tmp_path_factory.mktemp("out") / "so100"
    assert _convert(so100_tiny, dst, "--num_shards=2") == 0
    return dst


def test_fixture_every_episode_one_row_with_exact_values(so100_tiny, converted_fixture):
    rows = _rows(converted_fixture)
    source = pq.read_table(so100_tiny / "data/chunk-000/file-000.parquet")
    assert rows.column("sequence_id").to_pylist() == [f"episode_{i:06d}" for i in range(5)]
    assert rows.column("length").to_pylist() == [51, 54, 25, 44, 23]
    assert rows.schema.field("obs_state").type == pa.list_(pa.list_(pa.float32(), 6))
    episode = source.column("episode_index").to_numpy()
    for row in range(5):
        mask = episode == row
        for column, key in (("obs_state", "observation.state"), ("action", "action")):
            got = rows.column(column)[row].values.flatten().to_numpy()
            want = np.concatenate(source.column(key).to_numpy(zero_copy_only=False)[mask])
            assert got.dtype == np.float32 and got.tobytes() == want.tobytes()
    assert rows.column("task").to_pylist()[1] == "Open the top drawer."


def test_fixture_videos_are_pixel_identical_with_t_frames(so100_tiny, converted_fixture):
    rows = _rows(converted_fixture)
    episodes = pq.read_table(so100_tiny / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    for camera in ("front", "wrist"):
        source = str(so100_tiny / f"videos/observation.images.{camera}/chunk-000/file-000.mp4")
        for row, path in enumerate(rows.column(f"video_{camera}").to_pylist()):
            assert path == f"files/video_{camera}/episode_{row:06d}.mp4"
            got = video.decode_frames(str(converted_fixture / path))
            ep = episodes[row]
            want = video.decode_frames(source, start=ep[f"videos/observation.images.{camera}/from_timestamp"],
                                       end=ep[f"videos/observation.images.{camera}/to_timestamp"], fps=30)
            assert got.shape[0] == ep["length"]
            assert np.array_equal(got, want)


def test_fixture_stats_match_lerobot_meta_stats(so100_tiny, converted_fixture):
    ours = json.loads((converted_fixture / "stats.json").read_text())
    theirs = json.loads((so100_tiny / "meta/stats.json").read_text())
    for column, key in (("obs_state", "observation.state"), ("action", "action"), ("timestamp", "timestamp")):
        for stat in ("mean", "std", "min", "max"):
            np.testing.assert_allclose(ours[column][stat], theirs[key][stat], rtol=1e-5, atol=1e-7, err_msg=f"{column} {stat}")
        assert ours[column]["count"] == theirs[key]["count"]
        assert len(ours[column]["q50"]) == len(theirs[key]["mean"])


def test_fixture_sidecar_and_validate(converted_fixture):
    sidecar = json.loads((converted_fixture / "mixtrain.json").read_text())
    assert sidecar["mixtrain"] == "1.0"
    assert sidecar["num_sequences"] == 5 and sidecar["num_timesteps"] == 197
    front = sidecar["column_types"]["video_front"]
    assert front["type"] == "video" and front["codec"] == "av1" and front["fps"] == 30
    assert front["resolution"] == {"width": 64, "height": 48} and front["source"] == "observation.images.front"
    assert sidecar["column_types"]["obs_state"]["names"][0] == "shoulder_pan.pos"
    assert sidecar["source"]["robot_type"] == "so100"
    assert validate.validate(str(converted_fixture)) == []
    assert not (converted_fixture / "_staging").exists() and not list(converted_fixture.parent.glob(f".{converted_fixture.name}.mixtrain-*"))


def test_running_twice_gives_identical_shards(so100_tiny, converted_fixture, tmp_path):
    again = tmp_path / "again"
    assert _convert(so100_tiny, again, "--num_shards=2") == 0
    for part in ("data/part-00000.parquet", "data/part-00001.parquet", "stats.json"):
        assert (again / part).read_bytes() == (converted_fixture / part).read_bytes(), part


def test_multi_file_dataset_two_workers(multi_file_dataset, tmp_path):
    src, truth = multi_file_dataset
    dst = tmp_path / "out"
    code = _convert(src, dst, "--num_shards=3", "--direct_num_workers=2", "--direct_running_mode=multi_processing")
    assert code == 0
    rows = _rows(dst)
    assert rows.num_rows == 7
    for i in range(7):
        state = rows.column("obs_state")[i].values.flatten().to_numpy()
        assert state.tobytes() == truth["state"][i].tobytes()
        sensor = rows.column("obs_sensor")[i].values.flatten().to_numpy()
        assert sensor.dtype == np.float64 and np.array_equal(sensor, truth["sensor"][i].reshape(-1))
        assert rows.column("next_done")[i].as_py() == truth["done"][i].tolist()
        frames = video.decode_frames(str(dst / rows.column("video_wrist")[i].as_py()), planar=False)
        assert frames.shape[0] == len(truth["state"][i])
    assert rows.column("split").to_pylist() == ["train"] * 5 + ["val"] * 2
    assert validate.validate(str(dst)) == []


def _expect_failure(src, dst, capsys, *fragments):
    assert _convert(src, dst) == 1
    err = capsys.readouterr().err.strip().splitlines()
    line = [x for x in err if x.startswith("error: ")]
    assert len(line) == 1, err
    for fragment in fragments:
        assert fragment in line[0]
    assert not dst.exists() or not any(dst.iterdir()), list(dst.rglob("*"))


def test_missing_video_file(writable_so100, tmp_path, capsys):
    src = writable_so100
    (src / "videos/observation.images.wrist/chunk-000/file-000.mp4").unlink()
    _expect_failure(src, tmp_path / "out", capsys, "videos/observation.images.wrist/chunk-000/file-000.mp4", "episode_0000",
                    "video file not found")


def test_truncated_mp4(writable_so100, tmp_path, capsys):
    src = writable_so100
    path = src / "videos/observation.images.front/chunk-000/file-000.mp4"
    path.write_bytes(path.read_bytes()[:60000])
    _expect_failure(src, tmp_path / "out", capsys, "videos/observation.images.front/chunk-000/file-000.mp4", "episode_0000")


def test_missing_info_json_cli(writable_so100, tmp_path, capsys):
    src = writable_so100
    (src / "meta/info.json").unlink()
    _expect_failure(src, tmp_path / "out", capsys, "not a dataset of a known format")


def test_v21_cli(writable_so100, tmp_path, capsys):
    src = writable_so100
    info = json.loads((src / "meta/info.json").read_text())
    info["codebase_version"] = "v2.1"
    (src / "meta/info.json").write_text(json.dumps(info))
    # Read as v2.x now (lerobot_v2): a v3.0 dataset labelled v2.1 has no v2 episode index.
    _expect_failure(src, tmp_path / "out", capsys, "meta/episodes.jsonl: not found; a LeRobot v2.x dataset needs meta/episodes.jsonl")


def test_offsets_past_data_file_cli(writable_so100, tmp_path, capsys):
    src = writable_so100
    file = src / "meta/episodes/chunk-000/file-000.parquet"
    table = pq.read_table(file)
    rows = table.to_pylist()
    rows[3]["dataset_from_index"] += 500
    rows[3]["dataset_to_index"] += 500
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), file)
    _expect_failure(src, tmp_path / "out", capsys, "data/chunk-000/file-000.parquet", "episode_000003", "point past the data file")


def test_existing_dataset_needs_overwrite(so100_tiny, converted_fixture, tmp_path, capsys):
    dst = tmp_path / "out"
    shutil.copytree(converted_fixture, dst)
    before = sorted(p.relative_to(dst) for p in dst.rglob("*"))
    assert _convert(so100_tiny, dst) == 1
    assert "already holds a Mixtrain dataset; pass --overwrite" in capsys.readouterr().err
    assert sorted(p.relative_to(dst) for p in dst.rglob("*")) == before
    assert _convert(so100_tiny, dst, "--overwrite") == 0
    assert validate.validate(str(dst)) == []


def test_failed_run_keeps_the_previous_dataset(writable_so100, converted_fixture, tmp_path, capsys):
    src = writable_so100
    (src / "videos/observation.images.wrist/chunk-000/file-000.mp4").unlink()
    dst = tmp_path / "out"
    shutil.copytree(converted_fixture, dst)
    assert _convert(src, dst, "--overwrite") == 1
    assert validate.validate(str(dst)) == []
    assert not (dst / "_staging").exists() and not list(dst.parent.glob(f".{dst.name}.mixtrain-*"))


def test_cli_entry_point_and_exit_codes(so100_tiny, tmp_path):
    dst = tmp_path / "cli"
    done = subprocess.run([sys.executable, "-m", "pipelines.convert", f"--input={so100_tiny}", f"--output={dst}"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "converted 5 sequences, 197 timesteps" in done.stdout
    checked = subprocess.run([sys.executable, "-m", "pipelines.validate", str(dst)], capture_output=True, text=True, timeout=300)
    assert checked.returncode == 0 and "ok:" in checked.stdout
    usage = subprocess.run([sys.executable, "-m", "pipelines.convert", f"--input={so100_tiny}"], capture_output=True, text=True, timeout=300)
    assert usage.returncode == 2 and "--input and --output are required" in usage.stderr


def test_validate_reports_findings(converted_fixture, tmp_path):
    dst = tmp_path / "broken"
    shutil.copytree(converted_fixture, dst)
    (dst / "files/video_front/episode_000002.mp4").unlink()
    findings = validate.validate(str(dst))
    assert any("episode_000002: video_front file files/video_front/episode_000002.mp4 is missing" in f for f in findings)
    sidecar = json.loads((dst / "mixtrain.json").read_text())
    sidecar["num_sequences"] = 6
    (dst / "mixtrain.json").write_text(json.dumps(sidecar))
    assert any("num_sequences 6 but the shards hold 5" in f for f in validate.validate(str(dst)))
    assert validate.main([str(dst)]) == 1


def test_memory_urls_end_to_end(multi_file_dataset):
    src, truth = multi_file_dataset
    fs, _ = storage.open_root("memory://e2e_src")
    fs.put(str(src), "/e2e_src", recursive=True)
    assert _convert("memory://e2e_src", "memory://e2e_out") == 0
    assert validate.validate("memory://e2e_out") == []
    with fs.open("/e2e_out/mixtrain.json") as handle:
        assert json.load(handle)["num_sequences"] == 7


def test_limit_converts_the_first_units_exactly_and_says_so(tmp_path, capsys):
    """`--limit=N` (issue 41: a trial on a few episodes first, as lerobot's episodes=[...]): the first
    N units of the plan, each row equal to the full conversion's, recorded in mixtrain.json."""
    from formats import samples

    src = tmp_path / "src"
    samples.get("lerobot_v3").bundled(str(src), 6)
    full, part = tmp_path / "full", tmp_path / "part"
    assert _convert(src, full) == 0
    capsys.readouterr()
    assert _convert(src, part, "--limit=2") == 0
    assert "lerobot_v3: 2 sequences (--limit: the first 2 of 6 units) -> " in capsys.readouterr().out
    sidecar = json.loads((part / "mixtrain.json").read_text())
    assert sidecar["num_sequences"] == 2 and sidecar["converter"]["options"]["limit"] == {"first": 2, "of": 6}
    got, expected = _rows(part), _rows(full)
    assert got.column("sequence_id").to_pylist() == ["episode_000000", "episode_000001"]
    assert got.drop_columns([c for c in got.column_names if c.startswith("video_")]).equals(
        expected.slice(0, 2).drop_columns([c for c in got.column_names if c.startswith("video_")]))
    for column in ("video_front", "video_wrist"):
        for name in got.column(column).to_pylist():
            assert (part / name).read_bytes() == (full / name).read_bytes()
    assert validate.validate(str(part)) == []
    capsys.readouterr()
    assert _convert(src, part, "--limit=2", "--incremental") == convert.EXIT_USAGE
    assert capsys.readouterr().err == ("error: --limit cannot be combined with --incremental: the published dataset would lose "
                                       "every unit past the first N; try the conversion into another --output\n")
