"""formats/mixtrain/quality.py: every check finds what is planted for it, with the sequence and the
step range; clean sequences give no finding; the result does not depend on how rows were grouped;
the listing is capped while the counts stay exact; a _quality.jsonl read back is untrusted."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from formats import mixtrain
from formats.errors import FormatError
from formats.mixtrain import quality
from formats.mixtrain import stats as statistics
from formats.sequence import SCALAR, STEPS, TRAJECTORY, ColumnSpec, Sequence, base_columns

FPS = 10.0
LENGTH = 60
COLUMNS = [*base_columns(), ColumnSpec("obs_state", TRAJECTORY, pa.list_(pa.list_(pa.float32(), 3)), {"dim": 3}),
           ColumnSpec("action", TRAJECTORY, pa.list_(pa.list_(pa.float32(), 4)), {"dim": 4}),
           ColumnSpec("reward", STEPS, pa.list_(pa.float64())), ColumnSpec("task", SCALAR, pa.string())]


def _clean(index: int, length: int = LENGTH) -> dict:
    """A sequence a robot could have recorded: smooth, every dimension moving, two tasks alike."""
    t = np.arange(length) / FPS
    phase = index * 0.37
    state = np.stack([np.sin(t + phase + k) * (1 + 0.1 * k) for k in range(3)], axis=1).astype(np.float32)
    action = np.stack([np.cos(0.8 * t + phase + k) * (2 + 0.2 * k) for k in range(4)], axis=1).astype(np.float32)
    return {"id": f"s{index:02d}", "timestamp": t, "obs_state": state, "action": action, "reward": np.linspace(0, 1, length) * (index + 1),
            "task": "pick" if index % 2 else "place", "facts": {}}


def _dataset(count: int = 12) -> list[dict]:
    return [_clean(i) for i in range(count)]


def _table(rows: list[dict]) -> pa.Table:
    sequences = []
    for row in rows:
        length = len(row["timestamp"])
        sequences.append(Sequence(row["id"], length, row["timestamp"], scalars={"length": length, "duration_seconds": length / FPS,
                                                                                "task": row["task"]},
                                  trajectories={"obs_state": row["obs_state"], "action": row["action"]}, steps={"reward": row["reward"]}))
    return mixtrain.sequences_to_table(sequences, COLUMNS)


def _findings(rows: list[dict], thresholds: quality.Thresholds | None = None, groups: int = 1,
              table: pa.Table | None = None) -> tuple[dict, list[dict]]:
    thresholds = thresholds or quality.Thresholds()
    table = _table(rows) if table is None else table
    found = quality.Partial()
    size = -(-len(rows) // groups)
    for start in range(0, len(rows), size):
        part = table.slice(start, size).combine_chunks()
        found.merge(quality.group_partial(part, COLUMNS, FPS, thresholds, [row["facts"] for row in rows[start:start + size]]))
    return quality.finish(found, COLUMNS, thresholds)


def test_clean_sequences_give_no_finding_and_every_check_ran():
    rows = _dataset()
    rows[0]["facts"] = {"images": {"video_cam": statistics.ColumnStats.of(np.random.default_rng(0).random((50, 3)), image=True)}}
    header, findings = _findings(rows)
    assert findings == []
    assert {name for name, entry in header["checks"].items() if not entry["checked"]} == set()
    assert header["sequences"] == 12 and header["thresholds"] == quality.Thresholds().to_json()


def _nan(rows):
    rows[3]["action"][7:10, 1] = np.nan


def _inf(rows):
    rows[5]["obs_state"][0, 2] = np.inf


def _frozen(rows):
    rows[4]["action"][3:, 2] = rows[4]["action"][3, 2]


def _jump(rows):
    rows[6]["obs_state"][30, 0] += 50


def _clipped(rows):
    rows[7]["action"][20:35, 3] = 9.5  # above every other value of the dimension: the dataset's max


def _idle_start(rows):
    rows[8]["action"][:12] = rows[8]["action"][0]


def _idle_end(rows):
    rows[9]["action"][-15:] = rows[9]["action"][-15]


def _gap(rows):
    rows[2]["timestamp"][40:] += 0.2


def _drift(rows):
    rows[1]["timestamp"] = np.arange(LENGTH) * 0.104


def _back(rows):
    rows[10]["timestamp"][20] = rows[10]["timestamp"][19]


def _clock(rows):
    rows[0]["facts"] = {"clock_start": 3.25}


def _short(rows):
    one = _clean(11, length=1)
    rows[11] = one


def _duplicate(rows):
    rows[11] = {**_clean(0), "id": "s11", "task": "pick"}


def _rare(rows):
    rows[5]["task"] = "stack"


def _constant(rows):
    for row in rows:
        row["obs_state"][:, 1] = 0.5


def _dead(rows):
    rows[3]["facts"] = {"images": {"video_cam": statistics.ColumnStats.of(np.zeros((40, 3)), image=True)}}


PLANTED = {  # the defect, and the finding it must give: (check, sequence, column, dims, steps)
    "non_finite NaN": (_nan, ("non_finite", "s03", "action", [1], [7, 9])),
    "non_finite Inf": (_inf, ("non_finite", "s05", "obs_state", [2], [0, 0])),
    "frozen": (_frozen, ("frozen", "s04", "action", [2], [3, 59])),
    "jump": (_jump, ("jump", "s06", "obs_state", [0], [29, 31])),
    "clipped": (_clipped, ("clipped", "s07", "action", [3], [20, 34])),
    "idle at the start": (_idle_start, ("idle", "s08", "action", None, [0, 11])),
    "idle at the end": (_idle_end, ("idle", "s09", "action", None, [45, 59])),
    "time_gap": (_gap, ("time_gap", "s02", "timestamp", None, [39, 40])),
    "rate_drift": (_drift, ("rate_drift", "s01", "timestamp", None, [0, 59])),
    "time_order": (_back, ("time_order", "s10", "timestamp", None, [20, 20])),
    "clock_start": (_clock, ("clock_start", "s00", "timestamp", None, [0, 0])),
    "short": (_short, ("short", "s11", None, None, [0, 0])),
    "duplicate": (_duplicate, ("duplicate", "s11", None, None, None)),
    "rare_task": (_rare, ("rare_task", None, "task", None, None)),
    "zero_variance": (_constant, ("zero_variance", None, "obs_state", [1], None)),
    "dead_camera": (_dead, ("dead_camera", "s03", "video_cam", None, None)),
}


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_a_planted_defect_is_found_with_its_sequence_and_steps(name):
    plant, expected = PLANTED[name]
    rows = _dataset()
    plant(rows)
    header, findings = _findings(rows)
    found = [(f["check"], f["sequence_id"], f["column"], f["dims"], f["steps"]) for f in findings]
    assert expected in found, found
    check = expected[0]
    assert header["checks"][check]["findings"] >= 1 and header["checks"][check]["level"] == quality.CHECKS[check][0]
    assert all(f["level"] == quality.CHECKS[f["check"]][0] for f in findings)
    assert {f["check"] for f in findings if f["level"] == quality.ERROR} <= {"non_finite", "time_order"}


def test_idle_is_no_change_in_any_action_column():
    """RLDS-like action fields: one column still while another moves is not idle."""
    rows = _dataset()
    rows[8]["action"][:12, :2] = rows[8]["action"][0, :2]  # two of four dimensions held: the robot still acts
    _, findings = _findings(rows)
    assert [f for f in findings if f["check"] == "idle"] == []


def test_the_findings_do_not_depend_on_how_rows_were_grouped():
    rows = _dataset(12)
    for plant, _ in PLANTED.values():
        plant(rows)
    whole = _findings(rows)
    assert _findings(rows, groups=4) == whole
    assert _findings(rows, groups=12) == whole


def test_long_row_groups_are_checked_in_chunks_to_the_same_findings(monkeypatch):
    rows = _dataset(12)
    for plant, _ in PLANTED.values():
        plant(rows)
    whole = _findings(rows)
    monkeypatch.setattr(quality, "CHUNK_BYTES", 3000)  # a few rows a chunk
    assert _findings(rows) == whole


def test_thresholds_change_what_is_found():
    rows = _dataset()
    _gap(rows)
    _short(rows)
    assert [f["check"] for f in _findings(rows, quality.Thresholds(gap_factor=3.5, drift=0.05, min_length=1))[1]] == []
    found = _findings(rows, quality.Thresholds(min_length=61))[1]
    assert sum(f["check"] == "short" for f in found) == 12


def test_nan_everywhere_inf_and_one_step_sequences_are_findings_not_crashes():
    rows = _dataset(6)
    rows[0]["action"][:] = np.nan  # a whole column of a sequence
    rows[1]["obs_state"][:, :] = -np.inf
    rows[2]["reward"][:] = np.nan
    for row in rows[3:]:
        row.update(_clean(int(row["id"][1:]), length=1))
    header, findings = _findings(rows)
    non_finite = {(f["sequence_id"], f["column"]): f for f in findings if f["check"] == "non_finite"}
    assert non_finite[("s00", "action")]["steps"] == [0, 59] and non_finite[("s00", "action")]["dims"] == [0, 1, 2, 3]
    assert non_finite[("s01", "obs_state")]["message"].startswith("180 Inf")
    assert non_finite[("s02", "reward")]["steps"] == [0, 59] and non_finite[("s02", "reward")]["dims"] is None
    assert sorted(f["sequence_id"] for f in findings if f["check"] == "short") == ["s03", "s04", "s05"]


def test_timestamps_all_equal_are_an_error():
    rows = _dataset(4)
    rows[2]["timestamp"] = np.zeros(LENGTH)
    findings = _findings(rows)[1]
    assert [(f["check"], f["sequence_id"], f["steps"]) for f in findings if f["level"] == quality.ERROR] == [("time_order", "s02", [1, 59])]


def test_the_listing_is_capped_and_the_counts_stay_exact():
    rows = [_clean(i % 40) | {"id": f"n{i:05d}"} for i in range(2500)]
    for row in rows:
        row["action"][5, 0] = np.nan
    header, findings = _findings(rows, groups=5)
    assert header["checks"]["non_finite"]["findings"] == 2500
    assert header["checks"]["non_finite"]["listed"] == quality.MAX_LISTED == sum(f["check"] == "non_finite" for f in findings)
    assert len(quality.encode(header, findings)) < 400_000


def test_a_file_reads_back_as_written():
    rows = _dataset()
    for plant, _ in PLANTED.values():
        plant(rows)
    header, findings = _findings(rows)
    text = quality.encode(header, findings).decode()
    assert quality.decode(text.splitlines(), "q") == (json.loads(text.splitlines()[0]), findings)


GOOD = {"check": "jump", "level": "warning", "sequence_id": "s1", "column": "a", "dims": [0], "steps": [1, 2], "score": 7.0, "message": "m"}


@pytest.mark.parametrize(("line", "expected"), [
    ("{not json", "q: line 2 is not JSON"),
    (json.dumps({**GOOD, "steps": ["1", 2]}), "q: line 2: steps is not a [first, last] pair of step numbers"),
    (json.dumps({**GOOD, "steps": [1, 2, 3]}), "q: line 2: steps is not a [first, last] pair of step numbers"),
    (json.dumps({**GOOD, "dims": [-1]}), "q: line 2: dims holds something other than dimension numbers"),
    (json.dumps({**GOOD, "check": "<script>"}), "q: line 2: unknown check, a level other than its check's"),
    (json.dumps({**GOOD, "score": True}), "q: line 2: unknown check, a level other than its check's"),
    (json.dumps({**GOOD, "score": float("nan")}), "q: line 2: unknown check, a level other than its check's"),
    (json.dumps({**GOOD, "check": "non_finite", "level": "warning"}), "q: line 2: unknown check, a level other than its check's"),
    ("[" * 100_000, "q: line 2 is not JSON (nested too deeply)"),
    (json.dumps(GOOD), "q: 1 jump finding line(s), the header lists 0"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "message"}), "q: line 2 is not a finding"),
    (json.dumps([1, 2]), "q: line 2 is not a finding"),
])
def test_a_hostile_file_is_refused_naming_the_line(line, expected):
    header, _ = _findings(_dataset(2))
    with pytest.raises(FormatError) as caught:
        quality.decode([json.dumps(header), line], "q")
    assert str(caught.value).startswith(expected)


@pytest.mark.parametrize("header", [
    {"mixtrain_quality": 2, "checks": {}, "sequences": 1, "thresholds": {}},
    {"mixtrain_quality": 1, "checks": {"jump": {"level": "warning", "checked": True, "findings": "9", "listed": 0, "sequences": 0}},
     "sequences": 1, "thresholds": {}},
    {"mixtrain_quality": 1, "checks": {"made_up": {"level": "warning", "checked": True, "findings": 0, "listed": 0, "sequences": 0}},
     "sequences": 1, "thresholds": {}},
    {"mixtrain_quality": 1, "checks": {}, "sequences": -1, "thresholds": {}},
    {"mixtrain_quality": 1, "checks": {"non_finite": {"level": "warning", "checked": True, "findings": 3, "listed": 3, "sequences": 3}},
     "sequences": 3, "thresholds": {}},
    {"mixtrain_quality": 1, "checks": {"jump": {"level": "warning", "checked": True, "findings": 3, "listed": 4, "sequences": 3}},
     "sequences": 3, "thresholds": {}},
])
def test_a_hostile_header_is_refused(header):
    with pytest.raises(FormatError, match=r"^q: (line 1|empty)"):
        quality.decode([json.dumps(header)], "q")
    with pytest.raises(FormatError, match=r"^q: empty"):
        quality.decode([], "q")


def test_frozen_findings_of_a_dimension_that_never_varies_do_not_crowd_out_stuck_ones():
    """1,500 sequences with a padding dimension (zero everywhere) and 5 with a stuck actuator:
    frozen counts and lists the 5, the padding dimension is zero_variance's, once."""
    rows = [_clean(i % 40) | {"id": f"p{i:05d}"} for i in range(1505)]
    for row in rows:
        row["action"][:, 3] = 0.0
    for row in rows[:5]:
        row["action"][5:, 0] = row["action"][5, 0]
        row["action"][5:, 1] = 1.25  # partly overlapping: dims 0, 1 and the padding 3
    header, findings = _findings(rows, groups=3)
    frozen = [f for f in findings if f["check"] == "frozen"]
    assert header["checks"]["frozen"]["findings"] == 5 == len(frozen)
    assert {tuple(f["dims"]) for f in frozen} == {(0, 1)} and all("dimension(s) 0, 1 unchanged" in f["message"] for f in frozen)
    assert [(f["column"], f["dims"]) for f in findings if f["check"] == "zero_variance"] == [("action", [3])]


def test_a_value_repeated_in_every_sequence_is_not_a_stuck_actuator():
    """An instruction's embedding, the same for every step of a sequence: frozen in every long
    sequence, so not reported per sequence; the header names it."""
    rows = _dataset(12)
    for index, row in enumerate(rows):
        row["obs_state"][:, 2] = index * 0.1
    header, findings = _findings(rows)
    assert [f for f in findings if f["check"] == "frozen"] == []
    assert header["frozen_in_every_sequence"] == {"obs_state": [2]}


def test_one_nan_does_not_hide_a_constant_dimension_or_a_clip():
    rows = _dataset()
    _constant(rows)
    _clipped(rows)
    rows[2]["obs_state"][4, 1] = np.nan
    rows[3]["action"][6, 3] = np.nan
    found = [(f["check"], f["sequence_id"], f["column"], f["dims"]) for f in _findings(rows)[1]]
    assert ("zero_variance", None, "obs_state", [1]) in found and ("clipped", "s07", "action", [3]) in found


def test_plateaus_below_the_dataset_bound_do_not_crowd_out_the_clip():
    """6,000 sequences each held at its own maximum below the dataset's, and one clipped at the
    dataset's: the clip is counted and listed, however the rows are grouped."""
    rows = [_clean(i % 40) | {"id": f"c{i:05d}"} for i in range(6001)]
    for index, row in enumerate(rows):
        row["action"][20:32, 2] = 3.0 + index * 1e-4  # each above its own other values: its own max
    rows[-1]["action"][20:32, 2] = 10.0
    for groups in (1, 7):
        header, findings = _findings(rows, groups=groups)
        assert header["checks"]["clipped"]["findings"] == 1
        assert [(f["sequence_id"], f["steps"]) for f in findings if f["check"] == "clipped"] == [("c06000", [20, 31])]


def test_a_row_group_without_steps_and_rows_without_trajectories():
    rows = [_clean(i, length=0) for i in range(3)]
    header, findings = _findings(rows)
    assert [(f["check"], f["steps"]) for f in findings if f["check"] != "rare_task"] == [("short", None)] * 3
    rows = _dataset(6)
    table = _table(rows)
    for name in ("obs_state", "action"):  # null cells in rows 3-5 (another writer's): nothing to compare, not duplicates of each other
        cells = table.column(name).to_pylist()
        table = table.set_column(table.schema.get_field_index(name), name,
                                 pa.array(cells[:3] + [None] * 3, table.schema.field(name).type))
    header, findings = _findings(rows, table=table)
    assert [f for f in findings if f["check"] == "duplicate"] == [] and header["checks"]["duplicate"]["checked"]


def test_ordinary_motion_of_a_dimension_still_most_of_the_time_is_not_a_jump():
    rows = _dataset()
    for row in rows:
        row["obs_state"][:, 0] = 0.5
        row["obs_state"][:7, 0] = 0.5 - np.cumsum([0.07, 0.09, 0.11, 0.135, 0.12, 0.1, 0.08])[::-1] + 0.705
    assert [f for f in _findings(rows)[1] if f["check"] == "jump"] == []


def test_idle_across_action_columns_with_a_null_cell_does_not_depend_on_grouping():
    """`action` moves only after step 30, `action_gripper` at every step, and one row has no
    gripper cell: only that row is idle, however its neighbours are grouped with it."""
    columns = [*COLUMNS, ColumnSpec("action_gripper", TRAJECTORY, pa.list_(pa.list_(pa.float32(), 1)), {"dim": 1})]
    rows = _dataset(4)
    sequences = []
    for row in rows:
        row["action"][:31] = row["action"][0]
        gripper = np.arange(LENGTH, dtype=np.float32).reshape(-1, 1)
        sequences.append(Sequence(row["id"], LENGTH, row["timestamp"], scalars={"length": LENGTH, "task": row["task"]},
                                  trajectories={"obs_state": row["obs_state"], "action": row["action"], "action_gripper": gripper},
                                  steps={"reward": row["reward"]}))
    table = mixtrain.sequences_to_table(sequences, columns)
    cells = table.column("action_gripper").to_pylist()
    table = table.set_column(table.schema.get_field_index("action_gripper"), "action_gripper",
                             pa.array([None, *cells[1:]], table.schema.field("action_gripper").type))

    def idle(groups: list[tuple[int, int]]) -> list[str]:
        found = quality.Partial()
        for start, stop in groups:
            found.merge(quality.group_partial(table.slice(start, stop - start).combine_chunks(), columns, FPS, quality.Thresholds()))
        return [f["sequence_id"] for f in quality.finish(found, columns, quality.Thresholds())[1] if f["check"] == "idle"]

    assert idle([(0, 4)]) == idle([(0, 1), (1, 4)]) == idle([(0, 2), (2, 3), (3, 4)]) == ["s00"]


@pytest.mark.parametrize("length", [30, 44, 80, 400])
def test_a_spike_of_seven_deviations_is_found_whatever_the_length(length):
    """A zigzag of unit changes with one spike at its middle: the spike's two changes of 7 stand
    only about 3.9 deviations out before the clipping pass at 44 steps (a gate at 4 missed it)."""
    rows = _dataset(1)
    row = rows[0] | _clean(0, length=length)
    zigzag = np.where(np.arange(length) % 2, 1.0, 0.0).astype(np.float32)
    zigzag[length // 2] += 8.0  # changes of 7 or more in its two steps, against 1
    row["obs_state"] = np.stack([zigzag, zigzag * 0 + np.arange(length) * 0.1, np.sin(np.arange(length) * 0.3)], axis=1).astype(np.float32)
    found = [(f["dims"], f["steps"]) for f in _findings([row])[1] if f["check"] == "jump" and f["column"] == "obs_state"]
    assert found == [([0], [length // 2 - 1, length // 2 + 1])], found


def test_frozen_sets_past_the_limit_merge_to_the_same_result_in_any_order():
    """More distinct sets of frozen dimensions than FROZEN_SETS, some of them in a constant
    dimension: the result does not depend on the order the partials were merged in."""
    parts = []
    for index in range(300):
        part = quality.Partial(sequences=1)
        dims = tuple(sorted({index % 7, (index // 7) % 7 + 7, 14}))
        finding = quality._finding("frozen", f"f{index:03d}", "", column="action", dims=list(dims), steps=(0, 59), score=1.0)
        finding.update(_shares=[1.0] * len(dims), _length=60)
        part.add_frozen("action", dims, finding)
        part.add_bounds("action", np.array([0.0] * 14 + [0.5]), np.array([1.0] * 14 + [0.5]), 60)
        parts.append(part)
    forward, backward = quality.Partial(), quality.Partial()
    for part in parts:
        forward.merge(part)
    for part in reversed(parts):
        backward.merge(part)
    columns = [*COLUMNS[:4], ColumnSpec("action", TRAJECTORY, pa.list_(pa.list_(pa.float32(), 15)), {"dim": 15})]
    assert quality.finish(forward, columns, quality.Thresholds()) == quality.finish(backward, columns, quality.Thresholds())
    assert quality.finish(forward, columns, quality.Thresholds())[0]["checks"]["frozen"]["findings"] == 300
