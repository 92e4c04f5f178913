"""Harness: RLDS/TFDS metadata (dataset_info.json, features.json), as formats/sources/rlds plans
them, then indexes the first shard and loads its first record.

Input: a byte choosing the dataset (the product's RLDS sample; the bridge fixture, written by
TFDS, when ../shared/fixtures is present), then a byte choosing the file and the mode (raw bytes or
structure-aware JSON edits from fuzz/jsonmut.py). Contract: nothing but ConversionError escapes,
within 1 s and 256 MiB per input (fuzz/contract.py).
"""

from __future__ import annotations

import glob
import os

from formats.sources.rlds.sample import write_dataset
from fuzz.contract import fixtures_dir
from fuzz.source_plan import SourcePlan

MAX_LEN = 40_000
SMOKE_RUNS = 100
FILES = ["dataset_info.json", "features.json"]
_PLAN = SourcePlan("rlds", {"fps": 10})


def prepare(work: str) -> list[bytes]:
    sample = os.path.join(work, "rlds_sample", "1.0.0")
    write_dataset(sample)
    _PLAN.add(sample, FILES)
    root = fixtures_dir()
    bridge = sorted(glob.glob(os.path.join(root, "rlds", "*", "*"))) if root else []
    if bridge:
        os.makedirs(os.path.join(work, "bridge"), exist_ok=True)
        _PLAN.add_copy(bridge[0], os.path.join(work, "bridge"), FILES)
    return _PLAN.seeds()


one_input = _PLAN.one_input
