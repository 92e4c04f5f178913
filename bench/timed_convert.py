"""`python -m pipelines.convert` with the moments a scaling bench needs, written as JSON at exit.

    MIXTRAIN_MARKS=FILE MIXTRAIN_T0=EPOCH python bench/timed_convert.py --input=... --output=...

The launcher's progress receiver (pipelines/progress.py) already hears every worker's report; this
stamps when the first and the last converted sequence and shard were reported, relative to
MIXTRAIN_T0 (when the bench started the process). A measuring tool, not part of the product.
"""

from __future__ import annotations

import json
import os
import sys
import time

T0 = float(os.environ.get("MIXTRAIN_T0") or time.time())
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pipelines  # noqa: E402
from pipelines import progress  # noqa: E402

MARKS: dict[str, float] = {}
_add = progress.Progress.add


def _stamped(self, counts: dict) -> None:
    now = round(time.time() - T0, 3)
    for key in ("sequences", "shards"):
        if counts.get(key):
            MARKS.setdefault(f"first_{key[:-1]}", now)
            MARKS[f"last_{key[:-1]}"] = now
    _add(self, counts)


def _exit(code: int, exit_without_teardown=pipelines.exit_without_teardown) -> None:
    MARKS["exit"] = round(time.time() - T0, 3)
    with open(os.environ["MIXTRAIN_MARKS"], "w") as handle:
        json.dump(MARKS, handle)
    exit_without_teardown(code)


progress.Progress.add = _stamped
pipelines.exit_without_teardown = _exit
from pipelines import convert  # noqa: E402 - after the patch: it imports exit_without_teardown by name

MARKS["imports_done"] = round(time.time() - T0, 3)
sys.argv[0] = "pipelines.convert"
convert.main()
