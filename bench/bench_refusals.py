"""How fast the command line refuses (issue 41: what it can refuse without data < 0.5 s on 2 cores;
what needs the data without waiting for Beam's import).

    python bench/bench_refusals.py [--repeat=5]

Times a fresh `python -m pipelines.convert` process for each refusal (interpreter start included),
median of --repeat runs, against `--help` measured in the same run (the floor: the interpreter and
the option parser), and prints each as seconds and as a ratio to that floor.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _time(args: list[str], repeat: int) -> tuple[float, int]:
    times, code = [], 0
    for _ in range(repeat):
        started = time.perf_counter()
        code = subprocess.run([sys.executable, "-m", "pipelines.convert", *args], cwd=ROOT, capture_output=True).returncode
        times.append(time.perf_counter() - started)
    return statistics.median(times), code


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    repeat = parser.parse_args().repeat
    with tempfile.TemporaryDirectory() as folder:
        src, out = pathlib.Path(folder, "src"), pathlib.Path(folder, "published")
        (src / "meta").mkdir(parents=True)
        out.mkdir()
        (out / "mixtrain.json").write_text("{}")
        sample, notes = pathlib.Path(folder, "lerobot"), pathlib.Path(folder, "notes")
        notes.mkdir()
        (notes / "NOTES.md").write_text("mine")
        subprocess.run([sys.executable, "-m", "pipelines.make_sample", str(sample), "--episodes=4"], cwd=ROOT, check=True,
                       capture_output=True)
        cases = {
            "--help (floor)": ["--help"],
            "unknown option": [f"--input={src}", f"--output={folder}/o", "--num_workrs=2"],
            "missing input": [f"--input={folder}/nope", f"--output={folder}/o"],
            "existing output": [f"--input={src}", f"--output={out}"],
            "local path, DataflowRunner": [f"--input={src}", "--output=gs://b/o", "--runner=DataflowRunner"],
            "Dataflow without --project": ["--input=gs://b/i", "--output=gs://b/o", "--runner=DataflowRunner"],
            "--detach, local runner": [f"--input={src}", f"--output={folder}/o", "--detach"],
            "a crf the codec lacks": [f"--input={src}", f"--output={folder}/o", "--video_crf=99"],
            "hf:// without the hub extra": ["--input=hf://lerobot/pusht", f"--output={folder}/o"],
            "folder not a dataset": [f"--input={sample}", f"--output={notes}"],
            # These need the data (the early planner reads it; the answer does not wait for Beam):
            "--fps on a LeRobot dataset": [f"--input={sample}", f"--output={folder}/o", "--fps=10"],
            "--video_codec, every camera copied": [f"--input={sample}", f"--output={folder}/o", "--video_codec=hevc"],
        }
        floor = None
        print(f"{'refusal':32} {'exit':>4} {'seconds':>8} {'x --help':>9}")
        for name, args in cases.items():
            seconds, code = _time(args, repeat)
            floor = floor or seconds
            print(f"{name:32} {code:>4} {seconds:8.3f} {seconds / floor:8.2f}x")


if __name__ == "__main__":
    main()
