"""Fixed and marginal cost, in one run: each workload small and large, the pipeline and its peers,
and a bare Beam pipeline of the same runner settings for Beam's own fixed cost (issue 42).

    python bench/bench_marginal.py [--only=traj,copy] [--small=0.1] [--large=1] [--workers=2] [--repeat=3] [--work=DIR]

Workloads are bench/bench_scaling.py's (at --large, on 2 cores: traj 20,000 episodes x 50 steps, copy
3,200 episodes x 150 frames x 2 AV1 cameras, unverified), each written twice: at --small and at
--large of that size. For each size: the pipeline with 1 worker and with --workers (local
multi-process workers), the one-process peer (bench/peer.py) and the --workers-process peer
(bench/peer_parallel.py), each --repeat times, alternated, the median wall taken (and the
head and tail of that run), every output kept until the end (bench_scaling.Outputs says why:
with copy at --large=1 and --repeat=3 that is about 4 GB of disk).
The marginal wall of a run is its large wall less its small wall: what grows with episodes,
frames and files, Beam's start and the interpreter's taken out.

The bare pipeline (`Create | Reshuffle | Map` of --workers workers, same runner settings as the
conversion) gives Beam's fixed cost: the moment its first element reaches the Map and its wall.
Printed: every wall, the marginal walls, and the issue's ratios: marginal wall of --workers workers
against the parallel peer's (target <= 1.15), 1 -> --workers workers on the marginal wall (>= 1.8),
head (start to the first converted sequence) against the bare pipeline's first element + 0.5 s,
and tail (last converted sequence to exit, target <= 1.0 s), both at the large traj workload.
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_scaling import Outputs, convert, sampled, timed, workloads  # noqa: E402
from formats.sources.lerobot_v3.sample import write_dataset  # noqa: E402

BARE = r"""
import sys, time
started = float(sys.argv[1]); workers = int(sys.argv[2]); out = sys.argv[3]
import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

def first(element):
    import os
    try:
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        os.write(fd, repr(time.time() - started).encode())
        os.close(fd)
    except FileExistsError:
        pass
    return element

options = PipelineOptions([f"--direct_num_workers={workers}", "--direct_running_mode=multi_processing"])
with beam.Pipeline(options=options) as pipeline:
    _ = pipeline | beam.Create(range(workers * 4)) | beam.Reshuffle() | beam.Map(first)
"""


def bare(workers: int, work: pathlib.Path) -> tuple[float, float]:
    """(first element, wall) of the bare Beam pipeline, seconds from its process's start."""
    mark = work / "bare_first"
    mark.unlink(missing_ok=True)
    started = time.time()
    subprocess.run([sys.executable, "-c", BARE, repr(started), str(workers), str(mark)], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return float(mark.read_text()), time.time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="traj,copy")
    parser.add_argument("--small", type=float, default=0.1)
    parser.add_argument("--large", type=float, default=1.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--work", default="")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each configuration; the median is taken")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    work = pathlib.Path(args.work or tempfile.mkdtemp(prefix="bench_marginal_"))
    first, bare_wall = bare(args.workers, work)
    print(f"bare Beam pipeline, {args.workers} workers: first element {first:.2f} s, wall {bare_wall:.2f} s", flush=True)
    ratios = []
    outputs = Outputs(work)  # every run's output kept until the end (Outputs says why)
    try:
        _measure(args, work, outputs, first, ratios)
    finally:
        outputs.remove()
    print("\n".join(ratios))
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


def _measure(args, work: pathlib.Path, outputs: Outputs, first: float, ratios: list[str]) -> None:
    for name in args.only.split(","):
        walls: dict[str, dict[str, float]] = {}
        heads = {}
        for size, scale in (("small", args.small), ("large", args.large)):
            spec, extra = workloads(scale)[name]
            src = work / f"{name}_{size}"
            if not src.exists():
                write_dataset(str(src), spec)
            taken: dict[str, list] = {}
            for _ in range(args.repeat):  # alternated, so that a slow moment of the machine is not one configuration's
                for workers in (1, args.workers):
                    run = sampled(convert(src, outputs.new(f"{name}_{size}_{workers}"), workers, extra))
                    marks = run["marks"]
                    taken.setdefault(f"{workers} worker(s)", []).append(
                        (run["wall"], marks.get("first_sequence"), run["wall"] - marks["last_sequence"] if "last_sequence" in marks else None))
                for label, command in (("one-process peer", [sys.executable, "bench/peer.py"]),
                                       (f"{args.workers}-process peer", [sys.executable, "bench/peer_parallel.py"])):
                    out = outputs.new(f"{name}_{size}_peer")
                    procs = ["--procs", str(args.workers)] if "process peer" in label and not label.startswith("one") else []
                    taken.setdefault(label, []).append((timed([*command, str(src), str(out), *procs])[0], None, None))
            for label, runs in taken.items():  # the run of median wall, with its head and tail
                wall, head, tail = sorted(runs, key=lambda run: run[0])[len(runs) // 2]
                walls.setdefault(label, {})[size] = wall
                if label.endswith("worker(s)"):
                    heads[(size, int(label.split()[0]))] = (head, tail)
        print(f"{name} (small {args.small:g}, large {args.large:g} of the issue's size):", flush=True)
        for label, by_size in walls.items():
            print(f"  {label:<22} small {by_size['small']:6.2f} s  large {by_size['large']:6.2f} s  "
                  f"marginal {by_size['large'] - by_size['small']:6.2f} s", flush=True)
        marginal = {label: by_size["large"] - by_size["small"] for label, by_size in walls.items()}
        mine, peer = marginal[f"{args.workers} worker(s)"], marginal[f"{args.workers}-process peer"]
        ratios.append(f"({name}) marginal wall, {args.workers} workers / {args.workers}-process peer: {mine / peer:.2f} (target <= 1.15)")
        ratios.append(f"({name}) marginal wall, 1 -> {args.workers} workers: {marginal['1 worker(s)'] / mine:.2f}x (target >= 1.8)")
        if name == "traj":
            head, tail = heads[("large", args.workers)]
            ratios.append(f"(traj) head {head:.2f} s against the bare pipeline's first element {first:.2f} s + 0.5 s (target: "
                          f"head <= {first + 0.5:.2f} s); tail {tail:.2f} s (target <= 1.0 s)")


if __name__ == "__main__":
    main()
