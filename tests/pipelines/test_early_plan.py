"""The plan made in a forked process while the launcher imports Beam (pipelines/early_plan.py)."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

import pytest

from formats import errors, samples, storage
from pipelines import cli, early_plan, plan
from pipelines.early_plan import EarlyPlan

ROOT = pathlib.Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the early planner forks: Linux only")


def _args(src, dst, *extra):
    return cli.parse([f"--input={src}", f"--output={dst}", *extra])[0]


def _output_url(dst) -> str:
    return storage.url_for(*storage.open_root(str(dst)))


def _started(args) -> EarlyPlan:
    planner = EarlyPlan()
    assert planner.start(args)
    return planner


def _zombie_free(pid: int) -> bool:
    """The planner was reaped: no process (not even a zombie) has its pid as our child."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


def test_the_launcher_forks_the_planner_before_any_heavy_import():
    probe = subprocess.run([sys.executable, "-c", "import sys, pipelines.convert, pipelines.early_plan, pipelines.progress; "
                            "print(sorted(m for m in ('apache_beam', 'pyarrow', 'numpy', 'av', 'fsspec') if m in sys.modules))"],
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert probe.stdout.strip() == "[]", probe.stderr


@pytest.mark.parametrize("source", ["lerobot_v3", "lerobot_v2", "ortf", "rlds", "l5kit"])
def test_the_early_plan_is_the_plan_the_launcher_would_make(tmp_path, source):
    src, dst = tmp_path / source, tmp_path / "out"
    samples.get(source).small(str(src))
    args = _args(src, dst, *samples.get(source).convert_args)
    planner = _started(args)
    pid = planner._pid
    early = planner.result(output_url=_output_url(dst), grace=None)
    assert early is not None and _zombie_free(pid)
    made = plan.make_plan(args, output_url=_output_url(dst), created_at=early.sidecar_extra["created_at"])
    assert early.source.id == made.source.id == source
    for field in dataclasses.fields(plan.ConversionPlan):
        if field.name not in ("source", "fingerprints"):
            assert getattr(early, field.name) == getattr(made, field.name), field.name
    assert early.fingerprints.context == made.fingerprints.context and early.fingerprints.signed == made.fingerprints.signed
    assert early.fingerprints.units == made.fingerprints.units and len(made.fingerprints.units) >= 2
    assert list(early.fingerprints.units) == list(made.fingerprints.units)  # the refs' order


def test_a_refusal_of_the_planner_is_raised_by_the_launcher_as_make_plan_raises_it(tmp_path):
    src, dst = tmp_path / "lerobot", tmp_path / "out"
    samples.get("lerobot_v3").small(str(src))
    info = json.loads((src / "meta" / "info.json").read_text())
    info["fps"] = "thirty"
    (src / "meta" / "info.json").write_text(json.dumps(info))
    args = _args(src, dst)
    with pytest.raises(errors.ConversionError) as made:
        plan.make_plan(args, output_url=_output_url(dst), created_at="")
    planner = _started(args)
    with pytest.raises(errors.ConversionError) as early:
        planner.result(output_url=_output_url(dst), grace=None)
    assert type(early.value) is type(made.value) and str(early.value) == str(made.value)
    assert "fps" in str(early.value)


def test_an_option_refused_for_this_dataset_keeps_its_hint(tmp_path):
    src, dst = tmp_path / "lerobot", tmp_path / "out"
    samples.get("lerobot_v3").small(str(src))
    args = _args(src, dst, "--video_crf=20")  # the sample's cameras are copied: the crf would change nothing
    with pytest.raises(cli.UsageError) as made:
        plan.make_plan(args, output_url=_output_url(dst), created_at="")
    with pytest.raises(cli.UsageError) as early:
        _started(args).result(output_url=_output_url(dst), grace=None)
    assert (str(early.value), early.value.hint) == (str(made.value), made.value.hint) and made.value.hint


def test_a_killed_planner_leaves_the_planning_to_the_launcher(tmp_path):
    src, dst = tmp_path / "ortf", tmp_path / "out"
    samples.get("ortf").small(str(src))
    planner = _started(_args(src, dst))
    pid = planner._pid
    os.kill(pid, signal.SIGKILL)
    assert planner.result(output_url=_output_url(dst), grace=None) is None
    assert _zombie_free(pid)


def test_a_plan_made_for_another_output_is_not_used_and_incremental_runs_are_planned_on_the_launcher(tmp_path):
    src, dst = tmp_path / "ortf", tmp_path / "out"
    samples.get("ortf").small(str(src))
    assert _started(_args(src, dst)).result(output_url=_output_url(tmp_path / "elsewhere"), grace=None) is None
    assert _started(_args(src, dst)).result(output_url=_output_url(dst), grace=None) is not None
    # --incremental reads the previous output: not before the launcher checked that no other run publishes there
    assert early_plan.wanted(_args(src, dst)) and not early_plan.wanted(_args(src, dst, "--incremental"))


class _Unpicklable(errors.ConversionError):
    """Holds a lock: no pickler sends it (whatever a library installed for exceptions: distributed's
    tblib support pickles keyword-only constructors, which a first version of this class relied on)."""

    def __init__(self, *, why: str):
        super().__init__(why)
        self.lock = threading.Lock()


def test_an_error_that_does_not_survive_pickling_makes_the_launcher_plan_itself(tmp_path, monkeypatch):
    src, dst = tmp_path / "ortf", tmp_path / "out"
    samples.get("ortf").small(str(src))

    def refuse(*_args, **_kwargs):
        raise _Unpicklable(why="only this process can make this one")

    monkeypatch.setattr(plan, "make_plan", refuse)  # in the forked planner only: it is forked after this
    planner = _started(_args(src, dst))
    monkeypatch.undo()
    assert planner.result(output_url=_output_url(dst), grace=None) is None


def test_cancel_stops_a_planner_nobody_asked(tmp_path):
    src, dst = tmp_path / "ortf", tmp_path / "out"
    samples.get("ortf").small(str(src))
    planner = _started(_args(src, dst))
    pid = planner._pid
    planner.cancel()
    planner.cancel()
    assert _zombie_free(pid)
    assert planner.result(output_url=_output_url(dst), grace=None) is None


def test_a_planner_not_done_when_the_launcher_is_ready_is_stopped(tmp_path, monkeypatch):
    """A plan that takes longer than Beam's import is too big to be worth sending: the launcher
    plans itself instead of waiting (a slow plan, here a planner that sleeps)."""
    src, dst = tmp_path / "ortf", tmp_path / "out"
    samples.get("ortf").small(str(src))

    def slow(*_args, **_kwargs):
        time.sleep(60)

    monkeypatch.setattr(plan, "make_plan", slow)
    planner = _started(_args(src, dst))
    monkeypatch.undo()
    pid = planner._pid
    started = time.monotonic()
    assert planner.result(output_url=_output_url(dst)) is None
    assert time.monotonic() - started < early_plan.GRACE_SECONDS + 5 and _zombie_free(pid)


def test_a_refusal_with_a_cause_is_planned_again_on_the_launcher(tmp_path, monkeypatch):
    """The launcher's messages read an error's cause (a full disk names the output), which pickling drops."""
    src, dst = tmp_path / "ortf", tmp_path / "out"
    samples.get("ortf").small(str(src))

    def full(*_args, **_kwargs):
        try:
            raise OSError(28, "No space left on device", str(dst))
        except OSError as error:
            raise errors.ConversionError(f"{src}: cannot read the input") from error

    monkeypatch.setattr(plan, "make_plan", full)
    planner = _started(_args(src, dst))
    monkeypatch.undo()
    assert planner.result(output_url=_output_url(dst), grace=None) is None


def _convert_script(body: str) -> str:
    return "import sys\nfrom pipelines import early_plan\n" + body + "\nfrom pipelines import convert\nconvert.main()\n"


def test_convert_forks_the_planner_before_importing_beam_and_takes_its_plan(tmp_path):
    src, dst, log = tmp_path / "lerobot", tmp_path / "out", tmp_path / "run.log"
    samples.get("lerobot_v3").small(str(src))
    script = _convert_script(
        "early_plan.GRACE_SECONDS = 120  # however loaded the machine: this test is about taking the plan\n"
        "start = early_plan.EarlyPlan.start\n"
        "def recorded(self, args, **options):\n"
        "    print('beam imported at the fork:', 'apache_beam' in sys.modules, flush=True)\n"
        "    return start(self, args, **options)\n"
        "early_plan.EarlyPlan.start = recorded\n"
        f"sys.argv = ['pipelines.convert', '--input={src}', '--output={dst}', '--progress=off', '--log_file={log}']")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.splitlines()[0] == "beam imported at the fork: False"
    assert "the plan was made by the early planner while Beam was imported" in log.read_text()
    episodes = json.loads((src / "meta" / "info.json").read_text())["total_episodes"]
    assert episodes >= 2 and json.loads((dst / "mixtrain.json").read_text())["num_sequences"] == episodes


def test_a_killed_launcher_takes_the_planner_along(tmp_path):
    src, dst = tmp_path / "ortf", tmp_path / "out"
    samples.get("ortf").small(str(src))
    script = ("import os, sys, time\nfrom pipelines import cli, early_plan, plan\n"
              "plan.make_plan = lambda *a, **k: time.sleep(120)\n"
              f"planner = early_plan.EarlyPlan()\nplanner.start(cli.parse(['--input={src}', '--output={dst}'])[0])\n"
              "print(planner._pid, flush=True)\ntime.sleep(120)\n")
    launcher = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    child = int(launcher.stdout.readline())
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait(timeout=30)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and os.path.exists(f"/proc/{child}"):
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{child}")  # gone (reaped by init), not planning on for two minutes


def test_ctrl_c_while_beam_is_imported_is_one_line_and_leaves_nothing(tmp_path):
    """SIGINT to the launcher's process group (a Ctrl-C) while it imports Beam and the planner plans:
    one `error:` line, exit 130, no output, and no planner left behind."""
    src, dst, importing = tmp_path / "lerobot", tmp_path / "out", tmp_path / "importing"
    samples.get("lerobot_v3").small(str(src))
    # Beam's import made endless, and saying when it starts: the signal lands inside it on any machine, however loaded.
    endless = _BEAM_NEVER_ARRIVES.replace("        time.sleep(600)", f"        open({str(importing)!r}, 'w').close()\n        time.sleep(600)")
    script = _convert_script(endless + f"sys.argv = ['pipelines.convert', '--input={src}', '--output={dst}', '--progress=off', "
                                       f"'--log_file={tmp_path / 'run.log'}']")
    launcher = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while not importing.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert importing.exists()
    os.killpg(launcher.pid, signal.SIGINT)
    _, stderr = launcher.communicate(timeout=60)
    assert launcher.returncode == 130 and stderr == "error: interrupted (SIGINT): the output was left as it was\n", stderr
    assert not dst.exists() and not list(tmp_path.glob(".out*"))
    leftovers = [pid for pid in os.listdir("/proc") if pid.isdigit() and str(dst).encode() in _cmdline(pid)]
    assert leftovers == []


def _cmdline(pid: str) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read()
    except OSError:
        return b""


_BEAM_NEVER_ARRIVES = ("import importlib.abc, importlib.machinery, sys, time\n"
                       "class _Never(importlib.abc.Loader):\n"
                       "    def create_module(self, spec):\n"
                       "        return None\n"
                       "    def exec_module(self, module):\n"
                       "        time.sleep(600)  # an import that never ends (holding only its own module's lock)\n"
                       "class _Slow(importlib.abc.MetaPathFinder):\n"
                       "    def find_spec(self, name, path=None, target=None):\n"
                       "        return importlib.machinery.ModuleSpec(name, _Never()) if name == 'apache_beam' else None\n"
                       "sys.meta_path.insert(0, _Slow())\n")


@pytest.mark.parametrize("case", ["option of another source", "input the source refuses"])
def test_a_refusal_the_planner_finds_is_said_without_waiting_for_beams_import(tmp_path, case):
    """Issue 41: `--fps` on a LeRobot dataset took 2-5 s (Beam's import) to say one line. The
    planner's refusal is said as soon as it is found, whatever Beam's import is doing (here it never
    ends), in the words and with the exit status the launcher uses."""
    if case == "option of another source":
        src, extra = tmp_path / "lerobot", ["--fps=10"]
        samples.get("lerobot_v3").small(str(src))
        expected = "error: --fps is an option of --source=rlds; it has no effect on this lerobot_v3 dataset\n"
    else:
        src, extra = tmp_path / "rlds", []
        samples.get("rlds").small(str(src))
        expected = None
    log, dst = tmp_path / "run.log", tmp_path / "out"
    script = _convert_script(_BEAM_NEVER_ARRIVES + f"sys.argv = ['pipelines.convert', '--input={src}', '--output={dst}', "
                                                   f"'--progress=off', '--log_file={log}', *{extra!r}]")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    if expected is not None:
        assert (done.returncode, done.stderr) == (2, expected)
    else:
        assert done.returncode == 1
        assert done.stderr == (f"error: {src}/dataset_info.json: 'synthetic_rlds': RLDS does not record a frame rate and "
                               "'synthetic_rlds' is not in the table of known Open X-Embodiment control rates; pass --fps=<Hz>\n"
                               f"(Beam's and the workers' log of this run: {log})\n")
        assert "FormatError" in log.read_text()  # the traceback is in the log
    assert not dst.exists() and "apache_beam" not in done.stderr


REFUSED_BEFORE_BEAM = {  # what the command line and the folders alone refuse (issue 41: each took 2-5 s, Beam's import)
    "--detach on the local runner": (["--detach"], 2,
                                     "error: --detach has no effect on a local runner (the run is this process); it is for "
                                     "--runner=DataflowRunner\n"),
    "a crf the codec lacks": (["--video=reencode", "--video_crf=99"], 2, "error: crf 99 is outside 0..51 for h264\n"),
    "--video_stats with --incremental": (["--video_stats", "--incremental"], 2,
                                         "error: --video_stats cannot be combined with --incremental (image statistics of reused "
                                         "sequences are not kept); run without --incremental to refresh them\n"),
    "a folder that is not a dataset": (["--output={tmp}/notes"], 1,
                                       "error: {tmp}/notes: output is not empty and is not a Mixtrain dataset (NOTES.md); choose "
                                       "another --output\n"),
    "the embedded catalog on a store": (["--output=s3://bucket/lake", "--table_format=iceberg"], 2,
                                        "error: --output=s3://bucket/lake: the embedded Iceberg catalog is an SQLite file on the "
                                        "output's disk, which an object store is not; pass --catalog (a REST, SQL or Glue catalog "
                                        "the workers reach, docs/lake.md)\n"),
}


@pytest.mark.parametrize("case", sorted(REFUSED_BEFORE_BEAM))
def test_command_line_refusals_are_said_before_beam_is_imported(tmp_path, case):
    flags, code, expected = REFUSED_BEFORE_BEAM[case]
    src = tmp_path / "lerobot"
    samples.get("lerobot_v3").small(str(src))
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "NOTES.md").write_text("mine")
    argv = [f"--input={src}", f"--output={tmp_path}/out", "--progress=off", *(flag.format(tmp=tmp_path) for flag in flags)]
    script = _convert_script(_BEAM_NEVER_ARRIVES + f"sys.argv = ['pipelines.convert', *{argv!r}]")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (code, expected.format(tmp=tmp_path))
    assert not (tmp_path / "out").exists() and (tmp_path / "notes").exists()
