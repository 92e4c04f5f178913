import json

import numpy as np
import pyarrow as pa
import pytest

from formats.mixtrain.stats import ColumnStats, summarise


def test_moments_equal_numpy_population_stats():
    values = np.random.default_rng(0).normal(3.0, 2.0, size=(5000, 4))
    merged = ColumnStats.of(values[:1234]).merge(ColumnStats.of(values[1234:4000])).merge(ColumnStats.of(values[4000:]))
    out = merged.to_json()
    np.testing.assert_allclose(out["mean"], values.mean(0), rtol=1e-12)
    np.testing.assert_allclose(out["std"], values.std(0), rtol=1e-12)
    assert out["min"] == values.min(0).tolist() and out["max"] == values.max(0).tolist()
    assert out["count"] == [5000]


def test_quantiles_exact_below_capacity():
    values = np.random.default_rng(1).random((3000, 2))
    out = ColumnStats.of(values[:1000]).merge(ColumnStats.of(values[1000:])).to_json()
    for name, q in (("q01", 0.01), ("q50", 0.5), ("q99", 0.99)):
        np.testing.assert_array_equal(out[name], np.quantile(values, q, axis=0, method="inverted_cdf"))


def test_quantiles_approximate_above_capacity():
    values = np.random.default_rng(2).normal(size=(200_000, 3))
    parts = [ColumnStats.of(values[i:i + 10_000]) for i in range(0, len(values), 10_000)]
    out = summarise([{"x": p} for p in parts])["x"]
    for name, q in (("q01", 0.01), ("q10", 0.1), ("q50", 0.5), ("q90", 0.9), ("q99", 0.99)):
        # rank error well under 0.5 %: compare ranks, not values
        ranks = (values < np.asarray(out[name])).mean(axis=0)
        np.testing.assert_allclose(ranks, q, atol=0.005)


def test_one_dimensional_steps_and_nan():
    out = ColumnStats.of(np.array([1.0, 2.0, np.nan])).to_json()
    assert np.isnan(out["mean"][0]) and out["count"] == [3]


def test_same_partials_same_order_same_bits():
    rng = np.random.default_rng(3)
    parts = [{"a": ColumnStats.of(rng.normal(size=(7000, 2)))} for _ in range(5)]
    assert summarise(parts) == summarise(parts)


@pytest.mark.parametrize("n", [1, 2, 4097, 9000])
def test_sketch_weight_is_conserved(n):
    stats = ColumnStats.of(np.arange(n, dtype=float))
    assert sum(len(rows) * 2**level for level, rows in enumerate(stats.levels)) == n


def _rows_with_holes():
    """Rows of every per-step kind, with NaN, inf, null elements, a null cell and L5Kit-like records."""
    from formats import mixtrain
    from formats.sequence import ColumnSpec, Sequence, base_columns

    agent = pa.struct([("centroid", pa.list_(pa.float64(), 2)), ("yaw", pa.float32())])
    columns = base_columns() + [ColumnSpec.trajectory("action", np.float32, 3), ColumnSpec.trajectory("pose", np.float64, 2),
                                ColumnSpec.steps("reward", pa.float32()), ColumnSpec.steps("count", pa.int64()),
                                ColumnSpec.steps("agents", pa.list_(agent), stats_fields=["centroid", "yaw"])]
    rng = np.random.default_rng(5)
    sequences = []
    for i, length in enumerate((7, 1, 12, 5)):
        action = rng.normal(size=(length, 3)).astype(np.float32)
        action[0, i % 3] = (np.nan, np.inf, -np.inf)[i % 3]
        agents = pa.array([[{"centroid": rng.normal(size=2).tolist(), "yaw": float(rng.normal())} for _ in range((step + i) % 3)]
                           for step in range(length)], pa.list_(agent))
        sequences.append(Sequence(
            f"s{i}", length, np.arange(length) / 10.0, scalars={"length": length, "duration_seconds": length / 10.0},
            trajectories={"action": action, "pose": rng.normal(size=(length, 2))},
            steps={"reward": None if i == 1 else pa.array([None if step == 2 else float(step) for step in range(length)], pa.float32()),
                   "count": pa.array([None if (step + i) % 4 == 0 else step for step in range(length)], pa.int64()),
                   "agents": agents}))
    return sequences, columns, mixtrain.sequences_to_table(sequences, columns)


def test_statistics_from_arrow_equal_those_of_the_rows_arrays_bit_for_bit():
    """stats.json must not change when statistics are read from the written Arrow columns: the
    same values in the same order as each row's arrays concatenated give the same bits."""
    from formats.mixtrain.stats import non_finite_counts, table_stats

    sequences, columns, table = _rows_with_holes()
    cells = {name: [np.asarray(s.steps[name]) for s in sequences if s.steps[name] is not None] for name in ("reward", "count")}
    expected = {
        "timestamp": ColumnStats.of(np.concatenate([s.timestamp for s in sequences])),
        "action": ColumnStats.of(np.concatenate([s.trajectories["action"] for s in sequences])),
        "pose": ColumnStats.of(np.concatenate([s.trajectories["pose"] for s in sequences])),
        "reward": ColumnStats.of(np.concatenate(cells["reward"])),
        "count": ColumnStats.of(np.concatenate(cells["count"])),
    }
    records = pa.concat_arrays([s.steps["agents"].flatten() for s in sequences])
    expected["agents.centroid"] = ColumnStats.of(records.field("centroid").flatten().to_numpy().reshape(-1, 2))
    expected["agents.yaw"] = ColumnStats.of(records.field("yaw").to_numpy().astype(np.float64)[:, None])
    got = table_stats(table, columns)
    assert sorted(got) == sorted(expected)
    assert json.dumps(summarise([got])) == json.dumps(summarise([expected]))  # every bit (NaN included, as text)
    assert got["reward"].count == sum(s.length for s in sequences if s.steps["reward"] is not None)  # the null cell left out
    # NaN/inf of the floats, and null elements, which numpy sees as NaN, are counted per column.
    assert non_finite_counts(table, columns) == {"action": 4, "reward": 3, "count": sum(
        1 for i, s in enumerate(sequences) for step in range(s.length) if (step + i) % 4 == 0)}
