"""Scaling: the conversion at 1, 2, 4 ... local workers, where its cores go, and its serial head and tail.

    python bench/bench_scaling.py [--workers=1,2,4,8,16] [--only=traj,copy,reencode] [--scale=1] [--peers]
                                  [--peer-procs=16] [--budget=SECONDS] [--out=results.jsonl]
    python bench/bench_scaling.py --proxies        # the 2-core proxies of issue 28 (below)

Workloads, written here with the project's synthetic LeRobot v3 writer (the issue's, at --scale=1):
  traj      20,000 episodes x 50 steps, no cameras (500 episodes a data file)
  copy      3,200 episodes x 150 frames, two AV1 cameras, --verify_copies=false (80 episodes a file)
  reencode  64 episodes x 300 frames, two AV1 cameras at 320x240 -> H.264

Every conversion runs as one subprocess (bench/timed_convert.py: the moments the launcher heard the
first and the last converted sequence) while this script samples /proc of it and all its
descendants every 0.1 s. Per run it prints wall time, CPU seconds, the serial head (process start to
the first converted sequence) and tail (last converted sequence to exit), the cores busy per 0.5 s,
and the balance of the workers (busiest worker's CPU over the mean). Ratios are against the
one-worker run and, with --peers, against bench/peer.py (one process; for copy also its --mp4-floor)
and bench/peer_parallel.py (the same loop in N processes, N from --peer-procs, default every worker
count), measured in the same run. Copy with --peers also runs the largest worker count with the
default verification, for its CPU against the unverified copy's. Re-encode prints its parallel
efficiency: wall against (its own CPU seconds / workers). The last lines are issue 28's "done when"
ratios for what was measured. --out appends one JSON line per measurement as it comes (a run cut
short still reports); --budget skips what would start after that many seconds.

--proxies runs traj with 2 workers and with 8 workers (uniform episodes) and checks the issue's
proxies: head <= 1.5 s and tail <= 1.0 s with 2 workers; busiest worker <= 1.2x the mean with 8.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from formats.sources.lerobot_v3.sample import SyntheticLeRobot, write_dataset  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
PERIOD = 0.1


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds) of `pid`, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK
    except (OSError, IndexError, ValueError):
        return None


def _command(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read()
    except OSError:
        return b""


def _tree(root: int) -> dict[int, int]:
    """Every live descendant of `root` (and root) -> its parent."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None:
                parents[int(entry)] = stat[0]
    found, todo = {root: 0}, [root]
    while todo:
        pid = todo.pop()
        for child, parent in parents.items():
            if parent == pid and child not in found:
                found[child] = pid
                todo.append(child)
    return found


def sampled(command: list[str]) -> dict:
    """Run `command` (a timed_convert.py command line), sampling its process tree."""
    marks_file = tempfile.NamedTemporaryFile(suffix=".json", delete=False).name
    started = time.time()
    env = dict(os.environ, MIXTRAIN_MARKS=marks_file, MIXTRAIN_T0=repr(started), SVT_LOG="1")
    errors = tempfile.TemporaryFile(mode="w+")  # not a pipe: read only at the end, it could fill and stall the run
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=errors, text=True)
    cpu: dict[int, list[tuple[float, float]]] = {}
    parent_of: dict[int, int] = {}
    command_of: dict[int, bytes] = {}
    while process.poll() is None:
        now = time.time() - started
        for pid, parent in _tree(process.pid).items():
            stat = _stat(pid)
            if stat is not None:
                cpu.setdefault(pid, []).append((now, stat[1]))
                parent_of.setdefault(pid, parent)
                if pid not in command_of:
                    command_of[pid] = _command(pid)
        time.sleep(PERIOD)
    wall = time.time() - started
    errors.seek(0)
    error = errors.read()
    errors.close()
    marks = json.loads(pathlib.Path(marks_file).read_text() or "{}") if os.path.getsize(marks_file) else {}
    os.unlink(marks_file)
    if process.returncode:
        raise SystemExit(f"error: {' '.join(command[2:4])}: exit {process.returncode}: {error.strip()[-400:]}")
    buckets = [0.0] * (int(wall / 0.5) + 2)
    for series in cpu.values():
        for (_, before), (t, after) in zip(series, series[1:]):
            buckets[min(int(t / 0.5), len(buckets) - 1)] += after - before
    # Local workers are forked by the zygote, the launcher's child: the zygote's children, which
    # carry the launcher's command line (the children of Beam's `sh -c ... local_workers connect`
    # clients, also the launcher's children, are the short-lived clients, not workers).
    zygotes = {pid for pid, parent in parent_of.items() if parent == process.pid}
    launcher = command_of.get(process.pid)
    workers = [series[-1][1] for pid, series in cpu.items() if parent_of.get(pid) in zygotes and command_of.get(pid) == launcher]
    return {"wall": wall, "cpu": sum(series[-1][1] for series in cpu.values()), "marks": marks,
            "launcher_cpu": cpu.get(process.pid, [(0, 0.0)])[-1][1], "workers": sorted(workers, reverse=True),
            "cores": [round(b / 0.5, 1) for b in buckets]}


def describe(name: str, run: dict) -> str:
    marks, workers = run["marks"], [w for w in run["workers"] if w > 0.05]
    head = marks.get("first_sequence")
    tail = run["wall"] - marks["last_sequence"] if "last_sequence" in marks else None
    balance = max(workers) / (sum(workers) / len(workers)) if workers else None
    lines = [f"  {name:<24} wall {run['wall']:6.2f} s  CPU {run['cpu']:7.2f} s  launcher {run['launcher_cpu']:5.2f} s  "
             f"head {head if head is not None else float('nan'):5.2f} s  tail {tail if tail is not None else float('nan'):5.2f} s  "
             f"workers {len(workers)}, busiest/mean {balance or float('nan'):.2f}",
             f"  {'':<24} imports {marks.get('imports_done', float('nan')):.2f} s; cores busy per 0.5 s: "
             + " ".join(f"{c:.0f}" for c in run["cores"])]
    run.update(head=head, tail=tail, balance=balance)
    return "\n".join(lines)


def workloads(scale: float) -> dict[str, tuple[SyntheticLeRobot, list[str]]]:
    return {
        "traj": (SyntheticLeRobot(lengths=[50] * max(20, int(20_000 * scale)), cameras=(), episodes_per_data_file=500,
                                  episodes_per_meta_file=500), []),
        "copy": (SyntheticLeRobot(lengths=[150] * max(8, int(3200 * scale)), episodes_per_data_file=80, episodes_per_video_file=80,
                                  video_variants=8), ["--verify_copies=false"]),
        "reencode": (SyntheticLeRobot(lengths=[300] * max(2, int(64 * scale)), width=320, height=240, episodes_per_video_file=20,
                                      episodes_per_data_file=50, video_variants=8), ["--video=reencode"]),
    }


class Outputs:
    """A folder of its own for every run's output, all removed together when the bench ends.

    Removing the last run's output right before the next run was measuring the file system, not
    the conversion: ext4 will not reuse an inode deleted in the last ~30 s, and scans past every
    such inode for each file it creates (`recently_deleted` in the kernel's profile). With 6,400
    video files deleted just before, the 2-worker copy spent 5.0 s in the kernel instead of 1.5 s
    and ran 6.5 s instead of 4.5 s; the peers paid it too."""

    def __init__(self, work: pathlib.Path):
        self.root = pathlib.Path(tempfile.mkdtemp(prefix="outputs_", dir=work))
        self._count = 0

    def new(self, label: str) -> pathlib.Path:
        self._count += 1
        return self.root / f"{self._count:03d}_{label.replace(' ', '_')}"

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def convert(src: pathlib.Path, dst: pathlib.Path, workers: int, extra: list[str]) -> list[str]:
    return [sys.executable, str(ROOT / "bench" / "timed_convert.py"), f"--input={src}", f"--output={dst}", "--progress=off",
            f"--direct_num_workers={workers}", "--direct_running_mode=multi_processing", *extra]


def timed(command: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds (user + system of the process and its children) of one command."""
    before = os.times()
    started = time.perf_counter()
    subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    wall, after = time.perf_counter() - started, os.times()
    return wall, (after.children_user - before.children_user) + (after.children_system - before.children_system)


def done_when(name: str, runs: dict, peers: dict) -> list[str]:
    """Issue 28's "done when" ratios for one workload, from what this run measured."""
    lines, most = [], max(runs)
    top = runs[most]
    if 1 in runs and most > 1:
        lines.append(f"({name}) 1 -> {most} workers: speed-up {runs[1]['wall'] / top['wall']:.2f}x"
                     + (" (target >= 8)" if name == "traj" else ""))
    walls = [runs[n]["wall"] for n in sorted(runs)]
    if len(walls) > 1:
        grows = [f"{a}->{b}" for a, b, x, y in zip(sorted(runs), sorted(runs)[1:], walls, walls[1:]) if y > x]
        lines.append(f"({name}) wall grows when the workers grow: {', '.join(grows) or 'never'}")
    if name == "reencode":
        lines.append(f"({name}) {most} workers: wall / (own CPU / {most}) = {top['wall'] / (top['cpu'] / most):.2f} (target <= 1.2)")
    targets = {"traj": (1.5, 0.6), "copy": (1.2, 0.25)}
    if f"parallel x{most}" in peers:
        target = targets.get(name, (None, None))[0]
        lines.append(f"({name}) {most} workers / parallel peer x{most}: {top['wall'] / peers[f'parallel x{most}'][0]:.2f}"
                     + (f" (target <= {target})" if target else ""))
    if "one process" in peers:
        target = targets.get(name, (None, None))[1]
        lines.append(f"({name}) {most} workers / one-process peer: {top['wall'] / peers['one process'][0]:.2f}"
                     + (f" (target <= {target})" if target else ""))
    if "mp4 floor" in peers:
        lines.append(f"({name}) {most} workers / one-process MP4 floor: {top['wall'] / peers['mp4 floor'][0]:.2f} (target <= 0.5)")
    if "verified" in peers:
        lines.append(f"({name}) default verification's CPU / the unverified copy's, {most} workers: "
                     f"{peers['verified'][1] / top['cpu']:.2f} (target <= 1.5)")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,2,4,8,16")
    parser.add_argument("--only", default="traj,copy,reencode")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--peers", action="store_true", help="also time bench/peer.py and bench/peer_parallel.py")
    parser.add_argument("--peer-procs", default="", help="the parallel peer's process counts (default: every worker count)")
    parser.add_argument("--proxies", action="store_true", help="the 2-core proxies: traj with 2 and 8 workers, checked")
    parser.add_argument("--work", default="", help="keep the generated sources here (reused when present)")
    parser.add_argument("--out", default="", help="append one JSON line per measurement to this file")
    parser.add_argument("--budget", type=float, default=0.0, help="start nothing after this many seconds (0: no limit)")
    args = parser.parse_args()
    started = time.perf_counter()
    work = pathlib.Path(args.work or tempfile.mkdtemp(prefix="bench_scaling_"))
    work.mkdir(parents=True, exist_ok=True)
    specs = workloads(args.scale)
    only = ["traj"] if args.proxies else args.only.split(",")
    counts = [2, 8] if args.proxies else [int(n) for n in args.workers.split(",")]
    peer_procs = [int(n) for n in args.peer_procs.split(",")] if args.peer_procs else counts
    out = open(args.out, "a") if args.out else None
    ratios = []

    def record(**row) -> None:
        if out is not None:
            row["t"] = round(time.perf_counter() - started, 1)
            out.write(json.dumps(row) + "\n")
            out.flush()

    def in_budget(what: str) -> bool:
        if args.budget and time.perf_counter() - started > args.budget:
            print(f"  {what:<24} skipped: past --budget", flush=True)
            return False
        return True

    record(machine=os.uname().nodename, cores=os.cpu_count(), python=sys.version.split()[0])
    outputs = Outputs(work)
    try:
        for name in only:
            spec, extra = specs[name]
            src = work / name
            if not in_budget(f"{name} (generate)"):
                continue
            if not (src / "meta" / "info.json").exists():
                generated = time.perf_counter()
                write_dataset(str(src), spec)
                record(workload=name, run="generate", wall=round(time.perf_counter() - generated, 2))
            print(f"== {name} ({len(spec.lengths)} episodes)", flush=True)
            runs, peers = {}, {}
            for workers in counts:
                if not in_budget(f"{workers} worker(s)"):
                    continue
                runs[workers] = sampled(convert(src, outputs.new(f"{name}_{workers}"), workers, extra))
                print(describe(f"{workers} worker(s)", runs[workers]), flush=True)
                record(workload=name, worker_count=workers, **runs[workers])
            if args.peers and name != "reencode" and runs:
                commands = {"one process": [sys.executable, "bench/peer.py", str(src), str(outputs.new("peer"))]}
                if name == "copy":
                    commands["mp4 floor"] = [sys.executable, "bench/peer.py", str(src), str(outputs.new("floor")), "--mp4-floor"]
                for procs in peer_procs:
                    commands[f"parallel x{procs}"] = [sys.executable, "bench/peer_parallel.py", str(src),
                                                      str(outputs.new(f"peer_{procs}")), "--procs", str(procs)]
                if name == "copy":  # measured as the unverified runs are (sampled), for a like-for-like CPU ratio
                    commands["verified"] = [arg for arg in convert(src, outputs.new("verified"), max(runs), extra)
                                            if arg != "--verify_copies=false"]
                for label, command in commands.items():
                    if not in_budget(label):
                        continue
                    if label == "verified":
                        verified = sampled(command)
                        peers[label] = (verified["wall"], verified["cpu"])
                    else:
                        peers[label] = timed(command)
                    shown = f"{max(runs)} workers, default verification" if label == "verified" else f"peer, {label}"
                    print(f"  {shown:<24} wall {peers[label][0]:6.2f} s  CPU {peers[label][1]:7.2f} s", flush=True)
                    record(workload=name, run=label, wall=peers[label][0], cpu=peers[label][1])
            if runs:
                ratios += done_when(name, runs, peers)
            if args.proxies and 2 in runs and 8 in runs:
                two, eight = runs[2], runs[8]
                ratios += [f"(proxy) process start -> first converted sequence, 2 workers: {two['head']:.2f} s (target <= 1.5)",
                           f"(proxy) last converted sequence -> exit, 2 workers: {two['tail']:.2f} s (target <= 1.0)",
                           f"(proxy) busiest worker's CPU / mean, 8 workers, uniform episodes: {eight['balance']:.2f} (target <= 1.2)"]
    finally:
        outputs.remove()
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    print()
    for line in ratios:
        print(line)
        record(ratio=line)


if __name__ == "__main__":
    main()
