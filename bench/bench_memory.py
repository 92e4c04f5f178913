"""Peak memory per process of a conversion: the launcher and each worker, measured from the kernel's
high-water mark of each process's resident set (VmHWM in /proc/<pid>/status, read every 50 ms
while the process lives: the peak itself, not a sample of it).

    python bench/bench_memory.py [--scale=1.0] [--only=droid_copy,droid_reencode,long,many]

Workloads (issue 40's sizing guide, written here, no download):
  droid_copy       one DROID-like episode: 3 cameras, 1280x720 H.264, 1,500 frames each, --video=copy
  droid_reencode   the same, --video=reencode (H.264, preset veryfast: the memory, not the encoder's speed)
  long             one episode of 100,000 steps x 64 float32 dims, no camera
  many             20,000 episodes of 50 steps, no camera
each with 2 workers (`--direct_num_workers=2 --direct_running_mode=multi_processing`). What one
episode's decoded video would take (frames x width x height x 3 bytes) is printed beside the
re-encode's worker peak: no worker may hold it.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WORKERS = ("--direct_num_workers=2", "--direct_running_mode=multi_processing")


def _descendants(pid: int) -> list[int]:
    """Every process below `pid` (from /proc: no dependency)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    parent = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def _high_water(pid: int) -> float | None:
    """The process's peak resident set so far, MB."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _is_worker(pid: int) -> bool:
    """A Python process (Beam's SDK workers, their zygote, the early planner), not a helper shell."""
    try:
        with open(f"/proc/{pid}/comm") as handle:
            return handle.read().startswith("python")
    except OSError:
        return False


def peak_rss(command: list[str], env: dict | None = None, interval: float = 0.05) -> dict:
    """Run `command`; returns {"launcher": MB, "workers": {pid: MB}, "wall": s} (every descendant of
    the launcher that is a Python process counts as a worker: Beam's SDK workers and their zygote)."""
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "SVT_LOG": "1", **(env or {})},
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    launcher, workers = 0.0, {}
    while process.poll() is None:
        launcher = max(launcher, _high_water(process.pid) or 0.0)
        for pid in _descendants(process.pid):
            peak = _high_water(pid)
            if peak is not None and _is_worker(pid):
                workers[pid] = max(workers.get(pid, 0.0), peak)
        time.sleep(interval)
    _, err = process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: exit {process.returncode}\n{err[-2000:]}")
    return {"launcher": launcher, "workers": workers, "wall": time.perf_counter() - started}


def convert(src: pathlib.Path, dst: pathlib.Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "pipelines.convert", f"--input={src}", f"--output={dst}", "--progress=off", *WORKERS, *extra]


def _droid(folder: pathlib.Path, frames: int) -> None:
    from formats.sources.lerobot_v3.sample import SyntheticLeRobot, write_dataset

    write_dataset(str(folder), SyntheticLeRobot(lengths=(frames,), codec="h264", gop=None, width=1280, height=720,
                                                cameras=("observation.images.exterior_1", "observation.images.exterior_2",
                                                         "observation.images.wrist")))


def _trajectories(folder: pathlib.Path, lengths: tuple[int, ...], dims: int) -> None:
    from formats.sources.lerobot_v3.sample import SyntheticLeRobot, write_dataset

    write_dataset(str(folder), SyntheticLeRobot(lengths=lengths, cameras=(), state_dim=dims, action_dim=dims,
                                                episodes_per_data_file=1000))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--only", default="droid_copy,droid_reencode,long,many")
    args = parser.parse_args()
    only = set(args.only.split(","))
    frames, steps, episodes = max(30, int(1500 * args.scale)), max(1000, int(100_000 * args.scale)), max(100, int(20_000 * args.scale))
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as folder:
        work = pathlib.Path(folder)
        rows = []
        if only & {"droid_copy", "droid_reencode"}:
            _droid(work / "droid", frames)
            decoded = frames * 1280 * 720 * 3 / 1e6
            for name, extra in (("droid_copy", ()), ("droid_reencode", ("--video=reencode", "--video_preset=veryfast"))):
                if name in only:
                    rows.append((name, peak_rss(convert(work / "droid", work / name, *extra)),
                                 f"one camera decoded: {decoded:.0f} MB, three: {3 * decoded:.0f} MB"))
        if "long" in only:
            _trajectories(work / "long", (steps,), 64)
            rows.append(("long", peak_rss(convert(work / "long", work / "long-out")), f"the episode's arrays: {steps * 64 * 4 * 2 / 1e6:.0f} MB"))
        if "many" in only:
            _trajectories(work / "many", (50,) * episodes, 6)
            rows.append(("many", peak_rss(convert(work / "many", work / "many-out")), f"{episodes} episodes"))
        for name, peak, note in rows:
            workers = sorted(peak["workers"].values(), reverse=True)
            print(f"{name}: launcher {peak['launcher']:.0f} MB, workers {' / '.join(f'{w:.0f}' for w in workers)} MB "
                  f"(largest {workers[0] if workers else 0:.0f} MB), wall {peak['wall']:.1f} s; {note}", flush=True)


if __name__ == "__main__":
    main()
