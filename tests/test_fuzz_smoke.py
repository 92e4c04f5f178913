"""Every fuzz harness (fuzz/, docs/fuzzing.md), briefly and deterministically: libFuzzer seed 1,
each harness's SMOKE_RUNS inputs, one subprocess for all (libFuzzer ends the process it runs in,
so `fuzz.run` forks a child per harness after importing the product once). A harness whose seeds
or first mutations break its contract (an exception outside ConversionError, over 1 s of CPU,
over 256 MiB) fails here, with the crashing input's path in the message."""

import glob
import importlib.util
import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("atheris") is None,
                                reason="atheris is not installed (pip install 'mixtrain-convert[test]')")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Read from the files, not imported: importing fuzz.run would instrument the product in this process.
SMOKE_RUNS = {os.path.basename(path)[5:-3]: int(re.search(r"^SMOKE_RUNS = (\d+)$", open(path).read(), re.M).group(1))
              for path in glob.glob(os.path.join(ROOT, "fuzz", "fuzz_*.py"))}


def test_every_harness_runs_its_smoke_inputs_without_a_crash(tmp_path):
    result = subprocess.run([sys.executable, "-m", "fuzz.run", "--smoke", "--work", str(tmp_path)], cwd=ROOT,
                            capture_output=True, text=True, timeout=240)
    lines = {match.group(1): match.group(0) for match in re.finditer(r"^(\w+)\s+runs=.*$", result.stdout, re.M)}
    assert sorted(lines) == sorted(SMOKE_RUNS), result.stdout + result.stderr[-3000:]
    for name, line in lines.items():
        runs = re.search(r"runs=(\d+) ", line)  # libFuzzer counts the seeds' first runs too: a few more
        assert runs and int(runs.group(1)) >= SMOKE_RUNS[name] and "exit=0" in line and "CRASH" not in line, \
            f"{line}\n{open(tmp_path / f'{name}.log', errors='replace').read()[-3000:]}"
    assert result.returncode == 0
