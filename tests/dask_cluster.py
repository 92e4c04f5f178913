"""A Dask cluster shaped like a real one, for the tests and the bench: a scheduler and workers
started as separate commands (`dask scheduler`, `dask worker`, as SLURM or Kubernetes start them),
each worker in a working folder of its own with its own temporary folder, so that nothing is shared
between them but what the conversion names (the object store)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

ROOT = pathlib.Path(__file__).resolve().parents[1]
DASK = str(pathlib.Path(sys.executable).with_name("dask"))  # the command the venv installed


@dataclasses.dataclass
class Cluster:
    scheduler_file: pathlib.Path
    scheduler: subprocess.Popen
    workers: list[subprocess.Popen]
    folders: list[pathlib.Path]

    def kill_worker(self, index: int) -> None:
        """SIGKILL one worker process (no nanny restarts it): a node lost mid-run."""
        os.killpg(self.workers[index].pid, signal.SIGKILL)
        self.workers[index].wait()

    def kill_scheduler(self) -> None:
        """SIGKILL the scheduler's process (its connections close at once; a vanished machine is noticed later)."""
        os.killpg(self.scheduler.pid, signal.SIGKILL)
        self.scheduler.wait()


def _start(command: list[str], folder: pathlib.Path, env: dict[str, str]) -> subprocess.Popen:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "log.txt", "w") as log:  # the child keeps its own descriptor
        return subprocess.Popen(command, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@contextlib.contextmanager
def separate_commands(root: pathlib.Path, workers: int = 2, env: dict[str, str] | None = None) -> Iterator[Cluster]:
    """The scheduler and `workers` workers (one thread, no nanny) running while the block runs. The
    workers find this checkout's test helpers on PYTHONPATH (as a real cluster finds the package its
    image installed); their working and temporary folders are theirs alone."""
    from dask.distributed import Client

    env = dict(os.environ if env is None else env, PYTHONPATH=str(ROOT))
    scheduler_file = root / "scheduler.json"
    processes = [_start([DASK, "scheduler", "--scheduler-file", str(scheduler_file), "--host", "127.0.0.1", "--port", "0",
                         "--no-dashboard"], root / "scheduler", env)]
    folders = []
    try:
        deadline = time.monotonic() + 60
        while not scheduler_file.exists():
            if processes[0].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dask scheduler did not start: {(root / 'scheduler' / 'log.txt').read_text()[-2000:]}")
            time.sleep(0.1)
        for index in range(workers):
            folder = root / f"worker{index}"
            (folder / "tmp").mkdir(parents=True)
            folders.append(folder)
            processes.append(_start([DASK, "worker", "--scheduler-file", str(scheduler_file), "--nthreads", "1", "--no-nanny",
                                     "--no-dashboard", "--host", "127.0.0.1", "--name", f"worker{index}", "--local-directory",
                                     str(folder / "dask")], folder, dict(env, TMPDIR=str(folder / "tmp"))))
        with Client(scheduler_file=str(scheduler_file), timeout=60) as client:
            client.wait_for_workers(workers, timeout=120)
        yield Cluster(scheduler_file, processes[0], processes[1:], folders)
    finally:
        for process in reversed(processes):
            _stop(process)
