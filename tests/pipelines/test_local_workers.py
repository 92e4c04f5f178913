"""Local multi-process workers are forked from the warm zygote, and nothing outlives the launcher."""

import os
import pathlib
import signal
import subprocess
import sys
import time

from formats.lerobot_v3_writer import SyntheticLeRobot, write_dataset
from pipelines import local_workers, validate

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _command_lines() -> list[str]:
    lines = []
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                lines.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                pass
    return lines


def _ours(lines: list[str], folder: pathlib.Path) -> list[str]:
    return [line for line in lines if str(folder) in line or "pipelines.local_workers" in line]


def _convert(source, output) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "pipelines.convert", f"--input={source}", f"--output={output}", "--progress_every=0",
                             "--direct_num_workers=2", "--direct_running_mode=multi_processing"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_wanted_only_for_local_multi_process_runs():
    assert local_workers.wanted(["--direct_num_workers=2", "--direct_running_mode=multi_processing"])
    assert local_workers.wanted(["--runner=DirectRunner", "--direct_num_workers=0", "--direct_running_mode=multi_processing"])
    assert not local_workers.wanted(["--direct_num_workers=1", "--direct_running_mode=multi_processing"])
    assert not local_workers.wanted(["--direct_num_workers=2", "--direct_running_mode=multi_threading"])
    assert not local_workers.wanted(["--runner=DataflowRunner", "--direct_num_workers=2", "--direct_running_mode=multi_processing"])


def test_workers_are_forked_from_the_zygote(tmp_path):
    source = tmp_path / "src"
    write_dataset(str(source), SyntheticLeRobot(lengths=[40] * 12, episodes_per_video_file=4))
    process = _convert(source, tmp_path / "out")
    seen: set[str] = set()
    while process.poll() is None:
        seen.update(line for line in _command_lines() if "pipelines.local_workers" in line or "sdk_worker_main" in line)
        time.sleep(0.02)
    assert process.returncode == 0, process.stderr.read()
    assert any("pipelines.local_workers serve" in line for line in seen)
    assert any("pipelines.local_workers connect" in line for line in seen)  # Beam ran our worker command
    assert not any("sdk_worker_main" in line for line in seen)  # and never had to start a cold worker
    assert validate.validate(str(tmp_path / "out")) == []
    assert not [line for line in _command_lines() if "pipelines.local_workers" in line]


def test_a_killed_launcher_takes_the_zygote_and_its_workers_along(tmp_path):
    source = tmp_path / "src"
    write_dataset(str(source), SyntheticLeRobot(lengths=[60] * 30, episodes_per_video_file=5))
    process = _convert(source, tmp_path / "out")
    deadline = time.monotonic() + 60
    while not [line for line in _command_lines() if "pipelines.local_workers connect" in line]:
        assert time.monotonic() < deadline and process.poll() is None, "workers never started"
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    deadline = time.monotonic() + 30
    while [line for line in _command_lines() if "pipelines.local_workers" in line]:
        assert time.monotonic() < deadline, "zygote or workers outlived the launcher"
        time.sleep(0.1)
