"""Reliability: --on_error=skip, the bad-input catalogue end to end, NaN/inf, determinism, file handles."""

import json
import os
import pathlib
import re
import shutil
import stat

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from formats import samples
from formats.errors import ConversionError
from formats.sources.l5kit.sample import SyntheticL5Kit
from formats.sources.l5kit.sample import write_dataset as write_l5kit
from formats.sources.lerobot_v2.sample import write_dataset as write_lerobot_v2
from formats.sources.lerobot_v3.sample import SyntheticLeRobot
from formats.sources.lerobot_v3.sample import write_dataset as write_lerobot
from formats.sources.ortf.sample import SyntheticORTF
from formats.sources.ortf.sample import write_dataset as write_ortf
from formats.sources.rlds.sample import SyntheticRLDS
from formats.sources.rlds.sample import write_dataset as write_rlds
from pipelines import convert, validate


def _convert(src, dst, *extra):
    return convert.run([f"--input={src}", f"--output={dst}", "--progress=off", *extra])


def _errors(dst):
    path = dst / "_errors.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _last_error_line(capsys):
    """The run's `error:` line (a resumption hint may follow it)."""
    return [line for line in capsys.readouterr().err.strip().splitlines() if line.startswith("error: ")][-1]


MULTI = SyntheticLeRobot(lengths=(8, 6, 9, 7, 5), codec="h264", gop=None, episodes_per_video_file=2, episodes_per_data_file=3)


def test_skip_publishes_the_good_sequences_and_lists_the_bad(tmp_path, capsys):
    src = tmp_path / "ds"
    write_lerobot(str(src), MULTI)
    (src / "videos/observation.images.wrist/chunk-000/file-001.mp4").unlink()  # episodes 2 and 3
    dst = tmp_path / "out"
    assert _convert(src, dst) == convert.EXIT_FAILED  # fail: nothing published
    assert not dst.exists()
    capsys.readouterr()
    assert _convert(src, dst, "--on_error=skip") == convert.EXIT_FAILED  # 2 of 5 is more than the default 10 %
    assert _last_error_line(capsys) == (f"error: {dst}: 2 of 5 sequences were skipped, more than --max_skipped=10%; nothing was published "
                                        f"(first: {src}/videos/observation.images.wrist/chunk-000/file-001.mp4: episode_000002 "
                                        "(video_wrist): video file not found)")
    assert not dst.exists()
    assert _convert(src, dst, "--on_error=skip", "--max_skipped=2") == convert.EXIT_SKIPPED
    out = capsys.readouterr().out
    assert "converted 3 sequences" in out and "skipped 2 bad sequence(s), listed in" in out
    records = _errors(dst)
    assert [r["sequence_id"] for r in records] == ["episode_000002", "episode_000003"]
    assert all(r["stage"] == "video" and r["source_file"].endswith("videos/observation.images.wrist/chunk-000/file-001.mp4")
               for r in records)
    assert records[0]["error"].endswith("video file not found")
    assert validate.validate(str(dst)) == []
    rows = pq.read_table(dst / "data").column("sequence_id").to_pylist()
    assert sorted(rows) == ["episode_000000", "episode_000001", "episode_000004"]
    assert not (dst / "files/video_front/episode_000002.mp4").exists()  # no files left from a skipped sequence
    sidecar = json.loads((dst / "mixtrain.json").read_text())
    assert sidecar["num_skipped"] == 2 and sidecar["errors"] == "_errors.jsonl"


def test_nothing_is_published_over_a_good_dataset_when_every_sequence_fails_or_none_is_left(tmp_path, capsys):
    src = tmp_path / "ds"
    write_lerobot(str(src), MULTI)
    dst = tmp_path / "out"
    assert _convert(src, dst) == convert.EXIT_OK
    before = _published(dst)
    for video in src.glob("videos/*/*/*.mp4"):
        video.write_bytes(b"")
    assert _convert(src, dst, "--overwrite", "--on_error=skip", "--max_skipped=100%") == convert.EXIT_FAILED
    assert _last_error_line(capsys).startswith(f"error: {dst}: no sequence was converted (5 skipped) (first: ")
    assert _published(dst) == before
    for index in src.glob("meta/episodes/*/*.parquet"):  # the source's episode index became empty
        pq.write_table(pq.read_table(index).slice(0, 0), index)
    info = json.loads((src / "meta/info.json").read_text())
    (src / "meta/info.json").write_text(json.dumps({**info, "total_episodes": 0}))
    assert _convert(src, dst, "--incremental") == convert.EXIT_FAILED
    assert _last_error_line(capsys) == f"error: file://{src}: the lerobot_v3 dataset holds no sequences; nothing to convert " \
                                       "(an existing dataset at the output is left as it was)"
    assert _published(dst) == before


def test_max_skipped_is_checked_on_the_command_line(tmp_path, capsys):
    assert _convert(tmp_path, tmp_path / "out", "--max_skipped=10%") == convert.EXIT_USAGE
    assert "--max_skipped has no effect with --on_error=fail" in capsys.readouterr().err
    assert _convert(tmp_path, tmp_path / "out", "--on_error=skip", "--max_skipped=lots") == convert.EXIT_USAGE
    assert "expected a count like 5 or a percentage like 10%, found 'lots'" in capsys.readouterr().err


def test_skip_rlds_corrupt_record_and_unreadable_shard(tmp_path):
    src = tmp_path / "rlds" / "1.0.0"
    write_rlds(str(src), SyntheticRLDS(splits={"train": (4, 5, 6), "val": (3, 4)}, shards={"train": 1, "val": 1}))
    train = src / "synthetic_rlds-train.tfrecord-00000-of-00001"
    data = bytearray(train.read_bytes())
    data[100] ^= 0xFF  # inside record 0
    train.write_bytes(bytes(data))
    val = src / "synthetic_rlds-val.tfrecord-00000-of-00001"
    val.write_bytes(val.read_bytes()[:-9])  # the last record is cut: the shard cannot be indexed
    dst = tmp_path / "out"
    assert _convert(src, dst, "--fps=10", "--on_error=skip", "--max_skipped=100%") == convert.EXIT_SKIPPED
    records = _errors(dst)
    assert [(r["sequence_id"], r["stage"]) for r in records] == [(None, "index"), ("train_00000_000000", "load")]
    assert "val shard 0: record 1: truncated" in records[0]["error"]
    assert "data checksum mismatch" in records[1]["error"] and records[1]["source_file"].endswith("train.tfrecord-00000-of-00001")
    assert pq.read_table(dst / "data").num_rows == 2 and validate.validate(str(dst)) == []


def test_nan_and_inf_are_kept_counted_and_reported(tmp_path, capsys):
    src = tmp_path / "ds"
    write_lerobot(str(src), SyntheticLeRobot(lengths=(5, 4), cameras=()))
    data = src / "data/chunk-000/file-000.parquet"
    table = pq.read_table(data)
    state = table.column("observation.state").combine_chunks()
    values = state.flatten().to_numpy().copy()
    values[[3, 10, 11]] = [np.nan, np.inf, -np.inf]
    column = pa.FixedSizeListArray.from_arrays(pa.array(values), 6)
    pq.write_table(table.set_column(table.schema.get_field_index("observation.state"), "observation.state", column), data)
    dst = tmp_path / "out"
    assert _convert(src, dst) == convert.EXIT_OK
    assert "kept 3 NaN/inf value(s) (obs_state: 3)" in capsys.readouterr().out
    assert json.loads((dst / "mixtrain.json").read_text())["non_finite_values"] == {"obs_state": 3}
    got = np.array(pq.read_table(dst / "data").sort_by("sequence_id").column("obs_state")[0].as_py())
    assert np.isnan(got[0, 3]) and got[1, 4] == np.inf and got[1, 5] == -np.inf


def test_symlink_out_of_the_root_is_refused(tmp_path, capsys):
    src = tmp_path / "ortf"
    write_ortf(str(src), SyntheticORTF(lengths=(4, 3), audio=False, annotations=False, slow_camera=None))
    outside = tmp_path / "secret.mp4"
    target = src / "videos/cam_wrist/chunk-000/episode_000001.mp4"
    shutil.move(target, outside)
    os.symlink(outside, target)
    assert _convert(src, tmp_path / "out") == convert.EXIT_FAILED
    line = _last_error_line(capsys)
    assert line.startswith("error: ") and f"video file 'videos/cam_wrist/chunk-000/episode_000001.mp4' is a symlink to {outside}" in line
    assert line.endswith("outside the dataset root")


def test_truncated_parquet_schema_drift_and_absurd_lengths(tmp_path, capsys):
    src = tmp_path / "ds"
    write_lerobot(str(src), SyntheticLeRobot(lengths=(5, 4, 6), cameras=(), episodes_per_data_file=2))
    second = src / "data/chunk-000/file-001.parquet"
    table = pq.read_table(second)
    drifted = table.set_column(table.schema.get_field_index("action"), "action",
                               pa.FixedSizeListArray.from_arrays(table.column("action").combine_chunks().flatten().cast(pa.float64()), 6))
    pq.write_table(drifted, second)
    assert _convert(src, tmp_path / "a") == convert.EXIT_FAILED
    assert _last_error_line(capsys).endswith(
        f"{second}: episode_000002: schema drift between data files: action is fixed_size_list<element: double>[6] here, "
        f"fixed_size_list<element: float>[6] in {src / 'data/chunk-000/file-000.parquet'}")
    second.write_bytes(second.read_bytes()[: second.stat().st_size // 2])  # truncated: no footer
    assert _convert(src, tmp_path / "b") == convert.EXIT_FAILED
    assert "file-001.parquet: episode_000002: cannot read data:" in _last_error_line(capsys)
    episodes = src / "meta/episodes/chunk-000/file-000.parquet"
    rows = pq.read_table(episodes).to_pylist()
    rows[0].update(length=10**12, dataset_to_index=10**12)
    pq.write_table(pa.Table.from_pylist(rows), episodes)
    assert _convert(src, tmp_path / "c") == convert.EXIT_FAILED
    assert _last_error_line(capsys).endswith("episode_000000: length 1000000000000 is not plausible (more than 1e+09 frames)")


# Every registered source's sample, and the multi-file LeRobot dataset re-encoded with image statistics.
SOURCES = {name: (sample.small, list(sample.convert_args)) for name, sample in samples.SAMPLES.items()}
SOURCES["lerobot_v3_reencode"] = (lambda p: write_lerobot(str(p), MULTI), ["--video=reencode", "--video_stats"])


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_same_input_and_options_give_identical_outputs(tmp_path, name):
    write, extra = SOURCES[name]
    src = tmp_path / "src"
    write(str(src))
    outputs = [tmp_path / "one", tmp_path / "two"]
    for dst in outputs:
        # The README's local parallel mode: shards and videos written by 2 forked worker processes, a
        # fresh pair each run (in_memory mode would run both conversions in this one process).
        assert _convert(src, dst, "--num_shards=2", "--direct_num_workers=2", "--direct_running_mode=multi_processing",
                        *extra) == convert.EXIT_OK
    first, second = ({p.relative_to(d): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()} for d in outputs)
    assert first.keys() == second.keys()
    sidecars = [json.loads(files.pop(pathlib.Path("mixtrain.json"))) for files in (first, second)]
    for sidecar in sidecars:
        sidecar.pop("created_at")
    assert sidecars[0] == sidecars[1]
    different = [str(path) for path in first if first[path] != second[path]]
    assert different == []  # shards, stats.json and every video, byte for byte


def test_no_file_handles_leak_per_episode(tmp_path):
    src = tmp_path / "ds"
    write_lerobot(str(src), SyntheticLeRobot(lengths=[6] * 60, codec="h264", gop=None, episodes_per_video_file=10,
                                              episodes_per_data_file=10))
    before = len(os.listdir("/proc/self/fd"))
    assert _convert(src, tmp_path / "out") == convert.EXIT_OK
    assert _convert(src, tmp_path / "out2", "--video=reencode") == convert.EXIT_OK
    after = len(os.listdir("/proc/self/fd"))
    assert after - before < 10, f"{after - before} file descriptors left open after converting 120 episodes"


def _state(dst):
    """The published dataset as a reader sees it: mixtrain.json's shard count and every shard's bytes."""
    assert validate.validate(str(dst)) == [], "the output must always be a complete, valid dataset"
    sidecar = json.loads((dst / "mixtrain.json").read_text())
    return sidecar["num_shards"], tuple((dst / shard).read_bytes() for shard in sidecar["shards"])


def test_sigkill_at_any_point_leaves_the_previous_dataset_and_the_next_run_completes(tmp_path):
    """SIGKILL while planning, while writing videos, after staging and right after the exchange.
    Where the kill landed is proved, not assumed: the run logs every publication step it reaches
    (publish.STEP_LOG), the last two kills happen at named steps (publish.STOP_AT), and each
    outcome is then exactly one: the previous dataset byte for byte, or the new one whole."""
    import signal
    import subprocess
    import sys
    import time

    from formats.mixtrain import publish

    src = tmp_path / "ds"
    write_lerobot(str(src), SyntheticLeRobot(lengths=[12] * 24, codec="h264", gop=None, episodes_per_video_file=6))
    dst = tmp_path / "out"
    base = [sys.executable, "-m", "pipelines.convert", f"--input={src}", f"--output={dst}", "--progress=off"]
    root = pathlib.Path(__file__).resolve().parents[2]
    assert subprocess.run([*base, "--num_shards=2"], cwd=root, capture_output=True, timeout=300).returncode == 0
    previous = _state(dst)
    replacement = [*base, "--num_shards=3", "--video=reencode", "--overwrite"]
    for moment, stop_at, reached, outcome in (("planning", None, [], "previous"), ("writing videos", None, [], "previous"),
                                              ("staged", "parquet:staged", ["parquet:staged"], "previous"),
                                              ("exchanged", "parquet:exchanged", ["parquet:staged", "parquet:exchanged"], "new")):
        log = tmp_path / f"steps-{len(moment)}.log"
        env = {**os.environ, publish.STEP_LOG: str(log), **({publish.STOP_AT: stop_at} if stop_at else {})}
        process = subprocess.Popen(replacement, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   start_new_session=True)
        started = time.monotonic()
        while stop_at is None and process.poll() is None and time.monotonic() - started < 120:
            if moment == "planning" and time.monotonic() - started > 1.0:
                break
            if moment == "writing videos" and any(tmp_path.glob(".out.mixtrain-*/files/*/*")):
                break
            time.sleep(0.005)
        if stop_at is None:
            os.killpg(process.pid, signal.SIGKILL)  # the launcher and its workers, as a machine dies
        assert process.wait(timeout=300) == -signal.SIGKILL, moment
        steps = log.read_text().split() if log.exists() else []
        assert steps == reached, f"{moment}: the kill landed after {steps}"
        state = _state(dst)
        assert state == previous if outcome == "previous" else state[0] == 3, moment
    finished = subprocess.run(replacement, cwd=root, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr[-2000:]
    assert _state(dst)[0] == 3
    assert not list(tmp_path.glob(".out.mixtrain-*")) and not (dst / "_versions").exists()  # leftovers collected


def _published(dst):
    return {p.relative_to(dst).as_posix(): p.read_bytes() for p in sorted(dst.rglob("*")) if p.is_file()}


def test_incremental_reuses_unchanged_episodes_and_equals_a_full_conversion(tmp_path):
    from formats.sources.lerobot_v3.sample import synthetic_frames
    from formats.video import encode_frames
    from formats.video.policy import EncodeOptions

    src = tmp_path / "ortf"
    # Numeric ids: annotation folders follow the id, not the row (rows move when one is deleted).
    write_ortf(str(src), SyntheticORTF(lengths=(6, 5, 7, 4, 6, 5), episodes_per_chunk=3, slow_camera=None, sequential_ids=True))
    dst = tmp_path / "nightly"
    assert _convert(src, dst, "--video=reencode") == convert.EXIT_OK
    before = _published(dst)
    # Overnight: episode 2's wrist video is re-recorded, episode 4 is deleted from the index.
    changed = src / "videos/cam_wrist/chunk-000/episode_000002.mp4"
    with open(changed, "wb") as handle:
        encode_frames(synthetic_frames(9, 9, 7, 48, 64), handle, fps=15, options=EncodeOptions("h264", crf=18, gop=10))
    episodes = pq.read_table(src / "meta/episodes.parquet")
    pq.write_table(episodes.filter(pa.compute.not_equal(episodes.column("episode_id"), episodes.column("episode_id")[4])),
                   src / "meta/episodes.parquet")
    assert _convert(src, dst, "--video=reencode", "--incremental") == convert.EXIT_OK
    sidecar = json.loads((dst / "mixtrain.json").read_text())
    assert sidecar["incremental"]["reused_sequences"] == 4 and sidecar["incremental"]["converted_units"] == 1
    after = _published(dst)
    full = tmp_path / "full"
    assert _convert(src, full, "--video=reencode") == convert.EXIT_OK
    reference = _published(full)
    drop = {"mixtrain.json", "_fingerprints.json"}
    assert {k: v for k, v in after.items() if k not in drop} == {k: v for k, v in reference.items() if k not in drop}
    assert json.loads(after["_fingerprints.json"]) == json.loads(reference["_fingerprints.json"])
    ids = pq.read_table(dst / "data").column("episode_id").to_pylist()
    assert len(ids) == 5 and "000004" not in ids
    wrist = "files/video_cam_wrist/000002.mp4"
    assert after[wrist] != before[wrist]  # the changed episode was converted again
    assert after["files/video_cam_wrist/000000.mp4"] == before["files/video_cam_wrist/000000.mp4"]
    assert validate.deep_check(str(dst))[0] == []
    # Nothing changed since: everything is reused.
    assert _convert(src, dst, "--video=reencode", "--incremental") == convert.EXIT_OK
    assert json.loads((dst / "mixtrain.json").read_text())["incremental"]["converted_units"] == 0


def test_incremental_rlds_reconverts_only_the_changed_shard(tmp_path):
    src = tmp_path / "rlds" / "1.0.0"
    write_rlds(str(src), SyntheticRLDS(splits={"train": (4, 5, 6, 3)}, shards={"train": 2}))
    dst = tmp_path / "out"
    assert _convert(src, dst, "--fps=10") == convert.EXIT_OK
    shard = src / "synthetic_rlds-train.tfrecord-00001-of-00002"
    shard.write_bytes(shard.read_bytes())  # rewritten: a new mtime, same content
    os.utime(shard, (1, 1))
    assert _convert(src, dst, "--fps=10", "--incremental") == convert.EXIT_OK
    incremental = json.loads((dst / "mixtrain.json").read_text())["incremental"]
    assert (incremental["reused_sequences"], incremental["converted_units"]) == (2, 1)
    assert pq.read_table(dst / "data").num_rows == 4 and validate.validate(str(dst)) == []


def test_incremental_without_a_previous_dataset_is_a_full_run_and_refuses_video_stats(tmp_path, capsys):
    src = tmp_path / "ds"
    write_l5kit(str(src), SyntheticL5Kit(scene_lengths=(5, 6)))
    assert _convert(src, tmp_path / "out", "--incremental") == convert.EXIT_OK
    assert "incremental" not in json.loads((tmp_path / "out/mixtrain.json").read_text())
    assert _convert(src, tmp_path / "out", "--incremental", "--video_stats") == convert.EXIT_USAGE
    assert "--video_stats cannot be combined with --incremental" in capsys.readouterr().err


@pytest.mark.parametrize("source, target, text, message", [
    ("rlds", "features.json", "{not json", r"features.json: malformed JSON"),
    ("l5kit", "frames/.zarray", "[1,", r"frames/.zarray: malformed JSON"),
    ("ortf", "meta/manifest.json", '{"ortf_version": 0.2', r"meta/manifest.json: malformed JSON"),
    ("ortf", "meta/manifest.json", '["a list"]', r"meta/manifest.json: expected a JSON object"),
    ("lerobot_v3", "meta/info.json", '{"codebase_version": "v1.6"}', r"codebase_version 'v1.6' is not supported \(the lerobot_v3 "
     r"source reads v3.0, lerobot_v2 reads v2.0 and v2.1\)"),
    ("lerobot_v2", "meta/episodes.jsonl", '{"episode_index": 0, "tasks": [], "length": 3}\n{"episode_index": 1,\n',
     r"meta/episodes.jsonl: line 2: malformed JSON"),
])
def test_malformed_metadata_is_one_line_naming_the_file(tmp_path, capsys, source, target, text, message):
    writers = {"rlds": lambda p: write_rlds(str(p), SyntheticRLDS(splits={"train": (3,)}, shards={"train": 1})),
               "l5kit": lambda p: write_l5kit(str(p), SyntheticL5Kit(scene_lengths=(4,))),
               "ortf": lambda p: write_ortf(str(p), SyntheticORTF(lengths=(3,))),
               "lerobot_v3": lambda p: write_lerobot(str(p), SyntheticLeRobot(lengths=(3,), cameras=())),
               "lerobot_v2": lambda p: write_lerobot_v2(str(p), SyntheticLeRobot(lengths=(3,), cameras=()))}
    src = tmp_path / "src"
    writers[source](src)
    (src / target).write_text(text)
    assert _convert(src, tmp_path / "out", f"--source={source}", "--fps=10") == convert.EXIT_FAILED
    line = _last_error_line(capsys)
    assert line.startswith(f"error: {src / target}") and len(line.splitlines()) == 1
    assert re.search(message, line), line


def test_a_second_writer_is_refused_while_one_is_live(tmp_path, capsys):
    import subprocess
    import sys

    src = tmp_path / "ds"
    write_l5kit(str(src), SyntheticL5Kit(scene_lengths=(4, 5)))
    dst = tmp_path / "out"
    assert _convert(src, dst) == convert.EXIT_OK
    staging = tmp_path / ".out.mixtrain-other-run"  # a live run's staging, beside the output, locked as claim_staging does
    staging.mkdir(parents=True)
    sleeper = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; lock = open(sys.argv[1], 'w'); "
                                "fcntl.flock(lock, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(60)",
                                str(staging / ".lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert sleeper.stdout.readline() == "locked\n"
        (staging / ".owner").write_text(f"{os.uname().nodename} {sleeper.pid}\n")
        assert _convert(src, dst, "--overwrite") == convert.EXIT_FAILED
        assert f"another conversion (pid {sleeper.pid}) is writing this output" in _last_error_line(capsys)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert _convert(src, dst, "--overwrite") == convert.EXIT_OK  # a dead owner's staging is collected
    assert not staging.exists() and validate.validate(str(dst)) == []


@pytest.mark.parametrize("lock", ["unlocked", "no lock file"])
def test_a_dead_runs_pid_taken_by_another_process_is_not_a_live_writer(tmp_path, capsys, lock):
    """A killed run's staging names its pid; a restarted container or a reboot gives that pid to
    another process. Whether the run lives is its lock (the kernel drops it with the process), not
    its pid: the next run resumes or collects the folder instead of refusing every run for good.
    Without a lock file there is no live owner (an owner file naming a live pid is easy to plant)."""
    import subprocess
    import sys

    src = tmp_path / "ds"
    write_l5kit(str(src), SyntheticL5Kit(scene_lengths=(4, 5)))
    dst = tmp_path / "out"
    assert _convert(src, dst) == convert.EXIT_OK
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # alive, holding no lock
    try:
        staging = tmp_path / ".out.mixtrain-20261129T000000-0badc0de"
        staging.mkdir(parents=True)
        (staging / ".owner").write_text(f"{os.uname().nodename} {other.pid}\n")
        if lock == "unlocked":
            (staging / ".lock").write_text("")
        assert _convert(src, dst, "--overwrite") == convert.EXIT_OK
        assert not staging.exists() and validate.validate(str(dst)) == []
    finally:
        other.kill()
        other.wait()


def test_a_users_own_current_folder_is_not_taken_for_ours(tmp_path, capsys):
    src = tmp_path / "ds"
    write_l5kit(str(src), SyntheticL5Kit(scene_lengths=(4,)))
    dst = tmp_path / "out"
    (dst / "current").mkdir(parents=True)
    (dst / "current/notes.txt").write_text("mine")
    assert _convert(src, dst) == convert.EXIT_FAILED
    assert "output is not empty and is not a Mixtrain dataset (current)" in _last_error_line(capsys)
    assert (dst / "current/notes.txt").read_text() == "mine"


def test_incremental_sees_renamed_task_texts(tmp_path):
    src = tmp_path / "ds"
    write_lerobot(str(src), SyntheticLeRobot(lengths=(4, 5, 3), cameras=()))
    dst = tmp_path / "out"
    assert _convert(src, dst) == convert.EXIT_OK
    tasks = pq.read_table(src / "meta/tasks.parquet")
    texts = tasks.column("__index_level_0__").to_pylist()
    texts[0] = "Pick up the red cube."
    pq.write_table(tasks.set_column(tasks.schema.get_field_index("__index_level_0__"), "__index_level_0__", pa.array(texts)),
                   src / "meta/tasks.parquet")
    assert _convert(src, dst, "--incremental") == convert.EXIT_OK
    assert "Pick up the red cube." in pq.read_table(dst / "data").column("task").to_pylist()


def test_truncated_first_data_file_and_nan_statistics(tmp_path, capsys):
    src = tmp_path / "ds"
    write_lerobot(str(src), SyntheticLeRobot(lengths=(4, 5), cameras=()))
    data = src / "data/chunk-000/file-000.parquet"
    original = data.read_bytes()
    data.write_bytes(original[:200])
    assert _convert(src, tmp_path / "a") == convert.EXIT_FAILED
    assert f"error: {data}: cannot read data file (episode 0)" in _last_error_line(capsys)
    table = pq.read_table(pa.BufferReader(original))
    values = table.column("action").combine_chunks().flatten().to_numpy().copy()
    values[:] = np.nan  # every action value NaN: mean/std/min/max are NaN
    data.write_bytes(b"")
    pq.write_table(table.set_column(table.schema.get_field_index("action"), "action", pa.FixedSizeListArray.from_arrays(pa.array(values), 6)), data)
    assert _convert(src, tmp_path / "b") == convert.EXIT_OK
    stats = json.loads((tmp_path / "b/stats.json").read_text(), parse_constant=lambda name: pytest.fail(f"{name} in stats.json"))
    assert stats["action"]["mean"] == [None] * 6


def test_skipped_camera_leaves_no_half_written_file(tmp_path):
    src = tmp_path / "ds"
    write_lerobot(str(src), SyntheticLeRobot(lengths=(6, 5), cameras=(), image_cameras=("observation.image",)))
    data = src / "data/chunk-000/file-000.parquet"
    table = pq.read_table(data)
    images = table.column("observation.image").combine_chunks()
    blobs = images.field("bytes").to_pylist()
    blobs[9] = b"\x89PNG\r\n\x1a\n broken"  # episode 1, frame 3: after three frames were encoded
    fixed = pa.StructArray.from_arrays([pa.array(blobs, pa.binary()), images.field("path")], names=["bytes", "path"])
    pq.write_table(table.set_column(table.schema.get_field_index("observation.image"), "observation.image", fixed), data)
    dst = tmp_path / "out"
    assert _convert(src, dst, "--on_error=skip", "--max_skipped=1") == convert.EXIT_SKIPPED
    assert not (dst / "files/video_image/episode_000001.mp4").exists()
    assert (dst / "files/video_image/episode_000000.mp4").exists() and validate.validate(str(dst)) == []


def test_every_common_reader_and_copy_tool_sees_each_row_and_file_once(tmp_path):
    """The published layout: real folders, one copy, nothing a glob reader or `cp -rL` sees twice,
    after a first run, an --overwrite run and an --incremental run."""
    import subprocess

    import duckdb
    import pandas
    import polars
    import pyarrow.dataset as ds

    src = tmp_path / "ds"
    write_lerobot(str(src), SyntheticLeRobot(lengths=(5, 4, 6, 3), codec="h264", gop=None, episodes_per_video_file=2))
    dst = tmp_path / "out"
    for extra in ((), ("--overwrite", "--num_shards=2"), ("--incremental", "--num_shards=2")):
        assert _convert(src, dst, *extra) == convert.EXIT_OK
        assert polars.scan_parquet(f"{dst}/**/*.parquet").select(polars.len()).collect().item() == 4
        assert ds.dataset(str(dst), format="parquet", exclude_invalid_files=True).count_rows() == 4
        assert duckdb.sql(f"SELECT count(*) FROM read_parquet('{dst}/**/*.parquet')").fetchall() == [(4,)]
        assert len(pandas.read_parquet(dst / "data")) == 4
        copy = tmp_path / "copy"
        subprocess.run(["cp", "-rL", str(dst), str(copy)], check=True)
        files = sorted(p.relative_to(copy).as_posix() for p in copy.rglob("*") if p.is_file())
        assert sum(name.endswith(".mp4") for name in files) == 8 and sum(name.endswith(".parquet") for name in files) == (1 if not extra else 2)
        assert not any(p.is_symlink() for p in dst.rglob("*"))
        assert validate.validate(str(copy)) == []  # a copy is a complete dataset on its own
        shutil.rmtree(copy)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds", "out"]  # nothing left beside the output


def test_an_output_in_the_earlier_symlinked_layout_is_replaced_whole(tmp_path):
    """Datasets published by earlier versions (`current -> _versions/<run>`) are still taken for
    ours, read by --incremental, and replaced by one real folder."""
    src = tmp_path / "ds"
    write_lerobot(str(src), SyntheticLeRobot(lengths=(5, 4), cameras=()))
    dst = tmp_path / "out"
    assert _convert(src, dst) == convert.EXIT_OK
    version = dst / "_versions" / "20260101T000000-legacy"
    version.mkdir(parents=True)
    for name in os.listdir(dst):
        if name != "_versions":
            shutil.move(dst / name, version / name)
    os.symlink("_versions/20260101T000000-legacy", dst / "current")
    for name in os.listdir(version):
        os.symlink(f"current/{name}", dst / name)
    assert validate.validate(str(dst)) == []
    assert _convert(src, dst, "--incremental") == convert.EXIT_OK
    assert json.loads((dst / "mixtrain.json").read_text())["incremental"]["reused_sequences"] == 2
    assert not (dst / "_versions").exists() and not (dst / "current").exists() and not any(p.is_symlink() for p in dst.rglob("*"))
    assert validate.validate(str(dst)) == []


@pytest.mark.parametrize("folder", ["two::colons", "brackets[x]", "star*and?mark"])
def test_paths_with_url_and_glob_characters_are_plain_local_paths(tmp_path, folder):
    src = tmp_path / folder / "ds"
    write_lerobot(str(src), SyntheticLeRobot(lengths=(4, 3), codec="h264", gop=None, cameras=("observation.images.top",)))
    (tmp_path / "brackets" / "ds").mkdir(parents=True)  # what `brackets[x]` would match as a pattern (empty)
    dst = tmp_path / folder / "out"
    assert _convert(src, dst, "--direct_num_workers=2", "--direct_running_mode=multi_processing") == convert.EXIT_OK
    assert validate.validate(str(dst)) == [] and validate.deep_check(str(dst))[0] == []
    assert json.loads((dst / "mixtrain.json").read_text())["num_sequences"] == 2


def test_copy_mode_refuses_damaged_source_samples_instead_of_publishing_them(tmp_path, capsys):
    src = tmp_path / "ds"
    write_lerobot(str(src), SyntheticLeRobot(lengths=(12, 10), codec="av1", cameras=("observation.images.top",), episodes_per_video_file=2))
    video = src / "videos/observation.images.top/chunk-000/file-000.mp4"
    data = bytearray(video.read_bytes())
    start = data.find(b"mdat") + 600  # inside the first episode's samples; the tables are intact
    data[start:start + 400] = bytes(range(256)) + bytes(144)
    video.write_bytes(bytes(data))
    dst = tmp_path / "out"
    assert _convert(src, dst) == convert.EXIT_FAILED
    line = _last_error_line(capsys)
    assert line.startswith(f"error: {video}: episode_000000 (video_top): the copied samples do not decode (") and line.endswith(
        "the source video is damaged"), line
    assert not dst.exists()
    assert _convert(src, dst, "--verify_copies=false") == convert.EXIT_OK  # the documented trade: bytes copied unexamined


def test_replacing_a_dataset_never_deletes_what_else_is_in_the_output(tmp_path, capsys):
    src = tmp_path / "ds"
    write_lerobot(str(src), SyntheticLeRobot(lengths=(4, 3), cameras=()))
    dst = tmp_path / "out"
    assert _convert(src, dst) == convert.EXIT_OK
    (dst / "NOTES.md").write_text("ours, not the converter's")
    assert _convert(src, dst, "--overwrite") == convert.EXIT_FAILED
    assert _last_error_line(capsys).endswith("the output folder also holds NOTES.md, which replacing the dataset would delete "
                                             "(the whole folder is replaced); move them out or choose another --output")
    assert (dst / "NOTES.md").read_text() == "ours, not the converter's"
    inside = dst / "raw"
    shutil.copytree(src, inside)
    (dst / "NOTES.md").unlink()
    assert _convert(inside, dst, "--overwrite") == convert.EXIT_USAGE  # the input lives in the output
    assert "is inside --output" in capsys.readouterr().err and (inside / "meta/info.json").exists()


def test_the_output_folder_keeps_its_mode_and_a_shell_standing_in_it(tmp_path, monkeypatch):
    src = tmp_path / "ds"
    write_lerobot(str(src), SyntheticLeRobot(lengths=(4, 3), cameras=()))
    dst = tmp_path / "out"
    assert _convert(src, dst) == convert.EXIT_OK
    os.chmod(dst, 0o2770)
    assert _convert(src, dst, "--overwrite") == convert.EXIT_OK
    assert stat.S_IMODE(dst.stat().st_mode) == 0o2770
    monkeypatch.chdir(dst)  # `--output=.`: the folder the shell is in is updated in place, not swapped away
    inode = dst.stat().st_ino
    assert _convert(src, ".", "--overwrite") == convert.EXIT_OK
    assert dst.stat().st_ino == inode and validate.validate(str(dst)) == [] and not list(dst.glob("_staging"))


def test_a_mount_point_output_is_published_in_place(tmp_path):
    import subprocess

    mount = tmp_path / "mnt"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(mount)], capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        src = tmp_path / "ds"
        write_lerobot(str(src), SyntheticLeRobot(lengths=(4, 3), codec="h264", gop=None, cameras=("observation.images.top",)))
        assert _convert(src, mount) == convert.EXIT_OK
        assert _convert(src, mount, "--overwrite", "--num_shards=2") == convert.EXIT_OK
        assert validate.validate(str(mount)) == [] and json.loads((mount / "mixtrain.json").read_text())["num_shards"] == 2
        assert sorted(p.name for p in mount.iterdir()) == ["_errors.jsonl", "_fingerprints.json", "_quality.jsonl", "data", "files", "mixtrain.json",
                                                          "stats.json"]
        assert not list(tmp_path.glob(".mnt.mixtrain-*"))
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_hugging_face_cache_snapshot_whose_files_link_into_its_blobs_converts(tmp_path):
    """hub/datasets--org--name/snapshots/<rev>/... are symlinks to ../../blobs/<hash>: the same repository."""
    written = tmp_path / "written"
    write_lerobot(str(written), SyntheticLeRobot(lengths=(4, 3), codec="h264", gop=None, cameras=("observation.images.top",)))
    repo = tmp_path / "hub" / "datasets--org--name"
    blobs, snapshot = repo / "blobs", repo / "snapshots" / "abc123"
    blobs.mkdir(parents=True)
    for index, file in enumerate(sorted(p for p in written.rglob("*") if p.is_file())):
        target = snapshot / file.relative_to(written)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(file, blobs / f"blob{index}")
        os.symlink(os.path.relpath(blobs / f"blob{index}", target.parent), target)
    assert _convert(snapshot, tmp_path / "out") == convert.EXIT_OK
    assert validate.validate(str(tmp_path / "out")) == [] and validate.deep_check(str(tmp_path / "out"))[0] == []


def test_a_percentage_limit_is_exact():
    from transforms.write import _check_publishable

    records = [{"sequence_id": f"s{i}", "error": "bad"} for i in range(29)]
    _check_publishable("out", 71, records, ("fraction", 0.29))  # 29 of 100 at 29 %: allowed
    with pytest.raises(ConversionError, match="29 of 100 sequences were skipped, more than --max_skipped=28%"):
        _check_publishable("out", 71, records, ("fraction", 0.28))


@pytest.mark.parametrize("planted", [".lock", ".owner"])
def test_a_fifo_planted_in_a_staging_folder_does_not_hang_the_next_run(tmp_path, capsys, planted):
    """Anyone who may write beside the output may leave a folder named like a run's staging with a
    FIFO for its lock or owner file: opening it plainly waits for a writer for ever, in every later
    run of the output. It is not a live run's: the folder is collected, the run goes on."""
    import subprocess
    import sys

    src = tmp_path / "ds"
    write_l5kit(str(src), SyntheticL5Kit(scene_lengths=(4, 5)))
    dst = tmp_path / "out"
    assert _convert(src, dst) == convert.EXIT_OK
    staging = tmp_path / ".out.mixtrain-20261129T000000-0badc0de"
    staging.mkdir()
    (staging / ".owner").write_text(f"{os.uname().nodename} 1\n")
    (staging / planted).unlink(missing_ok=True)
    os.mkfifo(staging / planted)
    command = [sys.executable, "-m", "pipelines.convert", f"--input={src}", f"--output={dst}", "--overwrite", "--progress=off"]
    finished = subprocess.run(command, cwd=pathlib.Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=120)
    assert finished.returncode == 0, finished.stderr
    assert validate.validate(str(dst)) == []


def test_a_liveness_checks_instant_lock_does_not_fail_a_claim(tmp_path, monkeypatch):
    """Another run's liveness check takes a shared lock on a staging folder's lock file for an
    instant; a claim that meets it tries again (for 0.2 s) instead of refusing. A file system
    without locks is said as such, not as another conversion."""
    import errno
    import fcntl

    from formats import storage
    from formats.mixtrain import publish

    fs, _ = storage.open_root(str(tmp_path))
    real, busy = fcntl.flock, [3]

    def flock(descriptor, operation):
        if operation & fcntl.LOCK_EX and busy[0]:
            busy[0] -= 1
            raise BlockingIOError(errno.EWOULDBLOCK, "busy")
        return real(descriptor, operation)

    monkeypatch.setattr(fcntl, "flock", flock)
    staging = str(tmp_path / ".out.mixtrain-20261129T000000-0badc0de")
    publish.claim_staging(fs, staging)
    try:
        assert busy == [0] and (tmp_path / staging / ".owner").read_text().split()[1] == str(os.getpid())
    finally:
        publish.release_staging(staging)

    def no_locks(descriptor, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with pytest.raises(ConversionError, match=r"cannot lock the staging folder \(No locks available\)"):
        publish.claim_staging(fs, str(tmp_path / ".other.mixtrain-20261129T000000-0badc0de"))


def test_a_fifo_planted_in_a_staging_folder_a_run_resumes_is_removed_not_opened(tmp_path):
    """A run that adopts a staging folder (a resumption) claims it: a FIFO in place of its owner
    or lock file is removed, not opened (an open for writing waits for a reader for ever), and a
    claim over a planted lock is still seen as live."""
    import subprocess
    import sys

    from formats import storage
    from formats.mixtrain import publish

    fs, _ = storage.open_root(str(tmp_path))
    staging = tmp_path / ".out.mixtrain-20261129T000000-0badc0de"
    staging.mkdir()
    os.mkfifo(staging / ".owner")
    os.mkfifo(staging / ".lock")
    claimant = subprocess.Popen([sys.executable, "-c", "import sys, time; from formats import storage; from formats.mixtrain import "
                                 "publish; fs, _ = storage.open_root(sys.argv[1]); publish.claim_staging(fs, sys.argv[1]); "
                                 "print('claimed', flush=True); time.sleep(60)", str(staging)],
                                cwd=pathlib.Path(__file__).resolve().parents[2], stdout=subprocess.PIPE, text=True)
    try:
        assert claimant.stdout.readline() == "claimed\n"
        assert stat.S_ISREG(os.lstat(staging / ".owner").st_mode) and stat.S_ISREG(os.lstat(staging / ".lock").st_mode)
        assert publish.has_live_owner(fs, str(staging))
    finally:
        claimant.kill()
        claimant.wait()
    assert not publish.has_live_owner(fs, str(staging))
