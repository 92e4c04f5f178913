"""Data-quality findings, computed from the rows the shard writers write (the conversion's own pass,
beside the statistics) or from a published dataset's shards on demand (`findings_of_dataset`).

A finding is one defect a training run would trip on or that someone should look at: NaN in an
action, a dimension stuck for most of an episode, a dropped frame, a duplicate episode. Each has a
check name, a level (`error`: cannot train on it as is; `warning`: look at it), the sequence and
the step range, the column and dimensions, and a message. They are kept in `_quality.jsonl`, this
converter's extension (docs/format.md): its first line says what was checked and with which
thresholds, and counts every finding per check; then one finding a line, at most MAX_LISTED a
check (the worst first), so that a dataset with a million findings keeps a small file.

Everything per sequence is computed on a row group's flat arrays at once (numpy over every step
of every row; Python only for the rows that have a finding, and a digest call per row): the checks cost a few percent of a
conversion's CPU. What needs the whole dataset (a dimension that never varies, values at the
dataset's bound, duplicates, rare tasks) is kept small per row group and decided by `finish`:
digests of 16 bytes for duplicates, never the arrays.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import math
from collections.abc import Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from formats.errors import FormatError
from formats.mixtrain import QUALITY_FILE, array_layout
from formats.sequence import SCALAR, STEPS, TIMESTAMPS, TRAJECTORY, ColumnSpec
from formats.storage import parse_json

__all__ = ["QUALITY_FILE", "Thresholds", "CHECKS", "Partial", "group_partial", "finish", "encode", "decode", "MAX_LISTED",
           "ERROR", "WARNING", "is_action"]

VERSION = 1
ERROR, WARNING = "error", "warning"
MAX_LISTED = 1000  # findings listed per check in _quality.jsonl (all are counted); each shard keeps as many


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """What counts as a finding; each has a --quality_<name> option (docs/quality.md)."""

    jump_sigma: float = 6.0  # a step change this many standard deviations from the sequence's mean change
    frozen_share: float = 0.9  # a dimension unchanged over at least this share of a sequence's steps
    frozen_min_steps: int = 20  # ... of a sequence of at least this many steps
    clip_steps: int = 10  # consecutive steps at the dataset's min or max of a dimension that moves
    gap_factor: float = 1.5  # a timestamp step longer than this many frame periods (a dropped frame)
    drift: float = 0.02  # the mean step off the declared period by more than this share
    first_time: float = 1.0  # the source clock's first value further than this from 0 (seconds)
    min_length: int = 2  # sequences shorter than this many steps
    idle_steps: int = 10  # at least this many steps without an action change at the start or the end
    min_task_sequences: int = 2  # tasks with fewer sequences than this

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


# check -> (level, what it finds, the thresholds it reads)
CHECKS = {
    "non_finite": (ERROR, "NaN or Inf in a numeric per-step column", ()),
    "time_order": (ERROR, "timestamps that go back or repeat", ()),
    "zero_variance": (WARNING, "a trajectory dimension with the same value in every step of every sequence", ()),
    "clipped": (WARNING, "a dimension that moves, held at the dataset's min or max for consecutive steps", ("clip_steps",)),
    "frozen": (WARNING, "a dimension unchanged over most of a sequence (a stuck actuator)", ("frozen_share", "frozen_min_steps")),
    "jump": (WARNING, "a step change far outside the sequence's spread of changes", ("jump_sigma",)),
    "time_gap": (WARNING, "a timestamp step longer than the declared rate allows (dropped frames)", ("gap_factor",)),
    "rate_drift": (WARNING, "a sequence's mean step off the declared frame period", ("drift",)),
    "clock_start": (WARNING, "the source clock's first value far from 0", ("first_time",)),
    "short": (WARNING, "a sequence shorter than a policy's window", ("min_length",)),
    "duplicate": (WARNING, "a sequence whose trajectories equal another's, value for value", ()),
    "idle": (WARNING, "steps without an action change at the start or the end of a sequence", ("idle_steps",)),
    "rare_task": (WARNING, "a task with very few sequences", ("min_task_sequences",)),
    "dead_camera": (WARNING, "a camera whose sampled frames hold one value per channel", ()),
}


def _finding(check: str, sequence_id: str | None, message: str, *, column: str | None = None, dims: list[int] | None = None,
             steps: tuple[int, int] | None = None, score: float = 1.0) -> dict:
    return {"check": check, "level": CHECKS[check][0], "sequence_id": sequence_id, "column": column,
            "dims": dims, "steps": list(steps) if steps is not None else None, "score": float(score), "message": message}


REPEATED_MIN = 10  # a dimension frozen in every one of at least this many long sequences is a repeated value, not an actuator
FROZEN_SETS = 256  # distinct (column, dimensions) sets of frozen findings kept apart; more share one bucket


@dataclasses.dataclass
class Partial:
    """What a row group (or a shard, or the dataset) found, in a form that merges in any order to
    the same result: findings kept per check (at most MAX_LISTED, the highest scores) with exact
    counts, and what `finish` decides over the whole dataset, each in memory of the columns'
    dimensions, not of the sequences (but the 16-byte digests)."""

    sequences: int = 0
    listed: dict[str, list[dict]] = dataclasses.field(default_factory=dict)
    counts: dict[str, int] = dataclasses.field(default_factory=dict)
    # column -> (least and greatest value per dimension, NaN left out; steps seen)
    bounds: dict[str, tuple[np.ndarray, np.ndarray, int]] = dataclasses.field(default_factory=dict)
    # (column, dim, "min"|"max") -> (the most extreme value a sequence was held at, how many were, listed findings)
    clips: dict[tuple[str, int, str], tuple[float, int, list[dict]]] = dataclasses.field(default_factory=dict)
    # (column, frozen dims or None for the shared bucket) -> (count, listed findings); `finish` takes out
    # the dimensions that never vary, or are frozen in every sequence (an embedding repeated per step)
    frozen: dict[tuple[str, tuple[int, ...] | None], tuple[int, list[dict]]] = dataclasses.field(default_factory=dict)
    frozen_dims: dict[str, tuple[np.ndarray, int]] = dataclasses.field(default_factory=dict)  # column -> (sequences frozen per dim, eligible)
    digests: list[tuple[bytes, str]] = dataclasses.field(default_factory=list)
    tasks: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    checked: set = dataclasses.field(default_factory=set)

    def add(self, finding: dict) -> None:
        check = finding["check"]
        self.counts[check] = self.counts.get(check, 0) + 1
        kept = self.listed.setdefault(check, [])
        kept.append(finding)
        if len(kept) > 2 * MAX_LISTED:
            self.listed[check] = _worst(kept)

    def add_frozen(self, column: str, dims: tuple[int, ...] | None, finding: dict | None, count: int = 1,
                   findings: list[dict] | None = None) -> None:
        """Count frozen findings under their (column, dims) set. The FROZEN_SETS smallest sets keep a
        bucket each, the others share (column, None): the same buckets whatever order they came in."""
        key = (column, dims)
        total, kept = self.frozen.get(key, (0, []))
        kept = kept + ([finding] if finding else []) + (findings or [])
        self.frozen[key] = (total + count, _worst(kept) if len(kept) > 2 * MAX_LISTED else kept)
        own = sorted(key for key in self.frozen if key[1] is not None)
        for evicted in own[FROZEN_SETS:]:
            moved, listed = self.frozen.pop(evicted)
            shared, held = self.frozen.get((evicted[0], None), (0, []))
            self.frozen[(evicted[0], None)] = (shared + moved, _worst(held + listed))

    def add_clip(self, key: tuple[str, int, str], value: float, findings: list[dict], count: int) -> None:
        held = self.clips.get(key)
        if held is None or (value > held[0] if key[2] == "max" else value < held[0]):
            self.clips[key] = (value, count, _worst(findings))
        elif value == held[0]:
            self.clips[key] = (value, held[1] + count, _worst(held[2] + findings))

    def add_bounds(self, column: str, low: np.ndarray, high: np.ndarray, steps: int) -> None:
        held = self.bounds.get(column)
        if held is not None and len(held[0]) == len(low):
            low, high, steps = np.fmin(held[0], low), np.fmax(held[1], high), held[2] + steps
        self.bounds[column] = (low, high, steps)

    def add_frozen_dims(self, column: str, frozen: np.ndarray, eligible: int) -> None:
        held = self.frozen_dims.get(column)
        if held is not None and len(held[0]) == len(frozen):
            frozen, eligible = held[0] + frozen, held[1] + eligible
        self.frozen_dims[column] = (frozen, eligible)

    def merge(self, other: Partial) -> Partial:
        self.sequences += other.sequences
        for check, count in other.counts.items():
            self.counts[check] = self.counts.get(check, 0) + count
            self.listed[check] = _worst(self.listed.get(check, []) + other.listed.get(check, []))
        for column, (low, high, steps) in other.bounds.items():
            self.add_bounds(column, low, high, steps)
        for key, (value, count, findings) in other.clips.items():
            self.add_clip(key, value, findings, count)
        for (column, dims), (count, findings) in sorted(other.frozen.items(), key=lambda item: (item[0][0], item[0][1] or ())):
            self.add_frozen(column, dims, None, count, findings)
        for column, (frozen, eligible) in other.frozen_dims.items():
            self.add_frozen_dims(column, frozen, eligible)
        self.digests += other.digests
        self.tasks.update(other.tasks)
        self.checked |= other.checked
        return self


def _worst(findings: list[dict]) -> list[dict]:
    """The MAX_LISTED highest scores, ties in sequence order: the same list however rows were grouped."""
    return sorted(findings, key=lambda f: (-f["score"], f["sequence_id"] or "", f["column"] or "", f["steps"] or [],
                                           f["dims"] or []))[:MAX_LISTED]


# --- per row group ---------------------------------------------------------------------------------

def _cell_lengths(column: pa.ChunkedArray | pa.Array, lengths: np.ndarray) -> np.ndarray:
    """Steps per row of a per-step column: the row's length, 0 for a null cell."""
    valid = np.asarray(pc.is_valid(column).to_numpy(zero_copy_only=False), bool) if column.null_count else np.ones(len(lengths), bool)
    return np.where(valid, lengths, 0)


def _flat(table: pa.Table, spec: ColumnSpec) -> np.ndarray | None:
    """A per-step column's values of every row, [steps] or [steps, D], or None when not numeric."""
    from formats.mixtrain.stats import _step_values

    if spec.kind == STEPS and not (pa.types.is_integer(spec.arrow_type.value_type) or pa.types.is_floating(spec.arrow_type.value_type)):
        return None
    if spec.kind == TRAJECTORY and not array_layout.is_bytes(spec.meta):
        value_type = spec.arrow_type.value_type.value_type
        if not (pa.types.is_integer(value_type) or pa.types.is_floating(value_type)):
            return None
    values = _step_values(table, spec)
    return values if values.dtype.kind in "iuf" else None


class _Rows:
    """Where each row's steps lie in a flat per-step array, and the step changes inside rows."""

    def __init__(self, lengths: np.ndarray):
        self.lengths = lengths
        self.starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        self.row_of_step = np.repeat(np.arange(len(lengths)), lengths)
        changes = np.maximum(lengths - 1, 0)
        self.changes = changes
        self.change_starts = np.concatenate([[0], np.cumsum(changes)[:-1]]).astype(np.int64)
        self.inner = self.row_of_step[1:] == self.row_of_step[:-1]  # a step change within one row
        self.row_of_change = self.row_of_step[1:][self.inner]

    def subset(self, chosen: np.ndarray) -> tuple[np.ndarray, np.ndarray, _Rows]:
        """The steps and the changes of rows `chosen` (ascending), as masks, and their own _Rows."""
        picked = np.zeros(len(self.lengths), bool)
        picked[chosen] = True
        return picked[self.row_of_step], picked[self.row_of_change], _Rows(self.lengths[chosen])

    def per_row(self, ufunc, values: np.ndarray, starts: np.ndarray, counts: np.ndarray, empty) -> np.ndarray:
        """`ufunc.reduceat` over each row's slice (its `counts` at `starts`); rows with none get `empty`."""
        shape = (len(counts), *values.shape[1:])
        kind = np.int64 if values.dtype == bool else np.result_type(values.dtype, type(empty))
        out = np.full(shape, empty, dtype=kind)
        some = counts > 0
        if some.any():  # sums accumulate in float64 (float32 sums of squares lose the deviations of a drifting signal)
            wide = {"dtype": np.float64 if values.dtype.kind == "f" else np.int64} if ufunc is np.add else {}  # bools: counted
            out[some] = ufunc.reduceat(values, starts[some], axis=0, **wide)
        return out


CHUNK_BYTES = 4 << 20  # per-step values checked at once: the checks' temporaries are a few times this


def group_partial(table: pa.Table, columns: list[ColumnSpec], fps: float | None, thresholds: Thresholds,
                  facts: list[dict] | None = None) -> Partial:
    """The findings of a row group's rows (`table`: Mixtrain rows), and what `finish` needs of them.
    `facts`: per row, what only the conversion's pass knows (`clock_start`: the source clock's
    first value in seconds; `images`: {video column: ColumnStats of its sampled frames}), or None.
    A row group of long sequences is checked CHUNK_BYTES of values at a time (the result does not
    depend on how rows are grouped): its temporaries would otherwise be several times the group."""
    per_step = [spec.name for spec in columns if spec.kind in (TRAJECTORY, STEPS, TIMESTAMPS) and spec.name in table.column_names]
    size = sum(table.column(name).nbytes for name in per_step)
    if table.num_rows > 1 and size > CHUNK_BYTES:
        lengths = np.asarray(table.column("length").to_numpy(zero_copy_only=False), np.int64)
        weight = np.cumsum(np.maximum(lengths, 1)) * (size / max(int(np.maximum(lengths, 1).sum()), 1))
        cuts = np.searchsorted(weight, np.arange(CHUNK_BYTES, weight[-1], CHUNK_BYTES), side="right")
        found = Partial()
        for start, stop in zip([0, *cuts.tolist()], [*cuts.tolist(), table.num_rows]):
            if stop > start:
                found.merge(_checked(table.slice(start, stop - start).combine_chunks(), columns, fps, thresholds,
                                     None if facts is None else facts[start:stop]))
        return found
    return _checked(table, columns, fps, thresholds, facts)


def _checked(table: pa.Table, columns: list[ColumnSpec], fps: float | None, thresholds: Thresholds,
             facts: list[dict] | None) -> Partial:
    partial = Partial(sequences=table.num_rows)
    if not table.num_rows:
        return partial
    ids = table.column("sequence_id").to_pylist()
    lengths = np.asarray(table.column("length").to_numpy(zero_copy_only=False), np.int64)
    partial.checked.update({"short", "non_finite"})
    for row in np.flatnonzero(lengths < thresholds.min_length):
        length = int(lengths[row])
        partial.add(_finding("short", ids[row], f"{length} steps, fewer than {thresholds.min_length}",
                             steps=(0, length - 1) if length else None, score=thresholds.min_length - length))
    digests = [hashlib.blake2b(digest_size=16) for _ in ids]
    hashed = np.zeros(len(ids), bool)
    actions: list[str] = []
    full = _Rows(lengths)  # every row's steps, for what is combined across columns with null cells
    acted = np.zeros(len(full.row_of_change), bool)  # whether any action column changed, at each change of each row
    acting = np.zeros(len(ids), bool)  # rows with some action column
    by_name = {spec.name: spec for spec in columns}
    for spec in columns:
        if spec.kind not in (TRAJECTORY, STEPS, TIMESTAMPS) or spec.name not in table.column_names:
            continue
        values = _flat(table, spec)
        if values is None:
            continue
        steps = _cell_lengths(table.column(spec.name), lengths)
        if int(steps.sum()) != len(values):
            raise FormatError(f"column {spec.name!r}: {len(values)} steps where the rows' lengths add up to {int(steps.sum())}")
        if spec.kind == TRAJECTORY:
            partial.checked.update({"frozen", "jump", "clipped", "zero_variance"})
            if is_action(spec.name):
                actions.append(spec.name)
        if not len(values):
            continue  # every row of the group empty or null here
        rows = _Rows(steps)
        flat2d = values.reshape(len(values), -1)
        if values.dtype.kind == "f":
            _non_finite(partial, ids, spec.name, flat2d, rows)
        if spec.kind == TIMESTAMPS:
            _time(partial, ids, flat2d[:, 0], rows, fps, thresholds)
        elif spec.kind == TRAJECTORY:
            changed = _trajectory(partial, ids, spec.name, flat2d, rows, thresholds)
            if is_action(spec.name) and changed is not None:
                # this column's changes are those of the rows that hold it, in row order: placed per row
                present = steps == lengths
                acted[present[full.row_of_change]] |= changed
                acting |= present & (steps > 0)
            # duplicates: each row's arrays, with the column's name and step count (no two layouts collide)
            raw = np.ascontiguousarray(flat2d).view(np.uint8).reshape(len(flat2d), -1)
            name = b"%d:%s:" % (len(spec.name.encode()), spec.name.encode())
            for row, start, count in zip(np.flatnonzero(steps).tolist(), rows.starts[steps > 0].tolist(), steps[steps > 0].tolist()):
                digest = digests[row]
                digest.update(name + count.to_bytes(8, "little"))
                digest.update(raw[start:start + count])  # a contiguous slice: hashed in place
            hashed |= steps > 0
    if actions:  # idle: no action column changes at all, the action columns taken together
        partial.checked.add("idle")
        if acting.any():
            _idle(partial, ids, ",".join(actions), acted, full, thresholds, acting)
    if any(spec.kind == TRAJECTORY for spec in columns):
        partial.checked.add("duplicate")
        partial.digests = [(digests[row].digest(), ids[row]) for row in np.flatnonzero(hashed)]
    if "task" in by_name and by_name["task"].kind == SCALAR and pa.types.is_string(by_name["task"].arrow_type):
        partial.checked.add("rare_task")
        partial.tasks.update(task for task in table.column("task").to_pylist() if task is not None)
    if facts is not None:
        _facts(partial, ids, facts, thresholds)
    return partial


def _ranges(positions: np.ndarray) -> tuple[int, int]:
    return int(positions.min()), int(positions.max())


def _by_row(positions: np.ndarray, row_of: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
    """(row, its positions) for ascending `positions` whose rows `row_of` ascend too."""
    if not len(positions):
        return
    rows, starts = np.unique(row_of, return_index=True)
    yield from zip(rows.tolist(), np.split(positions, starts[1:]))


def _non_finite(partial: Partial, ids: list[str], column: str, values: np.ndarray, rows: _Rows) -> None:
    finite = np.isfinite(values)
    if finite.all():  # the common case, without a reduction across each step's dimensions
        return
    bad = ~finite
    steps = np.flatnonzero(bad.any(axis=1))
    for row, mine in _by_row(steps, rows.row_of_step[steps]):
        local = mine - rows.starts[row]
        cells = bad[mine]
        found = values[mine][cells]
        kinds = "/".join(kind for kind, present in (("NaN", np.isnan(found).any()), ("Inf", np.isinf(found).any())) if present)
        dims = [int(d) for d in np.flatnonzero(cells.any(axis=0))]
        partial.add(_finding("non_finite", ids[row], f"{int(cells.sum())} {kinds} value(s) in steps {local.min()}-{local.max()}",
                             column=column, dims=dims if values.shape[1] > 1 else None, steps=_ranges(local), score=float(cells.sum())))


def _time(partial: Partial, ids: list[str], times: np.ndarray, rows: _Rows, fps: float | None, thresholds: Thresholds) -> None:
    partial.checked.update({"time_order", "clock_start"})
    some = rows.lengths > 0
    first = np.zeros(len(rows.lengths))
    first[some] = times[rows.starts[some]]
    for row in np.flatnonzero(np.isfinite(first) & (np.abs(first) > thresholds.first_time)):
        partial.add(_finding("clock_start", ids[row], f"the timestamp column starts at {first[row]:.6g} s, not 0",
                             column="timestamp", steps=(0, 0), score=abs(float(first[row]))))
    if not len(rows.row_of_change):
        return
    delta = np.diff(times)[rows.inner]
    local = np.arange(len(delta)) - rows.change_starts[rows.row_of_change] + 1  # the later step of each change
    back = delta <= 0
    where = np.flatnonzero(back)
    for row, mine in _by_row(where, rows.row_of_change[where]):
        partial.add(_finding("time_order", ids[row], f"{len(mine)} timestamp step(s) go back or repeat, first at step "
                                                       f"{int(local[mine].min())}", column="timestamp", steps=_ranges(local[mine]),
                             score=float(len(mine))))
    if not fps:
        return
    partial.checked.update({"time_gap", "rate_drift"})
    period = 1.0 / fps
    gap = delta > thresholds.gap_factor * period
    where = np.flatnonzero(gap)
    for row, mine in _by_row(where, rows.row_of_change[where]):
        longest = float(delta[mine].max())
        partial.add(_finding("time_gap", ids[row], f"{len(mine)} step(s) longer than {thresholds.gap_factor:g} frame periods, "
                                                     f"the longest {longest:.4g} s ({longest * fps:.3g} periods)",
                             column="timestamp", steps=(int(local[mine].min()) - 1, int(local[mine].max())), score=longest * fps))
    regular = np.where(gap | back, 0.0, delta)
    counted = rows.per_row(np.add, ~(gap | back), rows.change_starts, rows.changes, 0)
    total = rows.per_row(np.add, regular, rows.change_starts, rows.changes, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        off = np.abs(total / np.maximum(counted, 1) * fps - 1.0)
    for row in np.flatnonzero((counted >= 2) & (off > thresholds.drift)):
        mean = total[row] / counted[row]
        partial.add(_finding("rate_drift", ids[row], f"mean step {mean:.6g} s against the declared {period:.6g} s ({fps:g} fps): "
                                                       f"{off[row] * 100:.2g}% off", column="timestamp",
                             steps=(0, int(rows.lengths[row]) - 1), score=float(off[row])))


def is_action(column: str) -> bool:
    """The columns whose changes are the robot acting: `action`, and `action_*` / `*_action` (RLDS's
    action fields, flattened), in any of the separators sources use."""
    return column == "action" or column.startswith(("action_", "action.", "action/")) or column.endswith(("_action", ".action", "/action"))


def _trajectory(partial: Partial, ids: list[str], column: str, values: np.ndarray, rows: _Rows,
                thresholds: Thresholds) -> np.ndarray | None:
    """The trajectory checks of one column; returns whether any dimension changed, per change
    (None: no changes), for the idle check."""
    by_dimension = np.ascontiguousarray(values.T)  # reduced along contiguous memory: 10x faster than along axis 0 of [N, D]
    with np.errstate(invalid="ignore"):  # an all-NaN dimension: NaN bounds, never a single value
        partial.add_bounds(column, np.fmin.reduce(by_dimension, axis=1).astype(np.float64),
                           np.fmax.reduce(by_dimension, axis=1).astype(np.float64), len(values))
    if not len(rows.row_of_change):
        return None
    floats = values if values.dtype.kind == "f" else values.astype(np.float64)  # float32 stays: half the memory traffic
    with np.errstate(invalid="ignore", over="ignore"):  # Inf - Inf: NaN, a change (the non_finite check names it)
        delta = np.diff(floats, axis=0)[rows.inner]  # [changes, D]
    moved = delta != 0  # NaN counts as a change
    counts = rows.changes
    unchanged = counts[:, None] - rows.per_row(np.add, moved, rows.change_starts, counts, 0)
    # frozen: a dimension unchanged over most steps of a long enough sequence
    with np.errstate(invalid="ignore", divide="ignore"):
        share = unchanged / np.maximum(counts, 1)[:, None]
    long_enough = rows.lengths >= thresholds.frozen_min_steps
    frozen = (share >= thresholds.frozen_share) & long_enough[:, None]
    partial.add_frozen_dims(column, frozen.sum(axis=0), int(long_enough.sum()))
    for row in np.flatnonzero(frozen.any(axis=1)):
        dims = [int(d) for d in np.flatnonzero(frozen[row])]
        start = rows.change_starts[row]
        still = ~moved[start:start + counts[row]][:, dims].any(axis=1)
        first, last = _longest_run(still)
        finding = _finding("frozen", ids[row], "", column=column, dims=dims, steps=(first, last + 1), score=float(share[row, dims].max()))
        finding.update(_shares=[float(share[row, d]) for d in dims], _length=int(rows.lengths[row]))  # `finish` words it
        partial.add_frozen(column, tuple(dims), finding)
    _jumps(partial, ids, column, delta, counts[:, None] - unchanged, rows, thresholds)
    # clipping: a dimension that moves (changes at least at half of its other steps) and sits at its
    # sequence's own max (or min) for clip_steps or more consecutive steps; per dimension and side,
    # the most extreme such value is kept, and `finish` keeps it if it is the dataset's bound. Only
    # rows with that many unchanged steps can.
    possible = np.flatnonzero(((unchanged >= thresholds.clip_steps - 1) & (unchanged < counts[:, None])).any(axis=1))
    if len(possible):
        steps, _, sub = rows.subset(possible)
        chosen = floats[steps]
        changes_per_row = (counts[:, None] - unchanged)[possible]
        for side, ufunc in (("max", np.maximum), ("min", np.minimum)):
            bound = sub.per_row(ufunc, chosen, sub.starts, sub.lengths, np.nan)
            at = chosen == bound[sub.row_of_step]
            held = sub.per_row(np.add, at, sub.starts, sub.lengths, 0)
            moves = changes_per_row >= 0.5 * (sub.changes[:, None] - held)
            candidate = (held >= thresholds.clip_steps) & moves & (held < sub.lengths[:, None])
            for index, dim in zip(*np.nonzero(candidate)):
                start = sub.starts[index]
                first, last = _longest_run(at[start:start + sub.lengths[index], dim])
                if last - first + 1 < thresholds.clip_steps:
                    continue
                value = float(bound[index, dim])
                partial.add_clip((column, int(dim), side), value, [_finding(
                    "clipped", ids[possible[index]], f"dimension {dim} held at {value:.6g} (the dataset's {side}) for {last - first + 1} "
                                                     f"consecutive steps", column=column, dims=[int(dim)], steps=(first, last),
                    score=float(last - first + 1))], 1)
    return moved.any(axis=1)


def _jumps(partial: Partial, ids: list[str], column: str, delta: np.ndarray, moving: np.ndarray, rows: _Rows,
           thresholds: Thresholds) -> None:
    """Step changes far from the sequence's mean change, in standard deviations of its changes.
    Only the changes that are not zero count (a dimension still most of the time does not make
    its ordinary motion a jump), and the deviation is measured again on those within 3 deviations
    (one clipping pass: a spike's own changes must not hide it), on the rows that have a change as
    far out as a spike of jump_sigma would stand before the pass (3 deviations among 30 changes,
    5.5 among 1,000): the pass costs most of the check, and a long sequence of noise has a change
    beyond 3 deviations in most of its dimensions."""
    counts = rows.changes
    n = np.maximum(moving, 1)  # [rows, D]: changes that are not zero (zeros add nothing to the sums)
    with np.errstate(invalid="ignore", over="ignore"):  # NaN and Inf rows: the non_finite check's
        mean = rows.per_row(np.add, delta, rows.change_starts, counts, 0.0) / n
        sigma = np.sqrt(np.maximum(rows.per_row(np.add, delta * delta, rows.change_starts, counts, 0.0) / n - mean * mean, 0.0))
        highest = rows.per_row(np.maximum, delta, rows.change_starts, counts, 0.0)
        lowest = rows.per_row(np.minimum, delta, rows.change_starts, counts, 0.0)
        # some change as far as a jump would stand (no [changes, D] gather), among at least 3 that are
        # not zero
        # where a spike of jump_sigma deviations (two changes of h among n, noise s) stands before the
        # clipping pass, h / sqrt(s**2 + 2 h**2 / n), with a margin; never above 3 for a spike to be clipped
        sigmas = thresholds.jump_sigma
        reach = np.maximum(np.minimum(3.0, sigmas), 0.95 * sigmas / np.sqrt(1 + 2 * sigmas ** 2 / np.maximum(moving, 1)))
        far = (np.maximum(highest - mean, mean - lowest) > reach * sigma) & (moving >= 3)
    possible = np.flatnonzero(far.any(axis=1))
    if not len(possible):
        return
    _, changes, sub = rows.subset(possible)
    delta = delta[changes]
    nonzero = delta != 0
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        inside = (np.abs(delta - mean[possible][sub.row_of_change]) <= 3 * sigma[possible][sub.row_of_change]) & nonzero
        kept = np.where(inside, delta, 0.0)
        n = np.maximum(sub.per_row(np.add, inside, sub.change_starts, sub.changes, 0), 1)
        mean = sub.per_row(np.add, kept, sub.change_starts, sub.changes, 0.0) / n
        sigma = np.sqrt(np.maximum(sub.per_row(np.add, kept * kept, sub.change_starts, sub.changes, 0.0) / n - mean * mean, 0.0))
        z = np.abs(delta - mean[sub.row_of_change]) / sigma[sub.row_of_change]
    jumped = (z > thresholds.jump_sigma) & (sigma[sub.row_of_change] > 0) & np.isfinite(z) & nonzero & far[possible][sub.row_of_change]
    where = np.flatnonzero(jumped.any(axis=1))
    for index, mine in _by_row(where, sub.row_of_change[where]):
        local = mine - sub.change_starts[index] + 1
        dims = [int(d) for d in np.flatnonzero(jumped[mine].any(axis=0))]
        worst = float(z[mine][jumped[mine]].max())
        partial.add(_finding("jump", ids[possible[index]], f"{len(mine)} step change(s) in dimension(s) {_dims(dims)} up to {worst:.3g} "
                                                             f"standard deviations of the sequence's changes", column=column, dims=dims,
                             steps=(int(local.min()) - 1, int(local.max())), score=worst))


def _idle(partial: Partial, ids: list[str], column: str, changed: np.ndarray, rows: _Rows, thresholds: Thresholds,
          acting: np.ndarray) -> None:
    """Leading and trailing steps without an action change (the operator not yet or no longer acting),
    in the rows that hold some action column (`acting`)."""
    positions = np.flatnonzero(changed)
    begin, end = rows.change_starts, rows.change_starts + rows.changes
    first = np.searchsorted(positions, begin)
    last = np.searchsorted(positions, end) - 1
    has = (first < len(positions)) & (first <= last) & acting  # some change inside the row (a row that never changes: frozen's)
    safe_first, safe_last = np.minimum(first, max(len(positions) - 1, 0)), np.maximum(last, 0)
    leading = np.where(has, positions[safe_first] - begin if len(positions) else 0, 0)
    trailing = np.where(has, end - 1 - positions[safe_last] if len(positions) else 0, 0)
    for row in np.flatnonzero(has & ((leading >= thresholds.idle_steps) | (trailing >= thresholds.idle_steps))):
        length = int(rows.lengths[row])
        for count, steps, where in ((int(leading[row]), (0, int(leading[row])), "start"),
                                    (int(trailing[row]), (length - 1 - int(trailing[row]), length - 1), "end")):
            if count >= thresholds.idle_steps:
                partial.add(_finding("idle", ids[row], f"{count + 1} steps with the same action at the {where}", column=column,
                                     steps=steps, score=float(count)))


def _facts(partial: Partial, ids: list[str], facts: list[dict], thresholds: Thresholds) -> None:
    partial.checked.add("clock_start")
    for row, fact in enumerate(facts):
        start = fact.get("clock_start")
        if isinstance(start, (int, float)) and not isinstance(start, bool) and math.isfinite(start) and abs(start) > thresholds.first_time:
            partial.add(_finding("clock_start", ids[row], f"the source clock starts at {start:.6g} s (rebased to 0)",
                                 column="timestamp", steps=(0, 0), score=abs(start)))
        for column, stats in sorted((fact.get("images") or {}).items()):
            partial.checked.add("dead_camera")
            if stats is not None and stats.count and np.all(np.asarray(stats.max) == np.asarray(stats.min)):
                values = ", ".join(f"{float(v):.3g}" for v in np.asarray(stats.min).reshape(-1))
                partial.add(_finding("dead_camera", ids[row], f"every sampled frame holds one value per channel ({values})",
                                     column=column, score=1.0))


def _longest_run(flags: np.ndarray) -> tuple[int, int]:
    """(first, last) index of the longest run of True in `flags` (the first such run)."""
    padded = np.concatenate([[False], flags.astype(bool), [False]])
    edges = np.flatnonzero(padded[1:] != padded[:-1])
    if not len(edges):
        return 0, -1
    starts, stops = edges[0::2], edges[1::2]
    best = int(np.argmax(stops - starts))
    return int(starts[best]), int(stops[best]) - 1


def _dims(dims: list[int]) -> str:
    shown = ", ".join(str(d) for d in dims[:8])
    return shown + (f" and {len(dims) - 8} more" if len(dims) > 8 else "")


# --- the whole dataset -------------------------------------------------------------------------------

def finish(partial: Partial, columns: list[ColumnSpec], thresholds: Thresholds) -> tuple[dict, list[dict]]:
    """(the header, the listed findings) of a dataset: the per-sequence findings, and what only the
    whole dataset decides: dimensions that never vary, values at the dataset's bound, duplicate
    sequences, rare tasks, and which frozen dimensions are not stuck actuators."""
    result = Partial(sequences=partial.sequences, listed={k: list(v) for k, v in partial.listed.items()}, counts=dict(partial.counts),
                     checked=set(partial.checked))
    trajectories = [spec.name for spec in columns if spec.kind == TRAJECTORY]
    constant: dict[str, set[int]] = {}
    for name in trajectories:
        if name not in partial.bounds:
            continue
        low, high, steps = partial.bounds[name]
        dims = [int(d) for d in np.flatnonzero(low == high)] if steps >= 2 else []
        if dims:
            constant[name] = set(dims)
            result.add(_finding("zero_variance", None, f"dimension(s) {_dims(dims)} hold {low[dims[0]]:.6g}"
                                                       f"{' (and others their own value)' if len(dims) > 1 else ''} in all {steps} steps",
                                column=name, dims=dims, score=float(len(dims))))
    # frozen: not the dimensions that never vary (zero_variance says so once), nor those frozen in
    # every sequence long enough (a value repeated per step: an instruction's embedding, a setting)
    repeated = {column: {int(d) for d in np.flatnonzero(frozen == eligible)} for column, (frozen, eligible) in partial.frozen_dims.items()
                if eligible >= REPEATED_MIN}
    frozen_count, frozen_listed = 0, []
    for (column, dims), (count, findings) in partial.frozen.items():
        skip = constant.get(column, set()) | repeated.get(column, set())
        kept = [finding for finding in (_frozen_kept(finding, skip) for finding in findings) if finding is not None]
        if dims is not None:
            frozen_count += count if any(d not in skip for d in dims) else 0
        else:  # the shared bucket: counted as listed, the unlisted ones as they were (an approximation past FROZEN_SETS sets)
            frozen_count += len(kept) + count - len(findings)
        frozen_listed += kept
    if frozen_count:
        result.counts["frozen"] = frozen_count
        result.listed["frozen"] = _worst(frozen_listed)
    for (column, dim, side), (value, count, findings) in sorted(partial.clips.items()):
        low, high, _ = partial.bounds.get(column, (np.zeros(0), np.zeros(0), 0))
        bound = high if side == "max" else low
        if dim < len(bound) and bound[dim] == value and dim not in constant.get(column, set()):
            result.counts["clipped"] = result.counts.get("clipped", 0) + count
            result.listed["clipped"] = _worst(result.listed.get("clipped", []) + findings)
    groups: dict[bytes, list[str]] = {}
    for digest, sequence_id in partial.digests:
        groups.setdefault(digest, []).append(sequence_id)
    for members in groups.values():
        if len(members) > 1:
            first, *others = sorted(members)
            for other in others:
                result.add(_finding("duplicate", other, f"its trajectories equal {first}'s, value for value", score=float(len(members))))
    for task, count in sorted(partial.tasks.items()):
        if count < thresholds.min_task_sequences:
            result.add(_finding("rare_task", None, f"task {task!r} has {count} sequence(s)", column="task", score=float(-count)))
    checks = {}
    for name, (level, _what, _) in CHECKS.items():
        listed = _worst(result.listed.get(name, []))
        result.listed[name] = listed
        checks[name] = {"level": level, "checked": name in result.checked, "findings": result.counts.get(name, 0), "listed": len(listed),
                        "sequences": len({f["sequence_id"] for f in listed if f["sequence_id"]})}
    header = {"mixtrain_quality": VERSION, "sequences": partial.sequences, "thresholds": thresholds.to_json(), "checks": checks}
    shown = {column: sorted(dims) for column, dims in repeated.items() if dims - constant.get(column, set())}
    if shown:
        header["frozen_in_every_sequence"] = {column: [d for d in dims if d not in constant.get(column, set())] for column, dims in shown.items()}
    findings = [f for name in CHECKS for f in result.listed[name]]
    return header, findings


def _frozen_kept(finding: dict, skip: set[int]) -> dict | None:
    """A frozen finding without the dimensions in `skip`, worded; None when none is left."""
    pairs = [(dim, share) for dim, share in zip(finding["dims"], finding["_shares"]) if dim not in skip]
    if not pairs:
        return None
    dims, shares = [dim for dim, _ in pairs], [share for _, share in pairs]
    kept = {key: value for key, value in finding.items() if not key.startswith("_")}
    kept.update(dims=dims, score=max(shares), message=f"dimension(s) {_dims(dims)} unchanged over {min(shares) * 100:.0f}% or more of "
                                                      f"{finding['_length']} steps")
    return kept


# --- the file ---------------------------------------------------------------------------------------

def encode(header: dict, findings: list[dict]) -> bytes:
    lines = [json.dumps(header, ensure_ascii=False, sort_keys=True)]
    lines += [json.dumps(finding, ensure_ascii=False, sort_keys=True, allow_nan=False) for finding in findings]
    return ("\n".join(lines) + "\n").encode()


_FIELDS = {"check": str, "level": str, "sequence_id": (str, type(None)), "column": (str, type(None)), "dims": (list, type(None)),
           "steps": (list, type(None)), "score": (int, float), "message": str}


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def decode(lines: Iterable[str], where: str) -> tuple[dict, list[dict]]:
    """A _quality.jsonl read back (untrusted: a received dataset's): its header and findings,
    each checked for the fields and types this module writes, each check at its own level (a
    forged file cannot call a NaN a warning), and the header's listed counts those of the lines.
    FormatError names the line."""
    iterator: Iterator[str] = iter(lines)
    header = None
    findings = []
    for number, line in enumerate(iterator, 1):
        if not line.strip():
            continue
        try:
            value = parse_json(line, f"line {number}")
        except FormatError as error:
            raise FormatError(f"{where}: line {number} is not JSON ({str(error).split('malformed JSON: ', 1)[-1]})") from None
        if header is None:
            if not isinstance(value, dict) or value.get("mixtrain_quality") != VERSION or not isinstance(value.get("checks"), dict):
                raise FormatError(f"{where}: line 1 is not a quality header of version {VERSION}")
            for name, entry in value["checks"].items():
                counts = ("findings", "listed", "sequences")
                if name not in CHECKS or not isinstance(entry, dict) or entry.get("level") != CHECKS[name][0] \
                        or not isinstance(entry.get("checked"), bool) or not all(_whole(entry.get(key)) for key in counts) \
                        or entry["listed"] > min(entry["findings"], MAX_LISTED):
                    raise FormatError(f"{where}: line 1: check {name!r} is not {{level, checked, findings, listed, sequences}} of a "
                                      "known check at its level")
            if not _whole(value.get("sequences")) or not isinstance(value.get("thresholds"), dict):
                raise FormatError(f"{where}: line 1: no sequence count or thresholds")
            header = value
            continue
        if not isinstance(value, dict) or any(not isinstance(value.get(key), kind) for key, kind in _FIELDS.items()):
            raise FormatError(f"{where}: line {number} is not a finding (check, level, sequence_id, column, dims, steps, score, message)")
        if value["check"] not in CHECKS or value["level"] != CHECKS[value["check"]][0] or isinstance(value["score"], bool) \
                or not math.isfinite(value["score"]):
            raise FormatError(f"{where}: line {number}: unknown check, a level other than its check's, or a score that is not a number")
        if value["steps"] is not None and (len(value["steps"]) != 2 or not all(_whole(step) for step in value["steps"])):
            raise FormatError(f"{where}: line {number}: steps is not a [first, last] pair of step numbers")
        if value["dims"] is not None and not all(_whole(dim) for dim in value["dims"]):
            raise FormatError(f"{where}: line {number}: dims holds something other than dimension numbers")
        findings.append(value)
    if header is None:
        raise FormatError(f"{where}: empty (no quality header)")
    lines_per_check = collections.Counter(finding["check"] for finding in findings)
    for name, count in sorted(lines_per_check.items()):
        if name not in header["checks"] or header["checks"][name]["listed"] != count:
            raise FormatError(f"{where}: {count} {name} finding line(s), the header lists "
                              f"{header['checks'].get(name, {}).get('listed', 0)}")
    return header, findings
