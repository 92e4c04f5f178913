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
        "def recorded(self, args):\n"
        "    print('beam imported at the fork:', 'apache_beam' in sys.modules, flush=True)\n"
        "    return start(self, args)\n"
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
    src, dst = tmp_path / "lerobot", tmp_path / "out"
    samples.get("lerobot_v3").small(str(src))
    launcher = subprocess.Popen([sys.executable, "-m", "pipelines.convert", f"--input={src}", f"--output={dst}", "--progress=off",
                                 f"--log_file={tmp_path / 'run.log'}"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
    time.sleep(0.4)  # Beam's import takes 1.3 s or more: the launcher is in it, the planner at work
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
