"""What a kill costs: a conversion SIGKILLed (its whole process group) at 30 %, at 80 % and while
its shards are written, then run again with the same command, against one uninterrupted run of the
same command measured in the same run.

    python bench/bench_resume.py [--episodes=2000] [--reencode_episodes=64]

Workloads (issue 40's, shaped as bench_scaling's): LeRobot v3 copy, 2,000 episodes x 150 frames, two
AV1 cameras, 2 workers; and a re-encode of 64 episodes x 300 frames at 320x240 to H.264, 2 workers. For each kill point it prints
the recorded sequences at the kill, the rerun's reused count, the wall of the killed run, of the
rerun, their sum / the uninterrupted wall (issue 40's target: <= 1.15), and whether the
published files are byte-identical to the uninterrupted run's (mixtrain.json but its time).
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from formats.sources.lerobot_v3.sample import SyntheticLeRobot, write_dataset  # noqa: E402

WORKERS = ("--direct_num_workers=2", "--direct_running_mode=multi_processing")


def _command(src: pathlib.Path, dst: pathlib.Path, extra: tuple[str, ...]) -> list[str]:
    return [sys.executable, "-m", "pipelines.convert", f"--input={src}", f"--output={dst}", "--progress=off", *WORKERS, *extra]


def _env(**extra: str) -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "SVT_LOG": "1", **extra}


_SEEN: dict[str, list[str]] = {}  # journal entry -> its ids (each parsed once: the poll must not load the machine)


def _recorded(dst: pathlib.Path) -> int:
    ids = set()
    for path in glob.glob(f"{dst.parent}/.{dst.name}.mixtrain-*/_resume/done/*.json"):
        if path not in _SEEN:
            try:
                _SEEN[path] = [row["id"] for row in json.loads(pathlib.Path(path).read_text())["rows"]]
            except (OSError, ValueError):
                continue
        ids.update(_SEEN[path])
    return len(ids)


def _run(command: list[str], env: dict | None = None) -> tuple[float, str]:
    os.sync()  # the previous command's dirty pages are written now, not during this one (bench/run.py does the same)
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env or _env(), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)}\n{done.stderr[-2000:]}")
    return time.perf_counter() - started, done.stdout


def _killed(command: list[str], dst: pathlib.Path, total: int, point: str) -> tuple[float, int]:
    """(wall, sequences recorded) of a run SIGKILLed at `point`: a fraction of the sequences
    recorded, or "shards" (the first shard written)."""
    env = _env(MIXTRAIN_TEST_STOP_AT="conversion:shard-written") if point == "shards" else _env()
    os.sync()
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=ROOT, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    while process.poll() is None and point != "shards":
        if _recorded(dst) >= float(point) * total:
            os.killpg(process.pid, signal.SIGKILL)
            break
        time.sleep(0.02)
    process.wait()
    if process.returncode != -signal.SIGKILL:
        raise SystemExit(f"the run was not killed at {point} (exit {process.returncode}): a larger workload is needed")
    return time.perf_counter() - started, _recorded(dst)


def _digests(root: pathlib.Path) -> dict[str, str]:
    found = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            if path.name == "mixtrain.json":
                value = json.loads(data)
                value.pop("created_at")
                data = json.dumps(value, sort_keys=True).encode()
            found[path.relative_to(root).as_posix()] = hashlib.sha256(data).hexdigest()
    return found


def workload(name: str, src: pathlib.Path, total: int, extra: tuple[str, ...], work: pathlib.Path, repeat: int = 1) -> None:
    whole = work / f"{name}-whole"
    walls = []
    for _ in range(repeat):  # the fastest of `repeat` uninterrupted runs: single runs here vary by 20-50 %
        shutil.rmtree(whole, ignore_errors=True)
        walls.append(_run(_command(src, whole, extra))[0])
    wall = min(walls)
    print(f"{name}: uninterrupted {wall:.2f} s (fastest of {' / '.join(f'{w:.2f}' for w in walls)})", flush=True)
    for point in ("0.3", "0.8", "shards"):
        dst = work / f"{name}-{point}"
        killed, recorded = _killed(_command(src, dst, extra), dst, total, point)
        rerun, out = _run(_command(src, dst, extra))
        reused = re.search(r"resumed: (\d+) of them reused", out)
        same = _digests(dst) == _digests(whole)
        at = "while shards are written" if point == "shards" else f"at {float(point):.0%}"
        _SEEN.clear()
        print(f"  killed {at}: {killed:.2f} s, {recorded} of {total} recorded; rerun {rerun:.2f} s, "
              f"{reused.group(1) if reused else 0} reused; (kill + rerun) / uninterrupted = {(killed + rerun) / wall:.2f}; "
              f"byte-identical: {same}", flush=True)
        shutil.rmtree(dst)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=2000)
    parser.add_argument("--reencode_episodes", type=int, default=64)
    parser.add_argument("--only", default="copy,reencode")
    parser.add_argument("--repeat", type=int, default=3, help="uninterrupted runs of the copy workload (the fastest counts)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-resume-") as folder:
        work = pathlib.Path(folder)
        only = set(args.only.split(","))
        copy = work / "copy-src"
        if "copy" in only:
            write_dataset(str(copy), SyntheticLeRobot(lengths=(150,) * args.episodes, episodes_per_data_file=80,
                                                      episodes_per_video_file=80, video_variants=8))
            workload("copy", copy, args.episodes, (), work, args.repeat)
        reencode = work / "reencode-src"
        if "reencode" not in only:
            return
        write_dataset(str(reencode), SyntheticLeRobot(lengths=(300,) * args.reencode_episodes, width=320, height=240,
                                                      episodes_per_video_file=20, episodes_per_data_file=50, video_variants=8))
        workload("reencode", reencode, args.reencode_episodes, ("--video=reencode",), work)


if __name__ == "__main__":
    main()
