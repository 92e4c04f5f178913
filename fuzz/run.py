"""Run the fuzz harnesses: `python -m fuzz.run [--smoke] [--budget N|Ns] [NAME ...]`.

Each harness (fuzz/fuzz_<name>.py) runs in its own forked child (libFuzzer ends the process it
runs in), after the product's modules were imported once, instrumented for coverage, here:

    python -m fuzz.run --smoke                     every harness, its SMOKE_RUNS inputs, seed 1 (the test suite's run)
    python -m fuzz.run --budget 1000000 mp4        one harness toward a million executions
    python -m fuzz.run --budget 600s               every harness for 10 minutes each

A child first writes its seeds (cut from ../shared/fixtures and the product's sample writers) to
<work>/corpus/<name>, runs each seed once under the contract, caps its address space
(fuzz/contract.py), then fuzzes. One line per harness says executions, coverage (libFuzzer's cov/ft)
and whether it crashed; the full log and any crashing input stay in <work>/<name>.log and
<work>/crashes/.
"""

from __future__ import annotations

import argparse
import glob
import importlib
import os
import re
import shutil
import sys
import tempfile
import time

import atheris

HARNESSES = ("mp4", "tfrecord", "rlds_example", "zarr", "lerobot_json", "ortf_json", "rlds_json", "mixtrain_json")

with atheris.instrument_imports(include=["formats", "pipelines.validate", "pipelines.validate_deep", "pipelines.inspect"]):
    import formats.sources.l5kit  # noqa: F401 - the lazily registered sources, imported (and instrumented) now
    import formats.sources.lerobot_v3  # noqa: F401
    import formats.sources.ortf  # noqa: F401
    import formats.sources.rlds  # noqa: F401
    from fuzz import contract
    MODULES = {name: importlib.import_module(f"fuzz.fuzz_{name}") for name in HARNESSES}


def _child(name: str, work: str, flags: list[str]) -> None:
    """Prepare one harness and hand the process to libFuzzer (never returns). `-len_control=0`:
    mutations may use the whole input from the start (libFuzzer otherwise grows the length limit
    with the executions, and the metadata harnesses, at tens per second, would mutate only the
    first hundreds of bytes of a seed for their whole run)."""
    module = MODULES[name]
    corpus = os.path.join(work, "corpus", name)
    os.makedirs(corpus, exist_ok=True)
    os.makedirs(os.path.join(work, "crashes"), exist_ok=True)
    scratch = os.path.join(work, "scratch", name)
    shutil.rmtree(scratch, ignore_errors=True)  # datasets of an earlier run in the same work folder
    os.makedirs(scratch)
    seeds = module.prepare(scratch)
    for number, seed in enumerate(seeds):
        with open(os.path.join(corpus, f"seed-{number:03d}"), "wb") as handle:
            handle.write(seed)
    test = contract.checked(module.one_input, os.path.join(work, "crashes", f"{name}-"))
    for seed in seeds:  # warm-up: seeds obey the contract, and every lazy import and pool exists before the cap
        test(seed)
    limit = contract.cap_memory()
    print(f"fuzz {name}: {len(seeds)} seeds, address space capped at {limit >> 20} MiB", file=sys.stderr, flush=True)
    args = [sys.argv[0], corpus, f"-artifact_prefix={os.path.join(work, 'crashes', name)}-", f"-max_len={module.MAX_LEN}",
            "-timeout=10", "-print_final_stats=1", "-len_control=0", *flags]
    atheris.Setup(args, test)
    atheris.Fuzz()


def replay(name: str, paths: list[str], work: str) -> int:
    """Run saved inputs through one harness's contract, without fuzzing: 0 when all pass."""
    module = MODULES[name]
    scratch = os.path.join(work, "scratch", name)
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(scratch)
    module.prepare(scratch)
    test = contract.checked(module.one_input)
    failed = 0
    for path in paths:
        start = time.process_time()
        try:
            test(open(path, "rb").read())
            print(f"{path}: ok ({time.process_time() - start:.3f} s CPU)")
        except Exception as error:  # noqa: BLE001 - reported, then the next input
            print(f"{path}: {type(error).__name__}: {error}")
            failed += 1
    return 1 if failed else 0


def _crash_files(work: str, name: str) -> set[str]:
    return set(glob.glob(os.path.join(work, "crashes", f"{name}-crash-*")))


def _summary(name: str, log: str, status: int, elapsed: float, before: set[str]) -> dict:
    text = open(log, errors="replace").read() if os.path.exists(log) else ""
    runs = re.findall(r"stat::number_of_executed_units:\s+(\d+)", text) or re.findall(r"^#(\d+)\s", text, re.M)  # a crash prints no stats
    coverage = re.findall(r"cov: (\d+) ft: (\d+)", text)
    slowest = re.findall(r"stat::slowest_unit_time_sec:\s+(\d+)", text)
    rss = re.findall(r"stat::peak_rss_mb:\s+(\d+)", text)
    crashes = sorted(_crash_files(os.path.dirname(log), name) - before)  # this run's, not an earlier run's in the same folder
    return {"name": name, "runs": int(runs[-1]) if runs else None, "cov": int(coverage[-1][0]) if coverage else None,
            "ft": int(coverage[-1][1]) if coverage else None, "status": status, "crash": crashes[-1] if crashes else None,
            "seconds": round(elapsed, 1), "log": log, "slowest_s": int(slowest[-1]) if slowest else None,
            "peak_rss_mb": int(rss[-1]) if rss else None}


def run(names: list[str], work: str, flags: list[str]) -> list[dict]:
    """Fuzz each harness in a forked child, one after another; their summaries."""
    results = []
    for name in names:
        log = os.path.join(work, f"{name}.log")
        sys.stdout.flush()
        sys.stderr.flush()
        start = time.monotonic()
        before = _crash_files(work, name)
        pid = os.fork()
        if pid == 0:
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            try:
                _child(name, work, flags)
            except SystemExit as exit_:  # atheris ends a crashed run with SystemExit(-1)
                sys.stderr.flush()
                os._exit(1 if exit_.code else 0)
            except BaseException:  # noqa: BLE001 - a failing seed or preparation: report it, never fall back into the loop
                import traceback
                traceback.print_exc()
                sys.stderr.flush()
                os._exit(3)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        result = _summary(name, log, os.waitstatus_to_exitcode(status), time.monotonic() - start, before)
        print(f"{name:14s} runs={result['runs']} cov={result['cov']} ft={result['ft']} exit={result['status']} "
              f"{result['seconds']}s slowest={result['slowest_s']}s rss={result['peak_rss_mb']}MB"
              + (f" CRASH {result['crash']}" if result['crash'] else ""), flush=True)
        results.append(result)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fuzz.run", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"harnesses (default: all of {', '.join(HARNESSES)})")
    parser.add_argument("--smoke", action="store_true", help="each harness's SMOKE_RUNS inputs with seed 1 (deterministic)")
    parser.add_argument("--budget", default="60s", help="per harness: N executions, or Ns seconds (default 60s)")
    parser.add_argument("--max-seconds", type=int, default=None, help="with an execution budget: stop after this many seconds anyway")
    parser.add_argument("--work", default=None, help="folder for corpora, logs and crashes (default: a new temporary folder)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--replay", nargs="+", metavar="FILE", help="run these saved inputs through the one named harness")
    args = parser.parse_args(argv)
    unknown = [name for name in args.names if name not in HARNESSES]
    if unknown:
        parser.error(f"unknown harness {', '.join(unknown)}; known: {', '.join(HARNESSES)}")
    work = args.work or tempfile.mkdtemp(prefix="mixtrain-fuzz-")
    os.makedirs(work, exist_ok=True)
    if args.replay:
        if len(args.names) != 1:
            parser.error("--replay needs exactly one harness name")
        return replay(args.names[0], args.replay, work)
    names = args.names or list(HARNESSES)
    failed = False
    for name in names:
        flags = [f"-seed={args.seed}"]
        if args.smoke:
            flags.append(f"-runs={MODULES[name].SMOKE_RUNS}")
        elif args.budget.endswith("s"):
            flags.append(f"-max_total_time={int(args.budget[:-1])}")
        else:
            flags.append(f"-runs={int(args.budget)}")
            if args.max_seconds:
                flags.append(f"-max_total_time={args.max_seconds}")
        result = run([name], work, flags)[0]
        failed |= result["status"] != 0
    print(f"work folder: {work}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
