"""The documentation's numbers about the suite are the suite's: every "`tests/x.py` (N" in the
README or docs/ is the number of tests pytest collects from that file, and the hostile recipes are
counted as recipes."""

from __future__ import annotations

import collections
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
COUNTED = re.compile(r"`(tests/[\w/]+\.py)` \((\d+)\b")


def _documentation() -> str:
    return "\n".join(path.read_text() for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])


def test_documented_test_counts_are_what_pytest_collects():
    claims = {path: int(count) for path, count in COUNTED.findall(_documentation())}
    assert len(claims) >= 4, claims  # docs/reliability.md names its test files with counts
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *claims],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    collected = collections.Counter(line.split("::")[0] for line in done.stdout.splitlines() if "::" in line)
    assert dict(collected) == claims


def test_documentation_counts_the_hostile_metadata_recipes():
    from tests.pipelines import test_hostile_metadata

    found = re.findall(r"(\d+) hostile metadata recipes", _documentation())
    assert [int(n) for n in found] == [len(test_hostile_metadata.RECIPES)]
