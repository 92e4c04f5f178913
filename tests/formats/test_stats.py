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


# --- integers are exact (issue 27, item 9): float64 holds integers exactly only up to 2**53 ---------

EXTREME = {
    "int64": np.array([[2**63 - 1, 7], [-2**63, 2**53 + 1], [2**53 + 1, -(2**53) - 3], [5, 2**62 + 1]], np.int64),
    "uint64": np.array([[2**64 - 1, 0], [2**63 + 1, 2**53 + 1], [3, 2**64 - 2]], np.uint64),
}


def _exact_quantiles(values: np.ndarray) -> dict[str, list[int]]:
    """q01..q99 (inverted CDF) per dimension over Python ints: no float anywhere."""
    columns = [sorted(int(v) for v in values[:, d]) for d in range(values.shape[1])]
    picked = {}
    for name, q in (("q01", 0.01), ("q10", 0.10), ("q50", 0.50), ("q90", 0.90), ("q99", 0.99)):
        picked[name] = [column[min(len(column) - 1, max(0, -(-int(q * 10**6) * len(column) // 10**6) - 1))] for column in columns]
    return picked


@pytest.mark.parametrize("dtype", sorted(EXTREME))
def test_integer_min_max_and_quantiles_are_exact_through_merges_and_json(dtype):
    from formats import mixtrain

    values = EXTREME[dtype]
    merged = summarise([{"x": ColumnStats.of(values[:1])}, {"x": ColumnStats.of(values[1:])}])["x"]
    out = json.loads(mixtrain.dumps(merged))
    assert out["min"] == [min(int(v) for v in values[:, d]) for d in range(2)]
    assert out["max"] == [max(int(v) for v in values[:, d]) for d in range(2)]
    assert all(isinstance(v, int) for key in ("min", "max", "q50") for v in out[key])
    for name, expected in _exact_quantiles(values).items():
        assert out[name] == expected, name
    assert out["count"] == [len(values)]


def test_integer_quantiles_stay_values_of_the_column_after_compaction():
    rng = np.random.default_rng(5)
    values = (2**63 - 1 - rng.integers(0, 2**20, size=(30_000, 1))).astype(np.int64)  # 2**63 - 1 - k: float64 rounds them all to 2**63
    parts = [{"x": ColumnStats.of(values[i:i + 7_000])} for i in range(0, len(values), 7_000)]
    out = summarise(parts)["x"]
    present = {int(v) for v in values[:, 0]}
    assert out["min"] == [int(values.min())] and out["max"] == [2**63 - 1 - int((2**63 - 1 - values).min())]
    assert all(q[0] in present for q in (out["q01"], out["q50"], out["q99"]))
    assert out["q01"][0] < out["q50"][0] < out["q99"][0]  # distinct: not all rounded to one float


def test_integer_columns_within_float_range_are_written_as_before():
    """Small integers keep their float rendering (stats.json byte-identical to earlier versions)."""
    out = ColumnStats.of(np.array([[1, -2**53], [3, 2**53]], np.int64)).to_json()
    assert out["min"] == [1.0, float(-2**53)] and all(isinstance(v, float) for v in out["min"] + out["max"] + out["q50"])


def test_integer_step_column_statistics_from_arrow_are_exact():
    from formats import mixtrain
    from formats.mixtrain.stats import table_stats
    from formats.sequence import STEPS, ColumnSpec

    cells = [[2**63 - 1, 2**53 + 1], [-2**63, 2**53 + 1, 0]]
    table = pa.table({"counter": pa.array(cells, pa.list_(pa.int64()))})
    out = json.loads(mixtrain.dumps(summarise([table_stats(table, [ColumnSpec("counter", STEPS, pa.list_(pa.int64()))])])))
    assert out["counter"]["min"] == [-2**63] and out["counter"]["max"] == [2**63 - 1] and out["counter"]["q50"] == [2**53 + 1]


@pytest.mark.parametrize(("dtype", "base"), [(np.int64, 2**63 - 10_000), (np.int64, -2**63 + 5), (np.uint64, 2**64 - 10_000)],
                         ids=["int64-top", "int64-bottom", "uint64-top"])
def test_integer_moments_are_right_whatever_their_magnitude(dtype, base):
    """Near +-2**63 float64 steps by 2,048: an int64 column's std came out 1010.7 where it is 199.8.
    Moments are taken from exact differences to the column's minimum, in blocks and merged."""
    import functools

    offsets = np.random.default_rng(0).integers(0, 700, size=(50_000, 2))
    values = np.array([[base + int(v) for v in row] for row in offsets.tolist()], dtype=dtype)
    expected_std, expected_mean = offsets.std(axis=0), offsets.mean(axis=0)
    stats = ColumnStats.of(values)  # 50,000 rows: several blocks, merged
    merged = functools.reduce(ColumnStats.merge, [ColumnStats.of(part) for part in np.array_split(values, 7)])
    for result in (stats, merged):
        rendered = result.to_json()
        assert np.allclose(rendered["std"], expected_std, rtol=1e-9, atol=0), rendered["std"]
        assert rendered["mean"] == pytest.approx([float(base) + m for m in expected_mean], rel=1e-15)
        assert rendered["min"] == [base + int(v) for v in offsets.min(axis=0)] and rendered["max"] == [base + int(v) for v in offsets.max(axis=0)]


def test_an_integer_column_spanning_the_whole_int64_range_keeps_its_moments():
    values = np.array([[-2**63 + 1], [2**63 - 1], [0], [2**62]], dtype=np.int64)
    exact = [int(v) for v in values[:, 0].tolist()]
    mean = sum(exact) / len(exact)
    std = (sum((v - mean) ** 2 for v in exact) / len(exact)) ** 0.5
    rendered = ColumnStats.of(values).to_json()
    assert rendered["std"][0] == pytest.approx(std, rel=1e-12) and rendered["mean"][0] == pytest.approx(mean, rel=1e-12, abs=1.0)


def test_small_integer_columns_keep_their_numbers_bit_for_bit():
    """The exact path is taken only past 2**53: columns of ordinary integers keep the numbers they had."""
    values = np.random.default_rng(1).integers(-1000, 1000, size=(20_000, 3))
    data = values.astype(np.float64)
    rendered = ColumnStats.of(values).to_json()
    assert rendered["mean"] == ColumnStats.of(data).to_json()["mean"]
    assert rendered["std"] == ColumnStats.of(data).to_json()["std"]


def test_integers_whose_sums_pass_float64_keep_their_moments():
    """Below 2**53 each value is exact, but their sum is not: a constant column of microsecond
    timestamps had std 0.5; a shifted block merged with an unshifted one fell back to frame 0."""
    constant = np.full((1000, 1), 1_700_000_000_123_457, dtype=np.int64)
    rendered = ColumnStats.of(constant).to_json()
    assert rendered["std"] == [0.0] and rendered["mean"] == [1_700_000_000_123_457.0]
    low = ColumnStats.of(np.array([[2**53 - 3], [2**53 - 1], [2**53]], dtype=np.int64))
    high = ColumnStats.of(np.array([[2**53 + 1], [2**53 + 3]], dtype=np.int64))
    from fractions import Fraction

    whole = [2**53 - 3, 2**53 - 1, 2**53, 2**53 + 1, 2**53 + 3]
    mean = Fraction(sum(whole), 5)
    variance = sum((v - mean) ** 2 for v in whole) / 5
    assert low.merge(high).to_json()["std"][0] == pytest.approx(float(variance) ** 0.5, rel=1e-12)  # 2.0
