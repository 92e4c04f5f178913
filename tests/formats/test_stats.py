import numpy as np
import pytest

from formats.stats import ColumnStats, summarise


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
