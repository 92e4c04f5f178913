"""An export that stops before it publishes (SIGKILL, Ctrl-C, a kill while an object store's files
are moved) resumes when the same command runs again: the groups it wrote are taken from its
staging folder's journal, and the output is byte-identical to one uninterrupted export's. What a
resumption must not trust (an edited entry, a changed or truncated file, a path outside the
folder, another input or other options) is written again, or refused in one line."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import pytest

from formats.exports import journal
from formats.mixtrain import publish, resume
from formats.sources.lerobot_v3.sample import SyntheticLeRobot, write_dataset
from pipelines import export
from tests import s3_server
from tests.pipelines.test_export import _convert, _export

ROOT = pathlib.Path(__file__).resolve().parents[2]
SMALL_GROUPS = "--data_file_mb=0.01"  # about two episodes a group: a dozen groups


def _command(source, output, *extra: str, to: str = "lerobot_v3") -> list[str]:
    return [sys.executable, "-m", "pipelines.export", f"--input={source}", f"--output={output}", f"--to={to}", *extra]


def _files(folder: pathlib.Path) -> dict:
    return {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def _stagings(folder: pathlib.Path, name: str = "out") -> list[pathlib.Path]:
    return sorted(folder.glob(f".{name}{export.STAGING_MARK}*"))


@pytest.fixture(scope="module")
def mixtrain(tmp_path_factory) -> pathlib.Path:
    folder = tmp_path_factory.mktemp("export_resume")
    write_dataset(str(folder / "src"), SyntheticLeRobot(lengths=(40,) * 24, episodes_per_video_file=6, episodes_per_data_file=12))
    _convert(folder / "src", folder / "m")
    return folder / "m"


@pytest.fixture(scope="module")
def uninterrupted(mixtrain, tmp_path_factory) -> dict[str, dict]:
    """Each layout's export, run once without a stop: what every resumption must equal."""
    folder = tmp_path_factory.mktemp("export_whole")
    found = {}
    for to, extra in (("lerobot_v3", (SMALL_GROUPS,)), ("lerobot_v2.1", ())):
        code, _, console = _export(mixtrain, folder / to, *extra, to=to)
        assert code == 0, console
        found[to] = _files(folder / to)
    return found


def _killed(mixtrain, tmp_path, *extra: str, to: str = "lerobot_v3", step: str = "export:group-recorded") -> pathlib.Path:
    """An export SIGKILLed at `step` (the first group recorded, by default): its staging folder."""
    env = {**os.environ, publish.STOP_AT: step, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(_command(mixtrain, tmp_path / "out", *extra, to=to), cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300, start_new_session=True)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert not (tmp_path / "out").exists()
    [staging] = _stagings(tmp_path)
    assert len(list((staging / journal.GROUPS_DIR).glob("*.json"))) == 1
    return staging


@pytest.mark.parametrize("to, extra", [("lerobot_v3", (SMALL_GROUPS,)), ("lerobot_v2.1", ())])
def test_a_killed_export_resumes_to_the_bytes_of_an_uninterrupted_one(mixtrain, uninterrupted, tmp_path, to, extra):
    staging = _killed(mixtrain, tmp_path, *extra, to=to)
    header = json.loads((staging / journal.HEADER).read_text())
    code, out, console = _export(mixtrain, tmp_path / "out", *extra, to=to)
    assert (code, console) == (0, ""), console
    groups = header["groups"]
    assert groups == (12 if to == "lerobot_v3" else 1)  # v2.1 at its default sizes: one group, taken whole from the journal
    assert out.splitlines()[0] == (f"[mixtrain-export] resuming the interrupted export in {staging}: 1 of {groups} groups reused, "
                                   f"{groups - 1} left to write")
    assert out.splitlines()[1].endswith(f"-> {tmp_path / 'out'}; resumed: 1 of {groups} groups reused from the interrupted export")
    assert _files(tmp_path / "out") == uninterrupted[to]  # the journal, the lock and the owner file are not published
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # the staging folder became the output


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupted_export_ends_at_once_keeps_what_it_wrote_and_resumes(mixtrain, uninterrupted, tmp_path, signum, code):
    process = subprocess.Popen(_command(mixtrain, tmp_path / "out", SMALL_GROUPS), cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(f".out{export.STAGING_MARK}*/{journal.GROUPS_DIR}/*.json")):  # a group is written
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.01)
    process.send_signal(signum)
    sent = time.monotonic()
    out, err = process.communicate(timeout=60)
    assert time.monotonic() - sent < 5
    [staging] = _stagings(tmp_path)
    assert (process.returncode, out) == (code, "")
    assert err == (f"error: interrupted ({signal.Signals(signum).name}): the output was left as it was; the groups it wrote are kept "
                   f"in {staging}: run the same command again to resume, or add --fresh to start afresh\n")
    assert not (tmp_path / "out").exists()
    code, out, console = _export(mixtrain, tmp_path / "out", SMALL_GROUPS)
    assert code == 0 and out.startswith(f"[mixtrain-export] resuming the interrupted export in {staging}: "), console
    assert _files(tmp_path / "out") == uninterrupted["lerobot_v3"]


def test_an_export_that_fails_before_any_group_is_written_leaves_nothing(mixtrain, tmp_path):
    target = tmp_path / "m"
    shutil.copytree(mixtrain, target)
    for video in (target / "files" / "video_front").glob("*.mp4"):
        video.write_bytes(video.read_bytes()[:-200])  # every episode's last samples cut off: the first group fails
    handler = signal.getsignal(signal.SIGINT)
    code, out, console = _export(target, tmp_path / "out", SMALL_GROUPS)
    assert code == 1 and console.startswith("error: ") and console.count("\n") == 1 and "kept in" not in console, console
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]
    assert signal.getsignal(signal.SIGINT) is handler  # Ctrl-C, ignored while it cleaned up, works again for the caller


def _reseal(entry_path: pathlib.Path, change) -> None:
    """Rewrite a journal entry as a forger would: changed, then sealed again."""
    value = json.loads(entry_path.read_text())
    value.pop("sha256")
    change(value)
    value["sha256"] = hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()
    entry_path.write_text(json.dumps(value, sort_keys=True))


def test_what_a_resumption_does_not_trust_is_written_again(mixtrain, uninterrupted, tmp_path):
    staging = _killed(mixtrain, tmp_path, SMALL_GROUPS)
    kept = tmp_path / "kept"
    shutil.copytree(staging, kept)
    [entry] = (staging / journal.GROUPS_DIR).glob("*.json")
    first_file = json.loads(entry.read_text())["files"][0][0]
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"not the export's")

    def forged_path(value):
        value["files"][0] = ["../../outside.bin", outside.stat().st_size, hashlib.sha256(outside.read_bytes()).hexdigest()]

    tampered = {
        "an entry edited (its seal no longer matches)": lambda: entry.write_text(entry.read_text().replace('"group": 0', '"group": 1')),
        "a file cut short": lambda: (staging / first_file).write_bytes((staging / first_file).read_bytes()[:-1]),
        "a file removed": lambda: (staging / first_file).unlink(),
        "an entry naming a path outside the folder, sealed again": lambda: _reseal(entry, forged_path),
        "an entry of another export, sealed again": lambda: _reseal(entry, lambda value: value.update(identity="0" * 64)),
        "an entry under another group's name": lambda: entry.rename(entry.with_name("000001.json")),
    }
    for what, damage in tampered.items():
        damage()
        code, out, console = _export(mixtrain, tmp_path / "out", SMALL_GROUPS)
        assert code == 0 and " 0 of " in out.splitlines()[0], (what, out, console)
        assert _files(tmp_path / "out") == uninterrupted["lerobot_v3"], what
        assert outside.read_bytes() == b"not the export's"
        shutil.rmtree(tmp_path / "out")
        shutil.copytree(kept, staging)


def test_a_file_changed_in_place_is_one_line_and_the_next_run_writes_its_group_again(mixtrain, uninterrupted, tmp_path):
    staging = _killed(mixtrain, tmp_path, SMALL_GROUPS)
    [entry] = (staging / journal.GROUPS_DIR).glob("*.json")
    relative = json.loads(entry.read_text())["files"][-1][0]
    data = bytearray((staging / relative).read_bytes())
    data[len(data) // 2] ^= 0xFF  # the same size, another byte
    (staging / relative).write_bytes(bytes(data))
    code, out, console = _export(mixtrain, tmp_path / "out", SMALL_GROUPS)
    assert code == 1 and console == (f"error: {staging / relative}: changed since the interrupted export wrote it (its SHA-256 "
                                     "differs); run the same command again to write its group anew\n"), console
    assert not (tmp_path / "out").exists()
    code, out, console = _export(mixtrain, tmp_path / "out", SMALL_GROUPS)
    assert code == 0 and "resum" not in out, out  # the entry was removed: nothing left to resume
    assert _files(tmp_path / "out") == uninterrupted["lerobot_v3"]


@pytest.mark.parametrize("change, said", [
    ("fresh", "--fresh"),
    ("options", "it was exporting another input, or with other options"),
    ("input", "it was exporting another input, or with other options"),
])
def test_another_input_other_options_or_fresh_discard_the_folder(mixtrain, uninterrupted, tmp_path, change, said):
    source = tmp_path / "m"
    shutil.copytree(mixtrain, source)
    staging = _killed(source, tmp_path, SMALL_GROUPS)
    extra = [SMALL_GROUPS]
    if change == "fresh":
        extra.append("--fresh")
    elif change == "options":
        extra = ["--data_file_mb=0.02"]
    else:
        shard = next((source / "data").glob("*.parquet"))
        os.utime(shard, ns=(shard.stat().st_atime_ns, shard.stat().st_mtime_ns + 10**9))  # the same bytes, another signature
    code, out, console = _export(source, tmp_path / "out", *extra)
    assert code == 0, console
    assert out.splitlines()[0] == f"[mixtrain-export] discarding an interrupted export's folder {staging} ({said})"
    assert "resumed" not in out
    if change != "options":
        assert _files(tmp_path / "out") == uninterrupted["lerobot_v3"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m", "out"]


def test_a_live_export_of_the_same_output_is_refused(mixtrain, tmp_path):
    staging = tmp_path / f".out{export.STAGING_MARK}0123456789ab"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from formats.mixtrain import publish; "
                               f"publish.claim_staging(__import__('fsspec').filesystem('file'), {str(staging)!r}); print('held', "
                               "flush=True); time.sleep(120)"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        code, out, console = _export(mixtrain, tmp_path / "out")
        assert (code, out) == (1, "")
        assert console == (f"error: {tmp_path / 'out'}: another export is writing this output (its staging folder {staging}); wait "
                           "for it to finish\n")
        assert staging.is_dir() and not (tmp_path / "out").exists()
    finally:
        holder.kill()
        holder.wait()


@pytest.fixture(scope="module")
def s3():
    with s3_server.serving_this_process() as url:
        yield url


def _killed_on_s3(mixtrain, output: str, step: str):
    """An export to `output` (s3://) SIGKILLed at `step` of its publication: the store, as fsspec sees it after."""
    import fsspec

    env = {**os.environ, publish.STOP_AT: step, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(_command(mixtrain, output, SMALL_GROUPS), cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
                          start_new_session=True)
    assert done.returncode == -signal.SIGKILL, done.stderr
    s3_server.clear_clients()
    return fsspec.filesystem("s3")


def test_an_export_killed_while_its_files_move_into_an_object_store_is_finished_by_the_same_command(s3, mixtrain, uninterrupted,
                                                                                                    tmp_path):

    output = f"s3://bucket/exports/{tmp_path.name}"
    fs = _killed_on_s3(mixtrain, output, "export:file-moved")
    assert len(fs.find(output)) == 1  # one file of the export moved, then the kill
    code, out, console = _export(mixtrain, output, SMALL_GROUPS)
    [staging] = [entry for entry in fs.ls("bucket/exports", detail=False) if f".{tmp_path.name}{export.STAGING_MARK}" in entry]
    assert code == 1 and console.startswith(f"error: {output}: another export is writing this output (its staging folder s3://{staging} "
                                            "holds a lease renewed "), console  # the killed launcher's lease, not yet lapsed
    assert console.endswith(" s, when its lease has lapsed, to resume it\n") and console.count("\n") == 1
    lease = f"{staging}/{resume.LEASE}"
    fs.pipe_file(lease, json.dumps({"renewed": json.loads(fs.cat_file(lease))["renewed"] - resume.LEASE_STALE}).encode())  # time passes
    code, out, console = _export(mixtrain, output, SMALL_GROUPS)
    assert code == 0, console
    assert out.startswith("[mixtrain-export] resuming the interrupted export in "), out
    fs.invalidate_cache()
    fs.get(output, str(tmp_path / "got"), recursive=True)
    assert _files(tmp_path / "got") == uninterrupted["lerobot_v3"]
    assert [entry for entry in fs.ls("bucket/exports", detail=False) if tmp_path.name in entry] == [f"bucket/exports/{tmp_path.name}"]


def test_the_records_come_back_in_their_own_types(tmp_path):
    import fsspec
    import pyarrow as pa

    fs = fsspec.filesystem("file")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "file-000.parquet").write_bytes(b"a group's file")
    records = pa.table({"episode_index": pa.array([3, 4], pa.int64()), "tasks": pa.array([["a", "b"], []], pa.list_(pa.string())),
                        "stats/x/min": pa.array([[1.5, float("nan")], None], pa.list_(pa.float64())),
                        "stats/x/max": pa.array([[-0.0], [2.0]], pa.list_(pa.float64())),
                        "custom": pa.array([None, 2], pa.int32()), "when": pa.array([b"\x00\xff", b""], pa.binary())})
    journal.record_group(fs, str(tmp_path), "f" * 64, 0, records, ["data/file-000.parquet"])
    [(group, entry)] = journal.recorded_groups(fs, str(tmp_path), "f" * 64, 1).items()
    back = journal.records_of(entry)
    assert group == 0 and back.schema == records.schema  # int32 and bytes as they were
    assert repr(back.to_pylist()) == repr(records.to_pylist())  # NaN, -0.0 and nulls too (NaN equals nothing, its repr itself)
    assert str(back.column("stats/x/max")[0].as_py()[0]) == "-0.0"
    assert journal.recorded_groups(fs, str(tmp_path), "e" * 64, 1) == {}  # another export's identity
    (tmp_path / "data" / "file-000.parquet").write_bytes(b"a group's file, longer")
    assert journal.recorded_groups(fs, str(tmp_path), "f" * 64, 1) == {}  # a file of another size


def test_an_export_killed_after_its_last_file_moved_is_complete_and_not_done_again(s3, mixtrain, uninterrupted, tmp_path):

    output = f"s3://bucket/exports/{tmp_path.name}"
    fs = _killed_on_s3(mixtrain, output, "export:files-moved")
    [staging] = [entry for entry in fs.ls("bucket/exports", detail=False) if f".{tmp_path.name}{export.STAGING_MARK}" in entry]
    lease = f"{staging}/{resume.LEASE}"
    fs.pipe_file(lease, json.dumps({"renewed": json.loads(fs.cat_file(lease))["renewed"] - resume.LEASE_STALE}).encode())  # lapsed
    before = {path: fs.info(path)["LastModified"] for path in fs.find(output)}
    code, out, console = _export(mixtrain, output, SMALL_GROUPS)
    assert (code, console) == (0, ""), console
    assert out.splitlines()[0] == (f"[mixtrain-export] the interrupted export in s3://{staging} had published the output whole; its "
                                   "folder is removed")
    fs.invalidate_cache()
    assert {path: fs.info(path)["LastModified"] for path in fs.find(output)} == before  # nothing written again
    fs.get(output, str(tmp_path / "got"), recursive=True)
    assert _files(tmp_path / "got") == uninterrupted["lerobot_v3"]
    assert not fs.exists(staging)


def test_an_output_a_killed_publication_renamed_aside_is_put_back(mixtrain, tmp_path):
    aside = tmp_path / f".out{export.STAGING_MARK}0123456789ab.old"
    aside.mkdir()
    (aside / "keep.txt").write_text("the output before")
    code, out, console = _export(mixtrain, tmp_path / "out", SMALL_GROUPS)  # no --overwrite: the output is there again, refused
    assert (code, console) == (1, f"error: {tmp_path / 'out'}: exists and is not empty; pass --overwrite to replace it\n")
    assert (tmp_path / "out" / "keep.txt").read_text() == "the output before" and not aside.exists()


def test_a_folder_holding_a_symbolic_link_is_not_resumed(mixtrain, uninterrupted, tmp_path):
    staging = _killed(mixtrain, tmp_path, SMALL_GROUPS)
    victim = tmp_path / "victim"
    victim.mkdir()
    (staging / "meta").mkdir(exist_ok=True)
    shutil.rmtree(staging / "meta")
    (staging / "meta").symlink_to(victim)  # the resumed export would write meta/ into it
    code, out, console = _export(mixtrain, tmp_path / "out", SMALL_GROUPS)
    assert code == 0, console
    assert out.splitlines()[0] == (f"[mixtrain-export] discarding an interrupted export's folder {staging} (it holds a symbolic link, "
                                   "which an export does not write)")
    assert list(victim.iterdir()) == [] and not (tmp_path / "out" / "meta").is_symlink()
    assert _files(tmp_path / "out") == uninterrupted["lerobot_v3"]
