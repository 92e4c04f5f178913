"""Data-quality findings end to end (docs/quality.md): defects planted in LeRobot v3, RLDS and ORTF
inputs are found by the conversion's own pass with their sequence ids and step ranges; the real
fixtures and every bundled sample give no error-level finding; inspect (text, --json, HTML) and
validate --quality show them; a dataset written without them gets them computed; a received
_quality.jsonl is untrusted."""

from __future__ import annotations

import glob
import io
import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from formats import samples
from formats.mixtrain import quality
from formats.read import reader, report
from pipelines import conversion, inspect, validate

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED = os.path.join(os.path.dirname(ROOT), "shared", "fixtures")


def _convert(src, dst, *extra: str) -> None:
    out, console = io.StringIO(), io.StringIO()
    code = conversion.run([f"--input={src}", f"--output={dst}", "--progress=off", *extra], out=out, console=console)
    assert code == 0, console.getvalue()


def _found(dst) -> list[tuple]:
    header, findings = reader.open_dataset(str(dst)).quality()
    return [(f["check"], f["sequence_id"], f["column"], f["dims"], f["steps"]) for f in findings]


def _rewrite(path: str, change) -> None:
    """Rewrite a Parquet file with `change(columns: dict of numpy arrays)` applied, types kept."""
    table = pq.read_table(path)
    columns = {}
    for name in table.column_names:
        column = table.column(name).combine_chunks()
        if pa.types.is_fixed_size_list(column.type):
            columns[name] = column.flatten().to_numpy(zero_copy_only=False).reshape(len(column), column.type.list_size).copy()
        else:
            columns[name] = column.to_numpy(zero_copy_only=False).copy()
    change(columns)
    arrays = []
    for name in table.column_names:
        kind = table.schema.field(name).type
        if pa.types.is_fixed_size_list(kind):
            arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(columns[name].reshape(-1), kind.value_type), kind.list_size))
        else:
            arrays.append(pa.array(columns[name], kind))
    pq.write_table(pa.Table.from_arrays(arrays, schema=table.schema), path)


def test_lerobot_v3_defects_are_found_with_their_episodes_and_steps(tmp_path):
    from formats.sources.lerobot_v3.sample import SyntheticLeRobot, write_dataset

    src = tmp_path / "src"
    write_dataset(str(src), SyntheticLeRobot(lengths=(40,) * 8 + (1,), cameras=(), episodes_per_data_file=20))

    def plant(columns):
        episode = columns["episode_index"]

        def rows(number):
            return np.flatnonzero(episode == number)

        columns["action"][rows(1)[5:8], 2] = np.nan
        columns["observation.state"][rows(2)[2:], 0] = columns["observation.state"][rows(2)[2], 0]
        columns["timestamp"][rows(3)[20:]] += np.float32(3 / 30)
        columns["timestamp"][rows(4)] += np.float32(5.0)
        columns["action"][rows(5)[:15]] = columns["action"][rows(5)[0]]
        columns["observation.state"][rows(6)] = columns["observation.state"][rows(0)]
        columns["action"][rows(6)] = columns["action"][rows(0)]
        columns["observation.state"][rows(7)[20], 1] += 100

    _rewrite(glob.glob(str(src / "data" / "*" / "*.parquet"))[0], plant)
    dst = tmp_path / "out"
    _convert(src, dst)
    ids = reader.open_dataset(str(dst)).sequence_ids()
    name = {number: sequence_id for number, sequence_id in enumerate(ids)}
    found = _found(dst)
    for expected in [("non_finite", name[1], "action", [2], [5, 7]),
                     ("frozen", name[2], "obs_state", [0], [2, 39]),
                     ("time_gap", name[3], "timestamp", None, [19, 20]),
                     ("clock_start", name[4], "timestamp", None, [0, 0]),
                     ("idle", name[5], "action", None, [0, 14]),
                     ("duplicate", name[6], None, None, None),
                     ("jump", name[7], "obs_state", [1], [19, 21]),
                     ("short", name[8], None, None, [0, 0])]:
        assert expected in found, (expected, found)
    assert [f for f in found if quality.CHECKS[f[0]][0] == quality.ERROR] == [("non_finite", name[1], "action", [2], [5, 7])]


def test_rlds_defects_are_found(tmp_path):
    from formats.sources.rlds import sample

    spec = sample.SyntheticRLDS(splits={"train": (30, 30, 30, 30), "val": (30, 30)}, shards={"train": 1, "val": 1})
    rng = np.random.default_rng(0)
    episodes = {split: [sample._episode(spec, rng, number, length, 0)[0] for number, length in enumerate(lengths)]
                for split, lengths in spec.splits.items()}
    episodes["train"][1]["steps"][2]["action"]["world_vector"] = np.array([np.nan, 0, 0], np.float32)
    episodes["val"][0] = sample._episode(spec, np.random.default_rng(0), 0, 30, 0)[0]  # train's first episode again, in val
    last = episodes["train"][3]["steps"]
    for step in last[18:]:
        step["action"] = {**last[18]["action"], "terminate_episode": step["action"]["terminate_episode"]}
    episodes["train"][2]["steps"][15]["observation"]["state"] = episodes["train"][2]["steps"][15]["observation"]["state"] + 100
    src, dst = tmp_path / "src", tmp_path / "out"
    sample.write_episodes(str(src), spec.name, sample._features(spec), episodes, spec.shards)
    _convert(src, dst, "--fps=10")
    found = _found(dst)
    assert ("non_finite", "train_00000_000001", "action_world_vector", [0], [2, 2]) in found
    assert ("duplicate", "val_00000_000000", None, None, None) in found
    idle = [f for f in found if f[0] == "idle"]
    assert idle == [("idle", "train_00000_000003", "action_gripper_closedness_action,action_rotation_delta,action_world_vector",
                     None, [18, 29])]
    assert ("jump", "train_00000_000002", "obs_state", [0, 1, 2, 3, 4, 5, 6], [14, 16]) in found


def test_ortf_defects_are_found(tmp_path):
    from formats.sources.ortf.sample import SyntheticORTF, write_dataset

    src = tmp_path / "src"
    write_dataset(str(src), SyntheticORTF(lengths=(30, 30, 30, 30), cameras=("cam_wrist",), slow_camera=None, depth_format=None,
                                          audio=False, annotations=False, failed_episodes=(), sequential_ids=True))
    first = sorted(glob.glob(str(src / "data" / "*" / "steps.parquet")))[0]
    episode_ids = sorted(set(pq.read_table(first, columns=["episode_id"]).column(0).to_pylist()))

    def plant(columns):
        rows = np.flatnonzero(columns["episode_id"] == episode_ids[0])
        columns["observation.state.joint_velocities"][rows[2:], 3] = 0.25
        columns["timestamp"][rows[10:]] += 2 / 15
        columns["action"][rows[7], 0] = np.inf

    _rewrite(first, plant)
    dst = tmp_path / "out"
    _convert(src, dst)
    sequence = reader.open_dataset(str(dst)).sequence_ids()[0]
    found = _found(dst)
    assert ("frozen", sequence, "obs_joint_velocities", [3], [2, 29]) in found, found
    assert ("time_gap", sequence, "timestamp", None, [9, 10]) in found
    assert ("non_finite", sequence, "action", [0], [7, 7]) in found


def test_the_real_bridge_fixture_has_its_known_defects_found(tmp_path):
    """The Octo project's debug copy of BridgeData V2 (../shared/fixtures/README.md): `image_3` is
    blank, and its val split holds train episodes again. Both are found, on every sequence."""
    src = os.path.join(SHARED, "rlds", "bridge_dataset", "1.0.0")
    if not os.path.isdir(src):
        pytest.skip(f"real fixture not found at {src} (../shared/fixtures is absent in a plain clone)")
    _convert(src, tmp_path / "out", "--video_stats")
    header, findings = reader.open_dataset(str(tmp_path / "out")).quality()
    dead = [f for f in findings if f["check"] == "dead_camera"]
    assert len(dead) == 50 and {f["column"] for f in dead} == {"video_image_3"}
    assert dead[0]["message"] == "every sampled frame holds one value per channel (0, 0, 0)"
    duplicates = {f["sequence_id"] for f in findings if f["check"] == "duplicate"}
    assert len(duplicates) == 25 and all(sequence_id.startswith("val_") for sequence_id in duplicates)
    assert {f["check"] for f in findings} == {"dead_camera", "duplicate"}


def test_dataset_wide_checks_end_to_end(tmp_path):
    """zero_variance, clipped, rate_drift and rare_task, planted in a LeRobot dataset."""
    from formats.sources.lerobot_v3.sample import SyntheticLeRobot, write_dataset

    src = tmp_path / "src"
    write_dataset(str(src), SyntheticLeRobot(lengths=(40,) * 5, cameras=(), tasks=("Pick up the cube.",)))

    def plant(columns):
        episode = columns["episode_index"]
        columns["action"][:, 5] = 0.25  # one value in every step of every episode
        rows = np.flatnonzero(episode == 1)
        columns["observation.state"][rows[10:22], 2] = columns["observation.state"][:, 2].max() + 1  # the dataset's max, 12 steps
        rows = np.flatnonzero(episode == 2)
        columns["timestamp"][rows] = (np.arange(40) * 1.05 / 30).astype(np.float32)  # 5 % slow
        columns["task_index"][episode == 3] = 1

    _rewrite(glob.glob(str(src / "data" / "*" / "*.parquet"))[0], plant)
    pq.write_table(pa.Table.from_pydict({"task_index": [0, 1]}).append_column(
        "__index_level_0__", pa.array(["Pick up the cube.", "Open the drawer."])), str(src / "meta" / "tasks.parquet"))  # lerobot 0.4.4's layout
    dst = tmp_path / "out"
    _convert(src, dst)
    found = _found(dst)
    assert ("zero_variance", None, "action", [5], None) in found, found
    assert ("clipped", "episode_000001", "obs_state", [2], [10, 21]) in found
    assert ("rate_drift", "episode_000002", "timestamp", None, [0, 39]) in found
    rare = [f for f in reader.open_dataset(str(dst)).quality()[1] if f["check"] == "rare_task"]
    assert [f["message"] for f in rare] == ["task 'Open the drawer.' has 1 sequence(s)"]
    assert not any(f[0] == "frozen" and f[2] == "action" for f in found)  # said once, by zero_variance


def _fixtures() -> list:
    cases = [pytest.param(os.path.join(SHARED, path), extra, id=path.split("/")[1]) for path, extra in [
        ("lerobot_v3/so100_tiny", ()), ("lerobot_v3/multi_lerobot061", ()), ("lerobot_v3/images_lerobot061", ()),
        ("lerobot_v3/stream_lerobot061", ()), ("rlds/bridge_dataset/1.0.0", ("--video_stats",)), ("l5kit/single_scene.zarr", ())]]
    return cases + [pytest.param(None, name, id=f"sample-{name}") for name in sorted(samples.SAMPLES)]


@pytest.mark.parametrize(("path", "extra"), _fixtures())
def test_real_fixtures_and_samples_give_no_error_level_finding(path, extra, tmp_path, sample_inputs):
    if path is None:
        path, options = sample_inputs[extra]
        extra = tuple(options)
    elif not os.path.isdir(path):
        pytest.skip(f"real fixture not found at {path} (../shared/fixtures is absent in a plain clone)")
    _convert(path, tmp_path / "out", *extra)
    header, findings = reader.open_dataset(str(tmp_path / "out")).quality()
    assert [f for f in findings if f["level"] == quality.ERROR] == []
    assert all(entry["findings"] == 0 for entry in header["checks"].values() if entry["level"] == quality.ERROR)


@pytest.fixture(scope="module")
def flawed(tmp_path_factory):
    """A LeRobot dataset with a NaN action (an error) and a short episode (a warning), converted."""
    from formats.sources.lerobot_v3.sample import SyntheticLeRobot, write_dataset

    root = tmp_path_factory.mktemp("flawed")
    write_dataset(str(root / "src"), SyntheticLeRobot(lengths=(30, 30, 1), cameras=(), tasks=("Pick up the cube.",)))

    def plant(columns):
        columns["action"][3, 1] = np.nan

    _rewrite(glob.glob(str(root / "src" / "data" / "*" / "*.parquet"))[0], plant)
    _convert(root / "src", root / "out")
    _convert(root / "src", root / "bare", "--quality=false")
    return root


def test_inspect_prints_a_line_per_check_and_the_worst_sequences(flawed, capsys):
    assert inspect.main([str(flawed / "out")]) == 0
    out = capsys.readouterr().out
    tail = out[out.index("\nquality "):]
    assert tail.splitlines()[1:6] == [
        "quality     1 error(s), 1 warning(s), recorded by the conversion",
        "  non_finite     error    1 finding(s)",
        "    episode_000000 action steps 3-3: 1 NaN value(s) in steps 3-3",
        "  short          warning  1 finding(s)",
        "    episode_000002 steps 0-0: 1 steps, fewer than 2",
    ]


def test_inspect_json_gives_the_findings_to_a_script(flawed, capsys):
    assert inspect.main([str(flawed / "out"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["quality"]["recorded"] is True
    assert [(f["check"], f["sequence_id"], f["steps"]) for f in summary["quality"]["findings"]] == [
        ("non_finite", "episode_000000", [3, 3]), ("short", "episode_000002", [0, 0])]
    assert summary["sequences"] == 3 and summary["quality"]["checks"]["non_finite"]["findings"] == 1


def test_the_report_page_has_the_findings_by_sequence(flawed, tmp_path, capsys):
    page = tmp_path / "report.html"
    assert inspect.main([str(flawed / "out"), "--html", str(page)]) == 0
    text = page.read_text()
    assert '<h2 id="quality">Data quality</h2>' in text and "1 error(s), 1 warning(s)" in text
    assert "<details><summary><code>episode_000000</code> 1 finding(s): error</summary>" in text
    assert "<td>non_finite</td><td>error</td><td><code>action</code></td><td>1</td><td>3&ndash;3</td>" in text


@pytest.mark.parametrize(("extra", "code", "last"), [
    ([], 1, "quality: 1 finding(s) at --fail_on=error or above in {dst}\n"),
    (["--fail_on=warning"], 1, "quality: 2 finding(s) at --fail_on=warning or above in {dst}\n"),
])
def test_validate_quality_gives_ci_an_exit_status(flawed, capsys, extra, code, last):
    dst = str(flawed / "out")
    assert validate.main([dst, "--quality", *extra]) == code
    captured = capsys.readouterr()
    assert captured.err == last.format(dst=dst)
    assert captured.out.startswith(f"ok: {dst} is a valid Mixtrain dataset\nquality     1 error(s), 1 warning(s)")


def test_validate_quality_passes_a_clean_dataset_and_fail_on_needs_quality(sample_inputs, tmp_path, capsys):
    src, extra = sample_inputs["lerobot_v3"]
    _convert(src, tmp_path / "out", *extra)
    assert validate.main([str(tmp_path / "out"), "--quality"]) == 0
    assert capsys.readouterr().out.endswith("quality: no finding at --fail_on=error or above\n")
    assert validate.main([str(tmp_path / "out"), "--fail_on=warning"]) == 2
    assert capsys.readouterr().err == "error: --fail_on has no effect without --quality\n"


def test_validate_recompute_does_not_take_a_received_datasets_word(flawed, tmp_path, capsys):
    """A received dataset whose _quality.jsonl was emptied (its header claims nothing found):
    --recompute finds the NaN in its rows again."""
    import shutil

    dst = tmp_path / "forged"
    shutil.copytree(flawed / "out", dst)
    header = json.loads((dst / quality.QUALITY_FILE).read_text().splitlines()[0])
    for entry in header["checks"].values():
        entry.update(findings=0, listed=0, sequences=0)
    (dst / quality.QUALITY_FILE).write_text(json.dumps(header) + "\n")
    assert validate.main([str(dst), "--quality"]) == 0
    capsys.readouterr()
    assert validate.main([str(dst), "--quality", "--recompute"]) == 1
    assert "quality     1 error(s), 1 warning(s), computed now from the rows" in capsys.readouterr().out
    assert validate.main([str(dst), "--recompute"]) == 2


def test_a_dataset_without_findings_gets_them_computed(flawed, capsys):
    dst = str(flawed / "bare")
    assert "quality" not in json.loads((flawed / "bare" / "mixtrain.json").read_text())
    assert not (flawed / "bare" / quality.QUALITY_FILE).exists()
    dataset = reader.open_dataset(dst)
    assert dataset.quality() is None
    computed = dataset.compute_quality()
    recorded = reader.open_dataset(str(flawed / "out")).quality()
    assert computed[1] == recorded[1]  # the same findings from the rows as in the conversion's pass
    assert validate.main([dst, "--quality"]) == 1
    assert "quality     1 error(s), 1 warning(s), computed now from the rows\n" in capsys.readouterr().out
    assert inspect.main([dst]) == 0  # the summary reads no per-step column unless asked
    assert capsys.readouterr().out.endswith("quality     not recorded (converted with --quality=false or by an earlier version): "
                                            "inspect --quality or validate --quality computes it from the rows\n")
    assert inspect.main([dst, "--quality"]) == 0
    assert "quality     1 error(s), 1 warning(s), computed now from the rows" in capsys.readouterr().out


@pytest.mark.parametrize("table_format", ["iceberg", "delta", "lance"])
def test_lake_tables_keep_the_findings(flawed, tmp_path, table_format):
    dst = tmp_path / table_format
    _convert(flawed / "src", dst, f"--table_format={table_format}")
    dataset = reader.open_dataset(str(dst))
    header, findings = dataset.quality()
    assert [(f["check"], f["sequence_id"]) for f in findings] == [("non_finite", "episode_000000"), ("short", "episode_000002")]
    assert dataset.compute_quality(batch_rows=2)[1] == findings  # read back from the table, a batch of rows at a time


def test_hostile_findings_are_escaped_in_the_terminal_and_the_page(flawed, tmp_path, capsys):
    import shutil

    dst = tmp_path / "hostile"
    shutil.copytree(flawed / "out", dst)
    path = dst / quality.QUALITY_FILE
    header, *lines = path.read_text().splitlines()
    finding = json.loads(lines[0])
    finding.update(sequence_id="<script>alert(1)</script>", message="\x1b]8;;http://evil\x07click\x1b]8;;\x07 <img src=x onerror=alert(1)>",
                   column="\x1b[31mred")
    path.write_text("\n".join([header, json.dumps(finding), *lines[1:]]) + "\n")
    page = tmp_path / "page.html"
    assert inspect.main([str(dst), "--html", str(page)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    text = page.read_text()
    assert "<script>alert" not in text and "<img src=x" not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text


@pytest.mark.parametrize(("content", "expected"), [
    ("", "empty (no quality header)"),
    ('{"mixtrain_quality": 1}\n', "line 1 is not a quality header of version 1"),
    ("not json\n", "line 1 is not JSON (Expecting value: line 1 column 1 (char 0))"),
])
def test_a_damaged_findings_file_is_one_error_line(flawed, tmp_path, capsys, content, expected):
    import shutil

    dst = tmp_path / "damaged"
    shutil.copytree(flawed / "out", dst)
    (dst / quality.QUALITY_FILE).write_text(content)
    assert inspect.main([str(dst)]) == 1
    assert capsys.readouterr().err == f"error: {dst / quality.QUALITY_FILE}: {expected}\n"
    (dst / quality.QUALITY_FILE).unlink()
    assert inspect.main([str(dst)]) == 1
    assert capsys.readouterr().err == f"error: {dst / quality.QUALITY_FILE}: listed in mixtrain.json but missing\n"


def test_a_hundred_thousand_findings_keep_the_page_small(flawed, tmp_path, capsys):
    """What a dataset with 100,000 findings of one check holds (the count, the 1,000 worst listed):
    a fast summary and a small page; a forged file that lists all of them is refused in one line."""
    import shutil

    dst = tmp_path / "many"
    shutil.copytree(flawed / "out", dst)
    header = json.loads((dst / quality.QUALITY_FILE).read_text().splitlines()[0])
    for check in ("non_finite", "short"):
        header["checks"][check].update(findings=0, listed=0, sequences=0)

    def lines(count: int) -> str:
        return "\n".join(json.dumps({"check": "jump", "level": "warning", "sequence_id": f"s{i:06d}", "column": "action", "dims": [0],
                                     "steps": [1, 2], "score": 7.0, "message": "m"}) for i in range(count)) + "\n"

    header["checks"]["jump"].update(findings=100_000, listed=quality.MAX_LISTED, sequences=quality.MAX_LISTED)
    (dst / quality.QUALITY_FILE).write_text(json.dumps(header) + "\n" + lines(quality.MAX_LISTED))
    page = tmp_path / "page.html"
    assert inspect.main([str(dst), "--html", str(page)]) == 0
    assert "  jump           warning  100000 finding(s)" in capsys.readouterr().out
    assert page.stat().st_size < 1_000_000 and page.read_text().count("<details>") == report.PAGE_FINDINGS
    header["checks"]["jump"].update(listed=100_000, sequences=100_000)
    (dst / quality.QUALITY_FILE).write_text(json.dumps(header) + "\n" + lines(100_000))
    assert inspect.main([str(dst)]) == 1
    assert capsys.readouterr().err == (f"error: {dst / quality.QUALITY_FILE}: line 1: check 'jump' is not {{level, checked, findings, "
                                       "listed, sequences} of a known check at its level\n")


def test_the_command_line_refuses_thresholds_that_do_nothing(sample_inputs, tmp_path):
    src, _ = sample_inputs["lerobot_v3"]
    for argv, message in [(["--quality=false", "--quality_jump_sigma=4"], "error: --quality_jump_sigma has no effect with --quality=false "
                                                                          "(no findings are computed)"),
                          (["--quality_frozen_share=1.5"], "error: --quality_frozen_share: expected a share of the steps (0 to 1), found 1.5"),
                          (["--quality_min_length=-1"], "error: argument --quality_min_length: expected a number >= 0, found '-1'")]:
        done = subprocess.run([sys.executable, "-m", "pipelines.convert", f"--input={src}", f"--output={tmp_path / 'x'}", *argv],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and done.stderr.splitlines()[0] == message, done.stderr
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(("source", "option", "why"), [
    ("rlds", "--quality_first_time=2", "only LeRobot sources record where an episode's clock started; this rlds dataset's timestamps are "
                                       "rebased by its own rule"),
    ("l5kit", "--quality_idle_steps=5", "this dataset has no action trajectory"),
])
def test_a_threshold_no_check_of_the_dataset_reads_is_refused(sample_inputs, tmp_path, capsys, source, option, why):
    src, extra = sample_inputs[source]
    out, console = io.StringIO(), io.StringIO()
    assert conversion.run([f"--input={src}", f"--output={tmp_path / 'x'}", "--progress=off", *extra, option], out=out, console=console) == 2
    assert console.getvalue().splitlines()[0] == f"error: {option.split('=')[0]} has no effect: {why}"
    assert not (tmp_path / "x").exists()


def test_every_threshold_has_an_option_and_the_same_default():
    import argparse

    from pipelines import cli

    names = [name for name, *_ in cli.QUALITY_THRESHOLDS]
    assert names == [field for field in quality.Thresholds.__dataclass_fields__]
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    helps = {action.dest: action.help for action in parser._actions}
    for name in names:
        default = getattr(quality.Thresholds(), name)
        assert f"(default {default:g})" in helps[f"quality_{name}"], (name, helps[f"quality_{name}"])
