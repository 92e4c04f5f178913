"""End to end: L5Kit zarr -> Mixtrain through the CLI, on the real fixture and written datasets."""

import json
import pathlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from formats.sources.l5kit.sample import SyntheticL5Kit, write_dataset
from pipelines import convert, validate

FIXTURE = pathlib.Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "l5kit" / "single_scene.zarr"


def _rows(dst):
    return pa.concat_tables([pq.read_table(p) for p in sorted((dst / "data").glob("*.parquet"))]).sort_by("sequence_id")


def test_real_fixture_converts_and_validates(tmp_path):
    if not FIXTURE.is_dir():
        pytest.skip(f"real fixture not found at {FIXTURE} (../shared/fixtures is absent in a plain clone)")
    dst = tmp_path / "out"
    assert convert.run([f"--input={FIXTURE}", f"--output={dst}", "--progress=off"]) == 0
    assert validate.validate(str(dst)) == []
    rows = _rows(dst)
    assert rows.column("sequence_id").to_pylist() == ["scene_000000"] and rows.column("length").to_pylist() == [248]
    assert rows.schema.field("ego_rotation").type == pa.list_(pa.list_(pa.float64(), 9))
    agents = rows.column("agents")[0]
    assert len(agents) == 248 and sum(len(frame) for frame in agents.values.to_pylist()) == 20_802
    sidecar = json.loads((dst / "mixtrain.json").read_text())
    assert sidecar["column_types"]["agents"]["type"] == "agents"
    assert sidecar["column_types"]["traffic_light_faces"]["type"] == "traffic_light_faces"
    assert sidecar["source"]["format"] == "l5kit" and sidecar["source"]["format_version"] == 2
    assert sidecar["num_timesteps"] == 248


def test_written_dataset_rows_and_stats(tmp_path):
    src = tmp_path / "ds.zarr"
    spec = SyntheticL5Kit(scene_lengths=(30, 45, 12, 60, 7), frames_chunk=16, agents_chunk=64)
    truth = write_dataset(str(src), spec)
    dst = tmp_path / "out"
    assert convert.run([f"--input={src}", f"--output={dst}", "--num_shards=2", "--progress=off",
                        "--direct_num_workers=2", "--direct_running_mode=multi_processing"]) == 0
    assert validate.validate(str(dst)) == []
    rows = _rows(dst)
    assert rows.column("sequence_id").to_pylist() == [f"scene_{i:06d}" for i in range(5)]
    frames = truth["frames"]
    counts = frames["agent_index_interval"][:, 1] - frames["agent_index_interval"][:, 0]
    got_counts = np.concatenate([np.array([len(f) for f in cell]) for cell in rows.column("agents").to_pylist()])
    assert np.array_equal(got_counts, counts)
    assert rows.column("host").to_pylist() == truth["scenes"]["host"].tolist()
    ego = np.concatenate([np.array(cell) for cell in rows.column("ego_translation").to_pylist()])
    assert ego.tobytes() == np.ascontiguousarray(frames["ego_translation"]).tobytes()
    stats = json.loads((dst / "stats.json").read_text())
    for field in ("centroid", "velocity", "extent"):
        values = truth["agents"][field].astype(np.float64)
        assert np.allclose(stats[f"agents.{field}"]["mean"], values.mean(0), rtol=1e-12, atol=1e-12)
        assert np.allclose(stats[f"agents.{field}"]["std"], values.std(0), rtol=1e-9)
        assert stats[f"agents.{field}"]["count"] == [len(values)]
    assert np.allclose(stats["ego_translation"]["mean"], frames["ego_translation"].mean(0))
    assert "timestamp_ns" not in stats
