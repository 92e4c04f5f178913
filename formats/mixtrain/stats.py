"""Mergeable per-dimension statistics: mean, population std, min, max, count and quantiles.

A `ColumnStats` summarises [N, D] values and merges with another (Chan et al.'s pairwise update
for mean and M2, so no sum of squares loses precision). Quantiles come from a deterministic
compactor sketch (the Munro-Paterson / KLL idea, vectorised over D): exact while a partial holds
at most `capacity` rows, then each compaction halves a full level by keeping every other sorted
value, with rank error about log2(N / capacity) / capacity. The same inputs merged in the same
order give the same numbers; the writer merges per-shard partials in shard order.

Output shapes follow LeRobot's stats.json: every stat is a list of D values, `count` is [N];
image statistics (per channel, values in [0, 1]) are [C, 1, 1] as lerobot writes them.

`table_stats` and `non_finite_counts` read the rows a shard writer has just written straight from
their Arrow columns (one flat numpy view per column), never back through per-row Sequences.
"""

from __future__ import annotations

import dataclasses
import fractions

import numpy as np
import pyarrow as pa

from formats.errors import ConversionError
from formats.mixtrain import array_layout
from formats.sequence import STEPS, TIMESTAMPS, TRAJECTORY, ColumnSpec

__all__ = ["ColumnStats", "ImageStats", "QUANTILES", "sample_indices", "sketch_level_for", "summarise", "stats_columns",
           "table_stats", "non_finite_counts"]

QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}
DEFAULT_CAPACITY = 4096
_BLOCK_ROWS = 2 * DEFAULT_CAPACITY


@dataclasses.dataclass
class ColumnStats:
    count: int
    mean: np.ndarray  # [D] float64
    m2: np.ndarray  # [D] float64, sum of squared deviations
    min: np.ndarray  # [D] float64
    max: np.ndarray  # [D] float64
    levels: list[np.ndarray]  # levels[l]: [n_l, D] float64 rows each standing for 2**l values
    capacity: int = DEFAULT_CAPACITY
    image: bool = False  # per-channel image statistics: rendered as [C, 1, 1]
    # Integers past 2**53 (float64 steps by 2,048 near 2**63): the exact per-dimension value
    # (int64/uint64) that `mean` is relative to, the moments taken from exact differences to it.
    shift: np.ndarray | None = None

    @staticmethod
    def of(values: np.ndarray, capacity: int = DEFAULT_CAPACITY, sketch_level: int = 0, image: bool = False) -> ColumnStats:
        """Summarise [N, D] (or [N]) values; NaN propagates into mean/std as numpy does.

        Moments, min and max always use every value. `sketch_level` l > 0 feeds the quantile
        sketch every 2**l-th row at level l (each standing for 2**l values): for millions of
        pixels, where sorting them all would cost more than the quantiles are worth.
        """
        values = np.asarray(values)
        if values.ndim == 1:
            values = values[:, None]
        if len(values) > _BLOCK_ROWS and sketch_level == 0:
            # Long inputs in blocks: float64 temporaries stay at one block, not 2-3x the whole input.
            merged = ColumnStats.of(values[:_BLOCK_ROWS], capacity, 0, image)
            for start in range(_BLOCK_ROWS, len(values), _BLOCK_ROWS):
                merged = merged.merge(ColumnStats.of(values[start:start + _BLOCK_ROWS], capacity, 0, image))
            return merged
        data = values.astype(np.float64, copy=False)
        # Integers keep their own dtype where a stat is one of the values (min, max, the quantile
        # sketch): float64 holds integers exactly only up to 2**53.
        exact = values if _is_integer(values.dtype) else data
        low, high = exact.min(axis=0), exact.max(axis=0)
        shift = None
        if _is_integer(values.dtype) and _past_float(low, high, len(values)):
            shift, data = low.copy(), _differences(values, low)
        mean = data.mean(axis=0)
        levels = [np.zeros((0, data.shape[1]), exact.dtype)] * sketch_level + [exact[:: 2**sketch_level].copy()]
        stats = ColumnStats(
            count=data.shape[0],
            mean=mean,
            m2=((data - mean) ** 2).sum(axis=0),
            min=low,
            max=high,
            levels=levels,
            capacity=capacity,
            image=image,
            shift=shift,
        )
        stats._compact()
        return stats

    def merge(self, other: ColumnStats) -> ColumnStats:
        if self.count == 0:
            return other
        if other.count == 0:
            return self
        total = self.count + other.count
        shift, first, second = _aligned(self, other)  # the partials' means in one frame (exact integer offsets)
        delta = (second - first) + (other.mean - self.mean)
        mean = (self.mean + first) + delta * (other.count / total)
        m2 = self.m2 + other.m2 + delta**2 * (self.count * other.count / total)
        depth = max(len(self.levels), len(other.levels))
        levels = []
        for level in range(depth):
            parts = [ls[level] for ls in (self.levels, other.levels) if level < len(ls) and len(ls[level])]
            levels.append(np.concatenate(parts) if parts else np.zeros((0, self.mean.shape[0]), self.levels[0].dtype))
        merged = ColumnStats(total, mean, m2, np.minimum(self.min, other.min), np.maximum(self.max, other.max),
                             levels, self.capacity, self.image, shift)
        merged._compact()
        return merged

    def _compact(self) -> None:
        level = 0
        while level < len(self.levels):
            rows = self.levels[level]
            if len(rows) > self.capacity:
                ordered = np.sort(rows, axis=0)
                # Keep every other value; alternate the offset by level so errors do not pile up.
                leftover = ordered[len(ordered) - len(ordered) % 2:]
                kept = ordered[: len(ordered) - len(leftover)][level % 2::2]
                if level + 1 == len(self.levels):
                    self.levels.append(np.zeros((0, rows.shape[1]), rows.dtype))
                self.levels[level] = leftover
                self.levels[level + 1] = np.concatenate([self.levels[level + 1], kept])
            level += 1

    def quantiles(self) -> dict[str, np.ndarray]:
        """q01..q99 per dimension: inverted-CDF quantiles of the weighted sketch rows."""
        values = np.concatenate([rows for rows in self.levels if len(rows)])
        weights = np.concatenate([np.full(len(rows), 2.0**level) for level, rows in enumerate(self.levels) if len(rows)])
        order = np.argsort(values, axis=0, kind="stable")
        sorted_values = np.take_along_axis(values, order, axis=0)
        cumulative = np.cumsum(weights[order], axis=0)  # [n, D]
        total = cumulative[-1]
        result = {}
        for name, q in QUANTILES.items():
            # First sorted value whose cumulative weight reaches q * total (numpy's inverted_cdf).
            index = (cumulative < q * total).sum(axis=0)
            index = np.minimum(index, len(sorted_values) - 1)
            result[name] = sorted_values[index, np.arange(values.shape[1])]
        return result

    def to_json(self) -> dict:
        values = {"min": self.min, "max": self.max, **self.quantiles()}
        # Integer values are written as JSON numbers with a fraction (3.0) while float64 holds
        # every one of them exactly, as stats.json always had them; a column reaching past 2**53
        # has them written as integers, exact (its quantiles lie between min and max).
        exact = _is_integer(self.min.dtype) and max(np.abs(self.min.astype(object)).max(initial=0),
                                                    np.abs(self.max.astype(object)).max(initial=0)) > _FLOAT_EXACT
        mean = self.mean.tolist() if self.shift is None else \
            [float(fractions.Fraction(int(s)) + fractions.Fraction(m)) for s, m in zip(self.shift.tolist(), self.mean.tolist())]
        out = {
            "mean": mean,
            "std": np.sqrt(self.m2 / self.count).tolist(),
            "min": _rendered(values.pop("min"), exact),
            "max": _rendered(values.pop("max"), exact),
            "count": [int(self.count)],
        }
        out.update({name: _rendered(value, exact) for name, value in values.items()})
        if self.image:
            out = {name: (value if name == "count" else [[[v]] for v in value]) for name, value in out.items()}
        return out


# The largest integer magnitude below which float64 holds every integer exactly.
_FLOAT_EXACT = 2**53


def _is_integer(dtype: np.dtype) -> bool:
    return dtype.kind in "iu"


def _past_float(low: np.ndarray, high: np.ndarray, rows: int) -> bool:
    """Whether float64 could not sum `rows` of these values exactly (exact Python integers compared):
    microsecond timestamps (1.7e15) over a block of rows already lose bits."""
    return max((abs(int(value)) for value in (*low.tolist(), *high.tolist())), default=0) * max(1, rows) > _FLOAT_EXACT


def _differences(values: np.ndarray, low: np.ndarray) -> np.ndarray:
    """values - low, exactly, as float64: int64 through uint64, where the difference (below 2**64
    however far apart the values) wraps to its exact value."""
    if values.dtype.kind == "i":
        return (values.astype(np.int64).view(np.uint64) - low.astype(np.int64).view(np.uint64)).astype(np.float64)
    return (values - low).astype(np.float64)


def _aligned(first: ColumnStats, second: ColumnStats) -> tuple[np.ndarray | None, np.ndarray | float, np.ndarray | float]:
    """(the merged shift, each partial's offset to it as float64): zeros where neither is shifted;
    the offsets are exact integer differences, rounded once."""
    if first.shift is None and second.shift is None:
        return None, 0.0, 0.0
    shifts = [[int(value) for value in stats.shift.tolist()] if stats.shift is not None else None for stats in (first, second)]
    known = [shift for shift in shifts if shift is not None]
    base = [min(values) for values in zip(*known)]  # the shifted partials' frame: one in frame 0 would lose their bits again
    shifts = [shift if shift is not None else [0] * len(base) for shift in shifts]
    kind = (first.shift if first.shift is not None else second.shift).dtype
    offsets = [np.array([float(value - zero) for value, zero in zip(shift, base)]) for shift in shifts]
    return np.array(base, dtype=kind), offsets[0], offsets[1]


def _rendered(values: np.ndarray, exact: bool) -> list:
    """A stat's values for JSON: Python ints when `exact`, else floats (numbers as before)."""
    return values.tolist() if exact else values.astype(np.float64).tolist()


def sketch_level_for(rows: int, capacity: int = DEFAULT_CAPACITY) -> int:
    """The sketch level that feeds at most about 8 x capacity rows of `rows` to the quantile sketch."""
    return max(0, int(np.ceil(np.log2(max(1.0, rows / (8 * capacity))))))


def sample_indices(length: int, minimum: int = 100, maximum: int = 10_000, power: float = 0.75) -> np.ndarray:
    """Frames sampled for image statistics, by lerobot's rule (compute_stats.sample_indices):
    about length**0.75 evenly spaced frames, at least min(length, 100), at most 10,000."""
    if length <= 0:
        return np.zeros(0, np.int64)
    count = max(min(length, minimum), min(int(length**power), maximum))
    return np.unique(np.round(np.linspace(0, length - 1, count)).astype(np.int64))


class ImageStats:
    """Per-channel statistics of a sequence's sampled frames, values scaled to [0, 1].

    Frames larger than 300 px on a side are strided down to about 150 px first, as lerobot's
    `auto_downsample_height_width` does; every remaining pixel counts towards mean/std/min/max.
    """

    def __init__(self, length: int):
        self.wanted = set(sample_indices(length).tolist())
        self._pixels: list[np.ndarray] = []

    def add(self, image: np.ndarray) -> None:
        """One sampled frame: [H, W, C] or [H, W], uint8 or uint16."""
        scale = float(np.iinfo(image.dtype).max) if np.issubdtype(image.dtype, np.integer) else 1.0
        if image.ndim == 2:
            image = image[:, :, None]
        if self._pixels and image.shape[2] != self._pixels[0].shape[1]:
            if image.shape[2] == 1:  # a gray frame in a colour camera: gray is R = G = B
                image = np.repeat(image, self._pixels[0].shape[1], axis=2)
            else:
                raise ConversionError(f"a frame with {image.shape[2]} channels after frames with {self._pixels[0].shape[1]}")
        height, width = image.shape[:2]
        if max(height, width) >= 300:
            factor = int(max(height, width) / 150)
            image = image[::factor, ::factor]
        self._pixels.append(image.reshape(-1, image.shape[2]).astype(np.float32) / scale)

    def result(self) -> ColumnStats | None:
        if not self._pixels:
            return None
        pixels = np.concatenate(self._pixels)
        return ColumnStats.of(pixels, sketch_level=sketch_level_for(len(pixels)), image=True)


def summarise(partials: list[dict[str, ColumnStats]]) -> dict[str, dict]:
    """Merge per-shard partials in the given order and render stats.json."""
    merged: dict[str, ColumnStats] = {}
    for partial in partials:
        for name, stats in partial.items():
            merged[name] = merged[name].merge(stats) if name in merged else stats
    return {name: merged[name].to_json() for name in sorted(merged)}


def stats_columns(columns: list[ColumnSpec]) -> list[ColumnSpec]:
    """Numeric per-step columns: trajectories, timestamps, numeric steps (not bool, not text)."""
    chosen = []
    for spec in columns:
        if spec.meta.get("stats") is False:
            continue
        if spec.kind in (TRAJECTORY, TIMESTAMPS):
            chosen.append(spec)
        elif spec.kind == STEPS:
            value_type = spec.arrow_type.value_type
            if pa.types.is_integer(value_type) or pa.types.is_floating(value_type):
                chosen.append(spec)
    return chosen


def _cell_values(column: pa.ChunkedArray) -> pa.Array:
    """Every step of every non-null cell of a list column, in row order, as one array."""
    return column.combine_chunks().flatten()


def _step_values(table: pa.Table, spec: ColumnSpec) -> np.ndarray:
    """A per-step column's values as numpy: [steps, dim] for trajectories, [steps] otherwise.
    Null elements become NaN (integers then float64), as `pa.Array.to_numpy` makes them."""
    if spec.kind == TRAJECTORY and array_layout.is_bytes(spec.meta):  # --array_layout=bytes: raw cells
        return array_layout.column_values(table.column(spec.name).combine_chunks(), spec.meta["dtype"], int(spec.meta["dim"]))
    values = _cell_values(table.column(spec.name))
    if spec.kind == TRAJECTORY:
        return values.flatten().to_numpy(zero_copy_only=False).reshape(-1, spec.arrow_type.value_type.list_size)
    return values.to_numpy(zero_copy_only=False)


def table_stats(table: pa.Table, columns: list[ColumnSpec]) -> dict[str, ColumnStats]:
    """Statistics of a batch of written rows (a row group), per stats.json key.

    The values are the same numbers in the same order as the rows' per-sequence arrays
    concatenated, so the floating-point results are too.
    """
    stats = {}
    for spec in stats_columns(columns):
        column = table.column(spec.name)
        if spec.kind == STEPS and column.null_count == len(column):  # only null cells: no values, no statistics
            continue
        stats[spec.name] = ColumnStats.of(_step_values(table, spec))
    for spec in columns:  # per-step records (L5Kit agents): statistics of the named fields, over all records
        fields = spec.meta.get("stats_fields") or ()
        if not fields:
            continue
        records = _cell_values(table.column(spec.name)).flatten()
        if not len(records):
            continue
        for field in fields:
            values = records.field(field)
            if pa.types.is_fixed_size_list(values.type):
                values = values.flatten()
            data = values.to_numpy(zero_copy_only=False)
            data = (data if _is_integer(data.dtype) else data.astype(np.float64)).reshape(len(records), -1)
            stats[f"{spec.name}.{field}"] = ColumnStats.of(data, sketch_level=sketch_level_for(len(data)))
    return stats


def non_finite_counts(table: pa.Table, columns: list[ColumnSpec]) -> dict[str, int]:
    """NaN and inf values per float column of a batch of written rows: kept as they are, counted
    for the summary."""
    counts = {}
    for spec in columns:
        if spec.kind not in (TRAJECTORY, TIMESTAMPS, STEPS):
            continue
        if spec.kind == STEPS and not _is_primitive(spec.arrow_type.value_type):
            continue  # nested or text steps: no float values to count
        values = _step_values(table, spec)
        total = int(np.count_nonzero(~np.isfinite(values))) if values.dtype.kind == "f" else 0
        if total:
            counts[spec.name] = total
    return counts


def _is_primitive(kind: pa.DataType) -> bool:
    return pa.types.is_integer(kind) or pa.types.is_floating(kind)
