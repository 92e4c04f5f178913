"""Local multi-process workers are forked from the warm zygote (itself forked from the launcher:
their command lines are the launcher's), and nothing outlives the launcher."""

import contextlib
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from formats.sources.lerobot_v3.sample import SyntheticLeRobot, write_dataset
from pipelines import local_workers, validate

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process."""
    table = {}
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            table[int(entry.name)] = (int(stat.rsplit(")", 1)[1].split()[1]), command)
    return table


def _descendants(root: int, table: dict[int, tuple[int, str]]) -> dict[int, str]:
    """Descendants with a command line (a process that is exiting shows none)."""
    found, frontier = {}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, command) in table.items():
            if ppid == parent and pid not in found:
                found[pid] = command
                frontier.append(pid)
    return {pid: command for pid, command in found.items() if command}


def _alive(pids) -> list[int]:
    return [pid for pid in pids if pathlib.Path(f"/proc/{pid}").exists()
            and "Z" not in pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]]


RUN_SECONDS = 300  # a conversion of these tests that has not ended by then is stuck: it is killed and the test fails


def _convert(source, output, env: dict | None = None, workers: int = 2) -> subprocess.Popen:
    """The conversion in its own session, its output in files beside `output` (never a pipe nobody
    reads while polling: a full pipe would stall the run and the test with it)."""
    log = pathlib.Path(f"{output}.console")
    with open(log, "w") as console:
        process = subprocess.Popen([sys.executable, "-m", "pipelines.convert", f"--input={source}", f"--output={output}",
                                    "--progress=off", f"--direct_num_workers={workers}", "--direct_running_mode=multi_processing"],
                                   cwd=ROOT, stdout=console, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    process.console = log  # type: ignore[attr-defined]
    process.deadline = time.monotonic() + RUN_SECONDS  # type: ignore[attr-defined]
    return process


def _still_running(process: subprocess.Popen) -> bool:
    """Whether the run goes on; past its deadline it is killed (with its workers) and the test fails."""
    if process.poll() is not None:
        return False
    if time.monotonic() > process.deadline:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        pytest.fail(f"the conversion did not end within {RUN_SECONDS} s: {_console(process)[-2000:]}")
    return True


def _holds_worker_socket(pid: int, launcher: int) -> bool:
    """Whether `pid` holds the zygote's listening socket (@mixtrain-workers-LAUNCHER-..., /proc/net/unix)."""
    try:
        with open("/proc/net/unix") as table:
            inodes = {line.split()[6] for line in table.readlines()[1:]
                      if len(line.split()) > 7 and line.split()[7].startswith(f"@mixtrain-workers-{launcher}-")}
        held = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
    except OSError:
        return False
    return any(f"socket:[{inode}]" in held for inode in inodes)


def _console(process: subprocess.Popen) -> str:
    return process.console.read_text()


def _recording_interpreters(tmp_path) -> tuple[dict, pathlib.Path]:
    """An environment in which every Python interpreter that starts (not a fork: forks start none)
    appends its command line to a file, from sitecustomize: a complete record, not /proc samples."""
    hook, record = tmp_path / "hook", tmp_path / "interpreters.txt"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import os\n"
        "with open(os.environ['MIXTRAIN_TEST_INTERPRETERS'], 'ab') as out:\n"
        "    out.write(open('/proc/self/cmdline', 'rb').read().replace(b'\\0', b' ') + b'\\n')\n")
    path = os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "MIXTRAIN_TEST_INTERPRETERS": str(record)}, record


def _until_gone(pids, seconds: float = 30) -> list[int]:
    """The processes of `pids` still alive after they had `seconds` to exit (polled, not sampled once)."""
    deadline = time.monotonic() + seconds
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _alive(pids)


def test_wanted_only_for_local_multi_process_runs():
    assert local_workers.wanted(["--direct_num_workers=2", "--direct_running_mode=multi_processing"])
    assert local_workers.wanted(["--runner=DirectRunner", "--direct_num_workers=0", "--direct_running_mode=multi_processing"])
    assert local_workers.wanted(["--direct_num_workers=1", "--direct_running_mode=multi_processing"])  # warm, not cold
    assert not local_workers.wanted(["--direct_num_workers=2", "--direct_running_mode=multi_threading"])
    assert not local_workers.wanted(["--runner=DataflowRunner", "--direct_num_workers=2", "--direct_running_mode=multi_processing"])


def _watch(process: subprocess.Popen) -> dict[int, str]:
    """Every descendant of `process` seen while it runs."""
    seen: dict[int, str] = {}
    while _still_running(process):
        seen.update(_descendants(process.pid, _processes()))
        time.sleep(0.02)
    return seen


@pytest.mark.parametrize("workers", [2, 1])
def test_workers_are_forked_from_the_zygote(tmp_path, workers):
    source = tmp_path / "src"
    write_dataset(str(source), SyntheticLeRobot(lengths=[40] * 12, episodes_per_video_file=4))
    env, record = _recording_interpreters(tmp_path)
    process = _convert(source, tmp_path / "out", env, workers)
    seen = _watch(process)
    assert process.returncode == 0, _console(process)
    forked = [command for command in seen.values() if "pipelines.convert" in command]
    assert len(forked) >= 1 + workers  # the zygote and the workers
    started = record.read_text().splitlines()  # every interpreter of the run, however short-lived
    assert "pipelines.convert" in started[0] and sum("pipelines.local_workers connect" in line for line in started) >= workers, started
    assert not [line for line in started if "sdk_worker_main" in line]  # Beam never had to start a cold worker
    assert validate.validate(str(tmp_path / "out")) == []
    assert _until_gone(seen) == []


def test_without_a_zygote_workers_start_cold_and_the_run_completes(tmp_path):
    """A zygote that died (here: killed as soon as it appears) costs speed, never the run. The
    launcher's forked children are the early planner (pipelines/early_plan.py), then the zygote:
    both are killed (a killed planner costs speed too: the launcher plans itself)."""
    source = tmp_path / "src"
    write_dataset(str(source), SyntheticLeRobot(lengths=[40] * 12, episodes_per_video_file=4))
    env, record = _recording_interpreters(tmp_path)
    process = _convert(source, tmp_path / "out", env)
    seen: dict[int, str] = {}
    killed: dict[int, str] = {}
    while _still_running(process):
        table = _processes()
        seen.update(_descendants(process.pid, table))
        for pid, (ppid, command) in table.items():
            if pid in killed or ppid != process.pid or "pipelines.convert" not in command:
                continue
            # A forked child of the launcher: the planner (before the zygote), the zygote (it holds the
            # workers' socket), or, after the zygote, the launcher's fork of a Beam worker command that
            # has not exec'd yet (killing that one is not the zygote's death; Beam's runner waits for
            # such a worker for ever).
            role = "zygote" if _holds_worker_socket(pid, process.pid) else ("planner" if "zygote" not in killed.values() else None)
            if role is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                killed[pid] = role
        time.sleep(0.01)
    assert "zygote" in killed.values() and process.returncode == 0, (killed, _console(process))
    assert any("sdk_worker_main" in line for line in record.read_text().splitlines()), sorted(seen.values())
    assert validate.validate(str(tmp_path / "out")) == []


def test_a_killed_launcher_takes_the_zygote_and_its_workers_along(tmp_path):
    source = tmp_path / "src"
    write_dataset(str(source), SyntheticLeRobot(lengths=[60] * 30, episodes_per_video_file=5))
    process = _convert(source, tmp_path / "out")
    seen: dict[int, str] = {}
    deadline = time.monotonic() + 60
    while not any("pipelines.local_workers connect" in command for command in seen.values()):
        assert time.monotonic() < deadline and process.poll() is None, "workers never started"
        seen.update(_descendants(process.pid, _processes()))
        time.sleep(0.02)
    time.sleep(0.3)
    seen.update(_descendants(process.pid, _processes()))
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    left = _until_gone(seen)
    assert left == [], f"outlived the launcher: {[seen[pid] for pid in left]}"


def test_only_on_linux(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    assert not local_workers.wanted(["--direct_num_workers=2", "--direct_running_mode=multi_processing"])


def test_codec_threads_share_the_cores_among_local_workers(monkeypatch):
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipelines.conversion import codec_threads

    monkeypatch.setattr(local_workers.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert [local_workers.codec_threads(n) for n in (1, 2, 3, 4, 8, 0, None)] == [4, 2, 1, 1, 1, 1, 4]
    assert codec_threads(PipelineOptions(["--direct_num_workers=2", "--direct_running_mode=multi_processing"])) == 2
    assert codec_threads(PipelineOptions([])) == 4
    assert codec_threads(PipelineOptions(["--runner=DataflowRunner", "--direct_num_workers=2"])) is None  # its workers have their own cores


KILLED = ("a worker process of this run was killed by SIGKILL (which the kernel's out-of-memory killer sends) before its "
          "work was done; nothing was published")


def _errors(process: subprocess.Popen) -> list[str]:
    return [line for line in _console(process).splitlines() if line.startswith("error:")]


@pytest.mark.parametrize("workers", [2, 1])
def test_a_worker_dead_before_it_connects_fails_the_run_in_one_line(tmp_path, workers):
    """Beam's runner waited for ever for a worker that died before it connected to it (its
    requests and its data were never answered); the watched workers fail the run at once."""
    source = tmp_path / "src"
    write_dataset(str(source), SyntheticLeRobot(lengths=[20] * 6, cameras=()))
    output = tmp_path / "out"
    started = time.monotonic()
    process = _convert(source, output, {**os.environ, "MIXTRAIN_TEST_STOP_AT": "worker:forked"}, workers)
    while _still_running(process):
        time.sleep(0.05)
    assert time.monotonic() - started < 60
    assert process.returncode == 1 and _errors(process) == [f"error: {output}: {KILLED}"], _console(process)
    assert "Traceback" not in _console(process)
    assert not output.exists() and not list(tmp_path.glob(".out.*"))  # nothing published, nothing left beside it


def test_a_worker_killed_mid_run_fails_the_run_in_one_line_and_keeps_what_it_completed(tmp_path):
    """Killed while it converts (as the out-of-memory killer does): the run ends with what
    happened to the worker, not Beam's "Channel closed prematurely", and what it completed is
    kept for a resumption; the same command then finishes the dataset."""
    source = tmp_path / "src"
    write_dataset(str(source), SyntheticLeRobot(lengths=[50] * 6000, cameras=(), episodes_per_data_file=500,
                                                episodes_per_meta_file=500))
    output = tmp_path / "out"
    # The zygote reaps its workers every 3 s here, not every 0.2 s: the dead worker's channel
    # then always fails (Beam looks after a second without data) before its death is heard, as it did in 1 of 8 runs on a loaded machine.
    process = _convert(source, output, {**os.environ, "MIXTRAIN_TEST_REAP_SECONDS": "3.0"})
    killed = None
    while _still_running(process):
        if killed is None:
            table = _processes()
            zygotes = [pid for pid in _descendants(process.pid, table) if _holds_worker_socket(pid, process.pid)]
            workers = [pid for pid, (ppid, command) in table.items() if ppid in zygotes and "pipelines.convert" in command]
            if workers and list(tmp_path.glob(".out.mixtrain-*/_resume/done/*")):  # converting: its first rows recorded
                os.kill(workers[0], signal.SIGKILL)
                killed = workers[0]
        time.sleep(0.02)
    assert killed is not None and process.returncode == 1, _console(process)
    lines = _errors(process)
    assert lines == [f"error: {output}: {KILLED}"], _console(process)
    assert "run the same command again to resume" in _console(process) and "Traceback" not in _console(process)
    again = _convert(source, output)
    while _still_running(again):
        time.sleep(0.05)
    assert again.returncode == 0 and "resuming" in _console(again), _console(again)
    assert validate.validate(str(output)) == []


def test_how_a_worker_ended_is_said_as_a_user_reads_it():
    assert local_workers.how_it_ended(137) == "was killed by SIGKILL (which the kernel's out-of-memory killer sends)"
    assert local_workers.how_it_ended(-9) == "was killed by SIGKILL (which the kernel's out-of-memory killer sends)"
    assert local_workers.how_it_ended(139) == "was killed by SIGSEGV"
    assert local_workers.how_it_ended(1) == "exited with status 1"
    assert local_workers.how_it_ended(0) == "exited with status 0"
    assert local_workers.how_it_ended(None) == "ended without an exit status"
    assert local_workers.how_it_ended(128 + 99) == "was killed by signal 99"


_PIPELINE_WITH_A_DYING_WORKER = r"""
import os, pathlib, signal, sys, time
import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from pipelines import local_workers

folder, which = pathlib.Path(sys.argv[1]), sys.argv[2]

def work(element):
    mine = folder / f"pid-{os.getpid()}"
    if not mine.exists():
        mine.write_text("")
    pids = sorted(int(path.name[4:]) for path in folder.glob("pid-*"))
    if len(pids) == 2 and os.getpid() == (pids[-1] if which == "larger" else pids[0]):
        (folder / "killed").write_text(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.1)
    return element

try:
    with beam.Pipeline(runner=local_workers.runner(None), options=PipelineOptions(
            ["--direct_num_workers=2", "--direct_running_mode=multi_processing"])) as pipeline:
        _ = pipeline | beam.Create(range(120)) | beam.Reshuffle() | beam.Map(work)
    print("finished")
except local_workers.WorkerDied:
    print(f"died {time.time() - float((folder / 'killed').read_text()):.2f}")
"""


@pytest.mark.parametrize("which", ["larger", "smaller"])
def test_a_dead_worker_fails_the_run_at_once_while_the_other_still_works(tmp_path, which):
    """Beam's runner gathers a stage's partitions in order: had only the dead worker's requests
    failed, a death in the second partition would have waited for the first worker's whole share
    (6 s here). The worker with the larger pid, then the smaller one, kills itself: one of them
    holds each partition."""
    script = tmp_path / "dying.py"
    script.write_text(_PIPELINE_WITH_A_DYING_WORKER)
    finished = subprocess.run([sys.executable, str(script), str(tmp_path), which], cwd=ROOT, capture_output=True, text=True,
                              timeout=120)
    said = finished.stdout.strip().splitlines()
    assert said and said[-1].startswith("died "), (finished.stdout, finished.stderr[-2000:])
    assert float(said[-1].split()[1]) < 3.0, said
