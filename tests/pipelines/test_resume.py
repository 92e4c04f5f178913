"""A run killed before it publishes (SIGKILL of launcher and workers, Ctrl-C, a failure) keeps what
it completed, and the same command run again resumes it: the recorded sequences are not converted
again, and what is published is byte-identical to one uninterrupted run (mixtrain.json but its
time). What is reused must be right: a changed input file, other options, a damaged, forged or
foreign staging folder are converted again or refused in one line, never published."""

from __future__ import annotations

import contextlib
import glob
import io
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow.parquet as pq
import pytest

from formats import storage
from formats.errors import ConversionError
from formats.mixtrain import publish, resume
from formats.mixtrain.fingerprint import Unit
from formats.mixtrain.stats import ColumnStats
from formats.sources.lerobot_v3.sample import SyntheticLeRobot, write_dataset
from pipelines import conversion, validate

ROOT = pathlib.Path(__file__).resolve().parents[2]
EPISODES = 120
TWO_WORKERS = ("--direct_num_workers=2", "--direct_running_mode=multi_processing")
REENCODE = ("--video=reencode",)


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> pathlib.Path:
    folder = tmp_path_factory.mktemp("resume") / "src"
    write_dataset(str(folder), SyntheticLeRobot(lengths=tuple(20 + i % 7 for i in range(EPISODES)), codec="h264", gop=None,
                                                episodes_per_video_file=30, episodes_per_data_file=30))
    return folder


@pytest.fixture(scope="module")
def reference(source, tmp_path_factory) -> pathlib.Path:
    """One uninterrupted run of the command the tests interrupt."""
    dst = tmp_path_factory.mktemp("reference") / "out"
    code, out, err = _run(source, dst, *REENCODE, "--num_shards=2")
    assert code == 0, err
    return dst


def _run(src, dst, *extra: str) -> tuple[int, str, str]:
    out, console = io.StringIO(), io.StringIO()
    code = conversion.run([f"--input={src}", f"--output={dst}", "--progress=off", *extra], out=out, console=console)
    return code, out.getvalue(), console.getvalue()


def _start(src, dst, *extra: str, env: dict | None = None) -> subprocess.Popen:
    """The command line in a process group of its own (launcher and workers), as a user runs it."""
    return subprocess.Popen([sys.executable, "-m", "pipelines.convert", f"--input={src}", f"--output={dst}", "--progress=off",
                             *TWO_WORKERS, *extra], cwd=ROOT, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})


def _staging(dst: pathlib.Path) -> list[str]:
    return sorted(glob.glob(f"{dst.parent}/.{dst.name}{publish.SIBLING_MARK}*"))


def _recorded(dst: pathlib.Path) -> set[str]:
    ids = set()
    for path in glob.glob(f"{dst.parent}/.{dst.name}{publish.SIBLING_MARK}*/{resume.DONE_DIR}/*.json"):
        try:
            ids.update(row["id"] for row in json.loads(pathlib.Path(path).read_text())["rows"])
        except (OSError, ValueError):  # being written
            pass
    return ids


def _kill_at(src, dst, fraction: float, *extra: str, sig: int = signal.SIGKILL) -> set[str]:
    """Start the conversion and signal its whole process group once `fraction` of the sequences
    are recorded; returns the ids recorded then."""
    process = _start(src, dst, *extra)
    deadline = time.monotonic() + 300
    while process.poll() is None and time.monotonic() < deadline:
        if len(_recorded(dst)) >= fraction * EPISODES:
            os.killpg(process.pid, sig)
            break
        time.sleep(0.02)
    out, err = process.communicate(timeout=120)
    assert process.returncode in (-signal.SIGKILL, 130), (process.returncode, out, err)
    return _recorded(dst) if sig == signal.SIGKILL else set()


def _files(root: pathlib.Path) -> dict[str, bytes]:
    files = {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
    sidecar = json.loads(files.pop("mixtrain.json"))
    sidecar.pop("created_at")
    sidecar["source"].pop("uri", None)
    files["mixtrain.json"] = json.dumps(sidecar, sort_keys=True).encode()
    return files


def _reused(out: str) -> int:
    found = re.search(r"resumed: (\d+) of them reused from the interrupted run", out)
    return int(found.group(1)) if found else 0


@pytest.mark.parametrize("fraction", [0.3, 0.8])
def test_a_run_killed_midway_resumes_and_publishes_the_same_bytes(tmp_path, source, reference, fraction):
    dst = tmp_path / "out"
    recorded = _kill_at(source, dst, fraction, *REENCODE, "--num_shards=2")
    assert len(recorded) >= fraction * EPISODES and not dst.exists() and len(_staging(dst)) == 1
    code, out, err = _run(source, dst, *REENCODE, "--num_shards=2", *TWO_WORKERS)
    assert code == 0, err
    assert re.search(rf"^\[mixtrain-convert\] resuming run \S+ \(started [0-9T:Z-]+\): \d+ sequences recorded, [0-9.]+ MB staged "
                     rf"in .+: {len(recorded)} sequences reused, {EPISODES - len(recorded)} of {EPISODES} units left to convert$",
                     out, re.M), out
    assert f"lerobot_v3: {EPISODES - len(recorded)} sequences -> {dst}" in out
    assert _reused(out) == len(recorded)
    assert _files(dst) == _files(reference)
    assert _staging(dst) == []  # the completed run removed it


def test_a_run_killed_while_shards_are_written_converts_nothing_again(tmp_path, source, reference):
    dst = tmp_path / "out"
    process = _start(source, dst, *REENCODE, "--num_shards=2", env={publish.STOP_AT: "conversion:shard-written"})
    process.communicate(timeout=300)
    assert process.returncode == -signal.SIGKILL and len(_recorded(dst)) == EPISODES
    code, out, err = _run(source, dst, *REENCODE, "--num_shards=2")
    assert code == 0, err
    assert f"lerobot_v3: 0 sequences -> {dst}" in out and _reused(out) == EPISODES
    assert _files(dst) == _files(reference)


def test_a_resumption_with_another_shard_count_puts_each_row_in_its_shard(tmp_path, source):
    dst, whole = tmp_path / "out", tmp_path / "whole"
    _kill_at(source, dst, 0.5, *REENCODE, "--num_shards=2")
    assert _run(source, dst, *REENCODE, "--num_shards=3")[0] == 0
    assert _run(source, whole, *REENCODE, "--num_shards=3")[0] == 0
    assert _files(dst) == _files(whole)


def _episodes_of_data_file(source: pathlib.Path, file_index: int) -> set[str]:
    table = pq.read_table(sorted(source.glob("meta/episodes/*/*.parquet")), columns=["episode_index", "data/file_index"])
    return {f"episode_{e:06d}" for e, f in zip(table["episode_index"].to_pylist(), table["data/file_index"].to_pylist(), strict=True)
            if f == file_index}


def test_an_input_file_changed_between_the_runs_redoes_exactly_its_units(tmp_path, source, reference):
    work = tmp_path / "src"
    subprocess.run(["cp", "-a", str(source), str(work)], check=True)
    dst = tmp_path / "out"
    recorded = _kill_at(work, dst, 0.6, *REENCODE, "--num_shards=2")
    changed = next(iter(sorted(work.glob("data/*/*.parquet"))))
    os.utime(changed, (time.time() + 5, time.time() + 5))  # same bytes, another signature: its episodes' units changed
    touched = _episodes_of_data_file(work, int(changed.stem.split("-")[1]))
    assert touched & recorded
    code, out, err = _run(work, dst, *REENCODE, "--num_shards=2")
    assert code == 0, err
    assert _reused(out) == len(recorded - touched)
    assert _files(dst).keys() == _files(reference).keys()
    assert {k: v for k, v in _files(dst).items() if k != "_fingerprints.json"} == \
        {k: v for k, v in _files(reference).items() if k != "_fingerprints.json"}


def test_other_options_convert_everything_again_and_say_which(tmp_path, source):
    dst = tmp_path / "out"
    _kill_at(source, dst, 0.3, *REENCODE, "--num_shards=2")
    code, out, err = _run(source, dst, *REENCODE, "--video_crf=30", "--num_shards=2")
    assert code == 0, err
    assert re.search(r"^\[mixtrain-convert\] the interrupted run \S+ for this output was converting with other options "
                     r"\(--video_crf\); its \d+ recorded sequences are discarded and every sequence is converted$", out, re.M), out
    assert f"lerobot_v3: {EPISODES} sequences" in out and "resumed:" not in out


def _recorded_video(dst: pathlib.Path) -> pathlib.Path:
    staging = pathlib.Path(_staging(dst)[0])
    entry = json.loads(next(iter(sorted((staging / resume.DONE_DIR).glob("*.json")))).read_text())
    return staging / entry["rows"][0]["files"][0][0]


def test_a_truncated_video_in_the_staging_is_converted_again(tmp_path, source, reference):
    dst = tmp_path / "out"
    recorded = _kill_at(source, dst, 0.5, *REENCODE, "--num_shards=2")
    video = _recorded_video(dst)
    video.write_bytes(video.read_bytes()[:100])
    code, out, err = _run(source, dst, *REENCODE, "--num_shards=2")
    assert code == 0, err
    assert _reused(out) == len(recorded) - 1
    assert _files(dst) == _files(reference)


def test_a_video_changed_in_place_is_refused_in_one_line_then_converted_again(tmp_path, source, reference):
    dst = tmp_path / "out"
    _kill_at(source, dst, 0.5, *REENCODE, "--num_shards=2")
    video = _recorded_video(dst)
    data = bytearray(video.read_bytes())
    data[-10] ^= 0xFF  # the same size: only the digest tells
    video.write_bytes(bytes(data))
    code, out, err = _run(source, dst, *REENCODE, "--num_shards=2")
    assert code == 1
    lines = err.strip().splitlines()
    assert lines[0] == (f"error: {video}: changed since the interrupted run recorded it (its SHA-256 differs); its sequences "
                        f"({video.stem} and others) will be converted again: rerun the same command"), err
    assert len(lines) == 2 and "run the same command again to resume" in lines[1]
    assert not dst.exists()
    code, out, err = _run(source, dst, *REENCODE, "--num_shards=2")
    assert code == 0, err
    assert _files(dst) == _files(reference)


def test_forged_entries_and_a_foreign_staging_are_never_used(tmp_path, source, reference):
    dst = tmp_path / "out"
    recorded = _kill_at(source, dst, 0.5, *REENCODE, "--num_shards=2")
    staging = pathlib.Path(_staging(dst)[0])
    done = staging / resume.DONE_DIR
    (done / "garbage.json").write_bytes(b"{not json")
    entry = json.loads(next(iter(sorted(done.glob("*.json")))).read_text())
    forged = {**entry, "rows": [{**row, "files": [["../../../etc/passwd", 1, "0" * 64]]} for row in entry["rows"]]}
    (done / "forged.json").write_text(json.dumps(forged))
    (done / "bad-types.json").write_text(json.dumps({**entry, "rows": [{"id": 5}], "batch_ends": [1]}))
    # A genuine entry edited where no file digest looks (a row's size, its notes): its seal breaks, its units are converted again.
    edited = sorted(path for path in done.glob("*.json") if path.name not in ("garbage.json", "forged.json", "bad-types.json"))[-1]
    value = json.loads(edited.read_text())
    value["rows"][0]["nbytes"] += 1
    value["rows"][0]["notes"] = {"video_front": {"forged": True}}
    edited.write_text(json.dumps(value))
    recorded -= {row["id"] for row in value["rows"]}
    code, out, err = _run(source, dst, *REENCODE, "--num_shards=2")
    assert code == 0, err
    assert _reused(out) == len(recorded)  # the genuine, unedited entries only
    assert _files(dst) == _files(reference)
    # A staging folder whose journal names another output (copied from elsewhere) is not resumed, and is collected.
    other = tmp_path / "other"
    _kill_at(source, other, 0.5, *REENCODE, "--num_shards=2")
    copied = tmp_path / f".fresh{publish.SIBLING_MARK}{pathlib.Path(_staging(other)[0]).name.rsplit(publish.SIBLING_MARK, 1)[1]}"
    subprocess.run(["cp", "-a", _staging(other)[0], str(copied)], check=True)
    code, out, err = _run(source, tmp_path / "fresh", *REENCODE, "--num_shards=2")
    assert code == 0, err
    assert "resuming" not in out and _reused(out) == 0 and not copied.exists()
    assert _files(tmp_path / "fresh") == _files(reference)


def test_fresh_discards_the_interrupted_run(tmp_path, source):
    dst = tmp_path / "out"
    _kill_at(source, dst, 0.3, *REENCODE, "--num_shards=2")
    code, out, err = _run(source, dst, *REENCODE, "--num_shards=2", "--fresh")
    assert code == 0, err
    assert re.search(r"^\[mixtrain-convert\] --fresh: discarding the interrupted run \S+ \(started .+\): \d+ sequences recorded", out,
                     re.M), out
    assert "resuming" not in out and f"lerobot_v3: {EPISODES} sequences" in out and _staging(dst) == []


def test_ctrl_c_keeps_the_work_and_the_same_command_resumes(tmp_path, source, reference):
    dst = tmp_path / "out"
    process = _start(source, dst, *REENCODE, "--num_shards=2")
    deadline = time.monotonic() + 300
    while len(_recorded(dst)) < 0.4 * EPISODES and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.02)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    (line,) = err.strip().splitlines()  # one line, as every interrupted run's
    assert line.startswith("error: interrupted (SIGINT): the output was left as it was; the sequences it completed are kept in "
                           f"{_staging(dst)[0]}: run the same command again to resume, or add --fresh to start afresh"), err
    code, out, err = _run(source, dst, *REENCODE, "--num_shards=2")
    assert code == 0, err
    assert _reused(out) >= 0.4 * EPISODES
    assert _files(dst) == _files(reference)


def test_two_resumptions_at_once_one_is_refused(tmp_path):
    staging = tmp_path / ".out.mixtrain-x"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time, fsspec; from formats.mixtrain import publish; "
                               f"publish.claim_staging(fsspec.filesystem('file'), {str(staging)!r}); print('held', flush=True); "
                               "time.sleep(60)"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        import fsspec

        with pytest.raises(ConversionError, match="another conversion is working in this staging folder"):
            publish.claim_staging(fsspec.filesystem("file"), str(staging))
    finally:
        holder.kill()
        holder.wait()
    import fsspec  # the holder is gone: the kernel dropped its lock

    publish.claim_staging(fsspec.filesystem("file"), str(staging))


def test_a_failure_keeps_the_work_and_a_fixed_input_resumes(tmp_path, source, reference):
    """A bad input file stops the run (--on_error=fail): the sequences done are kept; once the file
    is fixed, the same command converts only what is left."""
    work = tmp_path / "src"
    subprocess.run(["cp", "-a", str(source), str(work)], check=True)
    last = sorted(work.glob("videos/*/*/*.mp4"))[-1]
    saved = last.read_bytes()
    last.write_bytes(saved[: len(saved) // 3])
    dst = tmp_path / "out"
    code, out, err = _run(work, dst, *REENCODE, "--num_shards=2", "--direct_num_workers=1")
    assert code == 1 and "the sequences it completed are kept in" in err, err
    recorded = _recorded(dst)
    last.write_bytes(saved)
    os.utime(last, (last.stat().st_mtime + 5,) * 2)
    code, out, err = _run(work, dst, *REENCODE, "--num_shards=2")
    assert code == 0, err
    assert 0 < _reused(out) <= len(recorded)
    assert {k: v for k, v in _files(dst).items() if k != "_fingerprints.json"} == \
        {k: v for k, v in _files(reference).items() if k != "_fingerprints.json"}


# --- the journal on its own --------------------------------------------------------------------

class _Ref:
    def __init__(self, sequence_id, count=1):
        self.sequence_id, self.sequence_count = sequence_id, count


def _journal(entries, headers, tallies=(), sizes=None) -> resume.Journal:
    listed = {"_rows/00000/a.arrow": 10, "files/v/episode_000001.mp4": 5, "files/v/episode_000002.mp4": 5}
    named = [{**entry, "name": f"_resume/done/{n}.json"} for n, entry in enumerate(entries)]
    return resume.Journal("/s", "run", headers, named, list(tallies), sizes or listed)


def _entry(generation, ids, files=None):
    return {"journal": 1, "generation": generation, "spill": ["_rows/00000/a.arrow", 10, "x"], "batch_ends": [len(ids)],
            "rows": [{"id": i, "nbytes": 1, "stats": {}, "notes": {}, "files": (files or {}).get(i, [])} for i in ids]}


def test_plan_takes_only_whole_units_with_their_fingerprint_and_files():
    units = [(Unit("episode_000001", ()), _Ref("episode_000001")), (Unit("episode_000002", ()), _Ref("episode_000002")),
             (Unit("episode_000003", ()), _Ref("episode_000003")), (Unit("train_00001", (), prefix="train_00001_"), _Ref(None, None))]
    current = {"episode_000001": {"fingerprint": "a"}, "episode_000002": {"fingerprint": "b"}, "episode_000003": {"fingerprint": "c"},
               "train_00001": {"fingerprint": "d"}}
    header = {"units": {"episode_000001": "a", "episode_000002": "OLD", "episode_000003": "c", "train_00001": "d"}}
    files = {"episode_000001": [["files/v/episode_000001.mp4", 5, "h"]], "episode_000003": [["files/v/episode_000003.mp4", 5, "h"]]}
    journal = _journal([_entry(1, ["episode_000001", "episode_000002", "episode_000003", "train_00001_000000", "train_00001_000001"],
                               files)], {1: header}, tallies=[{"unit": "train_00001", "count": 2, "generation": 1}])
    taken = resume.plan(journal, units, current)
    # 1: whole and valid; 2: its fingerprint changed; 3: its video is not in the folder; train_00001: both of its 2 sequences.
    assert [ref.sequence_id for ref in taken.pending] == ["episode_000002", "episode_000003"]
    assert taken.spilled[0][1] == (0, 3, 4) and taken.sequences == 3 and taken.tallies == [("train_00001", 2)]
    assert taken.generation == 2
    # A unit the plan could not count is taken only with its tally, and only whole.
    short = _journal([_entry(1, ["train_00001_000000"])], {1: header}, tallies=[{"unit": "train_00001", "count": 2, "generation": 1}])
    assert resume.plan(short, units[3:], current).sequences == 0
    assert resume.plan(_journal([_entry(1, ["train_00001_000000", "train_00001_000001"])], {1: header}), units[3:], current).sequences == 0
    # An entry of a generation without its run record, or whose spill file is not listed at its size, is not used.
    assert resume.plan(_journal([_entry(2, ["episode_000001"], files)], {1: header}), units[:1], current).sequences == 0
    assert resume.plan(_journal([_entry(1, ["episode_000001"], files)], {1: header}, sizes={"_rows/00000/a.arrow": 9}),
                       units[:1], current).sequences == 0
    # The newest complete record of a unit wins.
    both = _journal([_entry(1, ["episode_000001"], files), _entry(2, ["episode_000001"], files)], {1: header, 2: header})
    assert [entry["generation"] for entry, _ in resume.plan(both, units[:1], current).spilled] == [2]


def test_statistics_survive_the_journal_exactly():
    stats = {"observation.images.front": ColumnStats.of(np.random.default_rng(0).random((5000, 3)), image=True),
             "ints": ColumnStats.of(np.array([[2**62, -3], [2**62 + 1, 7]], dtype=np.int64))}
    back = resume.decode_stats(json.loads(json.dumps(resume.encode_stats(stats))))
    for key, value in stats.items():
        for field in ("mean", "m2", "min", "max"):
            assert getattr(back[key], field).tobytes() == getattr(value, field).tobytes()
            assert getattr(back[key], field).dtype == getattr(value, field).dtype
        assert [level.tobytes() for level in back[key].levels] == [level.tobytes() for level in value.levels]
        assert (back[key].count, back[key].image, back[key].capacity) == (value.count, value.image, value.capacity)
    with pytest.raises(ValueError, match="not a numeric dtype"):
        resume.decode_stats({"x": {**resume.encode_stats(stats)["ints"], "mean": {"dtype": "|O", "shape": [1], "data": ""}}})


def test_inspect_names_an_interrupted_run_and_its_size(tmp_path, source, reference, capsys):
    from pipelines import inspect

    dst = tmp_path / "out"
    recorded = _kill_at(source, dst, 0.3, *REENCODE, "--num_shards=2")
    capsys.readouterr()
    assert inspect.main([str(dst)]) == 1  # nothing published yet: the staging is all there is
    out = capsys.readouterr().out
    assert re.fullmatch(rf"interrupted: run \S+ \(started \S+\): {len(recorded)} sequences recorded, [0-9.]+ MB staged in "
                        rf"{re.escape(_staging(dst)[0])} \(not published; the same conversion command resumes it, --fresh "
                        r"discards it\)\n", out), out
    subprocess.run(["cp", "-a", str(reference), str(dst)], check=True)  # a published dataset, and a run replacing it stopped
    assert inspect.main([str(dst)]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("interrupted: run ")


def _killed_at_shards(src: str, dst: str, *extra: str) -> None:
    process = _start(src, dst, *extra, env={publish.STOP_AT: "conversion:shard-written"})
    out, err = process.communicate(timeout=300)
    assert process.returncode == -signal.SIGKILL, err


def test_a_lake_run_killed_before_its_commit_resumes_in_its_run_folder(tmp_path, source):
    from tests.pipelines.test_lake import _assert_same_dataset, _lake_rows

    standalone, dst = tmp_path / "standalone", tmp_path / "lake"
    assert _run(source, standalone, "--num_shards=2")[0] == 0
    _killed_at_shards(source, dst, "--num_shards=2", "--table_format=delta")
    (folder,) = (dst / "runs").iterdir()
    code, out, err = _run(source, dst, "--num_shards=2", "--table_format=delta")
    assert code == 0, err
    assert _reused(out) == EPISODES and f"resuming run {folder.name} " in out
    assert [p.name for p in (dst / "runs").iterdir()] == [folder.name]  # the same run, committed
    _assert_same_dataset(standalone, dst, "delta", _lake_rows(dst, "delta"))


@contextlib.contextmanager
def _store(scheme: str):
    """An object store on loopback (moto's S3, the GCS emulator), reached the way users reach theirs:
    environment variables, inherited by the killed subprocess too."""
    saved = dict(os.environ)
    try:
        if scheme == "s3":
            from tests import s3_server

            with s3_server.running() as url:
                os.environ.update(s3_server.environment(url))
                for key in ("AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
                    os.environ.pop(key, None)
                s3_server.clear_clients()
                yield "s3://resume"
        else:
            import fsspec

            from tests import gcs_emulator

            with gcs_emulator.running() as url:
                os.environ.update({"STORAGE_EMULATOR_HOST": url, "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"})
                fsspec.filesystem("gs").clear_instance_cache()
                yield "gs://bucket"
    finally:
        os.environ.clear()
        os.environ.update(saved)
        if scheme == "s3":
            from tests import s3_server

            s3_server.clear_clients()


@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_an_object_store_run_killed_while_shards_are_written_resumes_to_the_same_objects(tmp_path, scheme):
    """The staging on the store (the output's sibling `.out.mixtrain-<run>/`): a new run, on any
    machine, resumes it."""
    from tests.pipelines.test_s3 import _comparable, _upload
    from tests.pipelines.test_s3 import _files as _objects

    write_dataset(str(tmp_path / "src"), SyntheticLeRobot(lengths=(10,) * 16, codec="h264", gop=None, episodes_per_video_file=8,
                                                          episodes_per_data_file=8))
    with _store(scheme) as bucket:
        src = _upload(tmp_path / "src", f"{bucket}/src")
        assert _run(src, f"{bucket}/whole", "--num_shards=2")[0] == 0
        _killed_at_shards(src, f"{bucket}/out", "--num_shards=2")
        assert not [key for key in _objects(bucket) if key.startswith("out/")]  # nothing inside the output yet
        staged = [key for key in _objects(bucket) if key.startswith(f".out{publish.SIBLING_MARK}")]
        assert any(f"/{resume.DONE_DIR}/" in key for key in staged)
        # The killed launcher's lease is fresh: nothing takes its folder over until it is stale.
        (lease,) = [key for key in staged if key.endswith(f"/{resume.LEASE}")]
        fs, root = storage.open_root(f"{bucket}/out")
        assert resume.interrupted(fs, root) == []
        code, out, err = _run(src, f"{bucket}/out", "--num_shards=2")  # one writer per output: refused while the lease is live
        bucket_root = root.rsplit("/", 1)[0]
        shown = re.escape(bucket)  # the store's URL, as the user typed it
        assert code == 1 and re.fullmatch(rf"error: {shown}/out: another conversion is writing this output \(its staging {shown}/"
                                          rf"\.out{re.escape(publish.SIBLING_MARK)}\S+ holds a lease renewed \d+ s ago\); wait for it "
                                          r"to finish, or, if it was stopped, run again in \d+ s, when its lease has lapsed, to resume "
                                          r"it\n", err), err
        fs.pipe_file(storage.join(bucket_root, lease), json.dumps({"renewed": time.time() - resume.LEASE_STALE - 1}).encode())
        code, out, err = _run(src, f"{bucket}/out", "--num_shards=2")
        assert code == 0, err
        assert _reused(out) == 16
        got, whole = _objects(f"{bucket}/out"), _objects(f"{bucket}/whole")
        assert _comparable(got.pop("mixtrain.json")) == _comparable(whole.pop("mixtrain.json"))
        assert got == whole  # every object the same bytes
        assert not [key for key in _objects(bucket) if key.startswith(".")]  # and no staging left beside them


@pytest.mark.parametrize("step", ["moved-data", "sidecar-written", "marker-written"])
def test_an_s3_publication_killed_leaves_nothing_a_glob_of_the_output_matches_and_the_next_run_collects_it(tmp_path, step):
    """A publication killed between its steps leaves its staging beside the output, never inside:
    `DST/**/*.parquet` matches the published shards only; the next run publishes and removes it."""
    from tests.pipelines.test_s3 import _files as _objects
    from tests.pipelines.test_s3 import _upload

    write_dataset(str(tmp_path / "src"), SyntheticLeRobot(lengths=(10,) * 6, codec="h264", gop=None))
    with _store("s3") as bucket:
        src = _upload(tmp_path / "src", f"{bucket}/src")
        assert _run(src, f"{bucket}/out", "--num_shards=2")[0] == 0
        fs, root = storage.open_root(f"{bucket}/out")
        process = _start(src, f"{bucket}/out", "--num_shards=3", "--overwrite", env={publish.STOP_AT: f"parquet-in-place:{step}"})
        process.communicate(timeout=300)
        assert process.returncode == -signal.SIGKILL
        fs.invalidate_cache()
        assert sorted(fs.glob(f"{root}/**/*.parquet")) == [f"{root}/data/part-{index:05d}.parquet" for index in range(3)]
        left = [key for key in _objects(bucket) if key.startswith(f".out{publish.SIBLING_MARK}")]  # beside it
        (heartbeat,) = [key for key in left if key.endswith(f"/{publish.PUBLISHING}")]
        # Its heartbeat is fresh: as far as anyone can tell it is still publishing. Refused, kept.
        code, out, err = _run(src, f"{bucket}/out", "--num_shards=3", "--overwrite")
        assert code == 1 and re.fullmatch(rf"error: {re.escape(bucket)}/out: another conversion is publishing this output \(its staging "
                                          rf"{re.escape(bucket)}/\S+ renewed "
                                          r"its publication's heartbeat \d+ s ago\); wait for it to finish, or, if it was stopped, "
                                          r"run again in \d+ s, when it has lapsed\n", err), err
        assert sorted(key for key in _objects(bucket) if key.startswith(".")) == sorted(left)
        fs.pipe_file(f"{root.rsplit('/', 1)[0]}/{heartbeat}",  # as if minutes had passed
                     json.dumps({"renewed": time.time() - publish.HEARTBEAT_STALE - 1}).encode())
        code, out, err = _run(src, f"{bucket}/out", "--num_shards=3", "--overwrite")
        assert code == 0, err
        assert not [key for key in _objects(bucket) if key.startswith(".")], sorted(_objects(bucket))
        assert validate.validate(f"{bucket}/out") == []


@pytest.mark.parametrize("format_", ["rlds", "ortf", "l5kit", "lerobot_v2"])
def test_every_source_resumes_to_the_same_bytes(tmp_path, format_):
    """Units the plan cannot count (RLDS TFRecord shards) are taken only with the count a worker
    recorded for them; ORTF, L5Kit and LeRobot v2 units by their ids."""
    from formats import samples

    sample = samples.get(format_)
    src = tmp_path / "src"
    sample.bundled(str(src), 24)
    args = (*sample.convert_args, "--num_shards=2", *(() if format_ == "l5kit" else REENCODE))  # L5Kit has no camera
    assert _run(src, tmp_path / "whole", *args)[0] == 0
    _killed_at_shards(src, tmp_path / "out", *args)
    code, out, err = _run(src, tmp_path / "out", *args)
    assert code == 0, err
    assert _reused(out) == json.loads((tmp_path / "whole" / "mixtrain.json").read_text())["num_sequences"]
    assert _files(tmp_path / "out") == _files(tmp_path / "whole")


def test_the_same_output_named_another_way_is_resumed(tmp_path, source, reference):
    """Through a symlinked folder, then by its real path: one output, one resumption."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    process = _start(source, tmp_path / "link" / "out", *REENCODE, "--num_shards=2", env={publish.STOP_AT: "conversion:shard-written"})
    process.communicate(timeout=300)
    assert process.returncode == -signal.SIGKILL
    code, out, err = _run(source, tmp_path / "real" / "out", *REENCODE, "--num_shards=2")
    assert code == 0, err
    assert _reused(out) == EPISODES
    assert _files(tmp_path / "real" / "out") == _files(reference)


def test_symlinks_planted_in_or_as_a_staging_folder_are_never_followed(tmp_path, source, reference):
    dst = tmp_path / "out"
    _kill_at(source, dst, 0.5, *REENCODE, "--num_shards=2")
    staging = pathlib.Path(_staging(dst)[0])
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    for name in (publish.OWNER_FILE, publish.LOCK_FILE):
        (staging / name).unlink(missing_ok=True)
        (staging / name).symlink_to(victim)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / f".out{publish.SIBLING_MARK}29991231T235959-abcdef01").symlink_to(elsewhere)  # newest by name: not adopted
    code, out, err = _run(source, dst, *REENCODE, "--num_shards=2")
    assert code == 0, err
    assert f"resuming run {staging.name.rsplit(publish.SIBLING_MARK, 1)[1]} " in out
    assert victim.read_text() == "keep me" and list(elsewhere.iterdir()) == []
    assert _files(dst) == _files(reference)


def test_a_run_killed_as_it_spills_rows_and_a_truncated_spill_file_are_converted_again(tmp_path, source, reference):
    dst = tmp_path / "out"
    process = _start(source, dst, *REENCODE, "--num_shards=2", env={publish.STOP_AT: "conversion:rows-spilled"})
    process.communicate(timeout=300)
    assert process.returncode == -signal.SIGKILL
    recorded = _recorded(dst)
    staging = pathlib.Path(_staging(dst)[0])
    entry = json.loads(next(iter(sorted((staging / resume.DONE_DIR).glob("*.json")))).read_text())
    spill = staging / entry["spill"][0]
    spill.write_bytes(spill.read_bytes()[: spill.stat().st_size // 2])  # its rows' units are converted again
    code, out, err = _run(source, dst, *REENCODE, "--num_shards=2")
    assert code == 0, err
    assert _reused(out) == len(recorded - {row["id"] for row in entry["rows"]})
    assert _files(dst) == _files(reference)


@pytest.fixture
def small_disk(tmp_path):
    """A 20 MB tmpfs."""
    from tests.conftest import small_tmpfs

    with small_tmpfs(tmp_path / "disk", "20m") as mount:
        yield mount


def test_a_full_or_read_only_disk_during_the_resumption_keeps_the_work_for_the_next(tmp_path, source, reference, small_disk):
    dst = small_disk / "out"
    recorded = _kill_at(source, dst, 0.5, *REENCODE, "--num_shards=2")
    staging = _staging(dst)
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    code, out, err = _run(source, dst, *REENCODE, "--num_shards=2")
    assert code == 1 and err.splitlines()[0].startswith(f"error: {dst}: cannot write the output: Read-only file system"), err
    subprocess.run(["mount", "-o", "remount,rw", str(small_disk)], check=True)
    assert _staging(dst) == staging and _recorded(dst) == recorded
    filler = small_disk / "filler"
    free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
    filler.write_bytes(bytes(max(0, free - 64 * 1024)))  # 64 kB left: the rerun fills the disk
    code, out, err = _run(source, dst, *REENCODE, "--num_shards=2")
    assert code == 1 and "No space left on device" in err.splitlines()[0], err
    assert _staging(dst) == staging and recorded <= _recorded(dst)  # the work kept, more of it perhaps
    filler.unlink()
    code, out, err = _run(source, dst, *REENCODE, "--num_shards=2")
    assert code == 0, err
    assert _reused(out) >= len(recorded)
    assert _files(dst) == _files(reference)


def test_collect_leftovers_takes_only_a_dead_publications_folder():
    """On an object store another run removes a staging folder only when nothing can still be
    using it: no live lease (converting), no fresh heartbeat (publishing: the lease went with the
    journal), no journal (an interrupted conversion is resumed or --fresh'ed, never collected)."""
    import fsspec

    fs = fsspec.filesystem("memory")
    output = "/collect/out"
    fs.pipe_file(f"{output}/mixtrain.json", b"{}")
    folders = {name: publish.staging_root(fs, output, f"20261128T17000{i}-0123abcd") for i, name in
               enumerate(("converting", "publishing", "interrupted", "dead"))}
    for folder in folders.values():
        fs.pipe_file(f"{folder}/data/part-00000.parquet", b"rows")
    lease = resume.Lease(fs, folders["converting"]).__enter__()
    try:
        fs.pipe_file(f"{folders['interrupted']}/{resume.RESUME_DIR}/run-0001.json", b"{}")
        publish.beat(fs, folders["publishing"])
        publish.beat(fs, folders["dead"])
        fs.pipe_file(f"{folders['dead']}/{publish.PUBLISHING}", json.dumps({"renewed": time.time() - 1000}).encode())
        fs.pipe_file(f"{folders['dead']}.published", b"")
        assert resume.collect_leftovers(fs, output, keep=None) == [folders["dead"], f"{folders['dead']}.published"]
        assert all(fs.exists(folders[name]) for name in ("converting", "publishing", "interrupted"))
        assert not fs.exists(folders["dead"]) and fs.exists(f"{output}/mixtrain.json")
    finally:
        lease._stop.set()


def test_a_heartbeat_renewal_racing_the_discard_leaves_no_staging(monkeypatch):
    """A renewal that found the heartbeat just before the publication discarded the staging writes it
    back after: a folder holding only the heartbeat, which a retried publish step would take for a
    staging to publish again (an empty dataset). The heartbeat removes it once its thread is done."""
    import threading

    import fsspec

    fs = fsspec.filesystem("memory")
    output = "/heartbeat/out"
    staging = publish.staging_root(fs, output, "20261128T170000-0123abcd")
    fs.pipe_file(f"{staging}/data/part-00000.parquet", b"rows")
    monkeypatch.setattr(publish, "HEARTBEAT_SECONDS", 0.05)
    gate, real_beat = threading.Event(), publish.beat

    def late_beat(fs_, folder):
        gate.wait(5)  # found the heartbeat; the publisher discards meanwhile
        real_beat(fs_, folder)

    real_beat(fs, staging)
    with publish.heartbeat(fs, staging):
        monkeypatch.setattr(publish, "beat", late_beat)
        time.sleep(0.2)
        monkeypatch.setattr(publish, "beat", real_beat)
        publish.publish(fs, staging, output, {"num_sequences": 1, "created_at": "x"})
        gate.set()
    assert not fs.exists(staging) and fs.find(staging) == []
    assert publish.published_earlier(fs, staging, output, {"created_at": "x"}) is not None
