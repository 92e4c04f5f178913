"""Harness: LeRobot v3 metadata (meta/info.json, meta/stats.json and the episode index rows in
meta/episodes/*.parquet), as formats/sources/lerobot_v3 plans and loads them.

Input: a byte choosing the dataset (the product's sample writer's; the so100_tiny fixture, lerobot
0.4.4's own, when ../shared/fixtures is present), then a byte choosing the file and the mode: raw
bytes, structure-aware JSON edits (fuzz/jsonmut.py) or index-row edits (fuzz/surfaces.py).
Contract: plan, then expanding and loading the first episode, raise nothing but ConversionError,
within 1 s and 256 MiB per input (fuzz/contract.py).
"""

from __future__ import annotations

import os

from formats.sources.lerobot_v3.sample import SyntheticLeRobot, write_dataset
from fuzz.contract import fixtures_dir
from fuzz.source_plan import SourcePlan

MAX_LEN = 20_000
SMOKE_RUNS = 100
FILES = ["meta/info.json", "meta/stats.json", "meta/episodes/chunk-000/file-000.parquet"]
_PLAN = SourcePlan("lerobot_v3", {})


def prepare(work: str) -> list[bytes]:
    sample = os.path.join(work, "lerobot_sample")
    write_dataset(sample, SyntheticLeRobot(lengths=(12, 9)))
    _PLAN.add(sample, FILES)
    root = fixtures_dir()
    if root:
        _PLAN.add_copy(os.path.join(root, "lerobot_v3", "so100_tiny"), work, FILES)
    return _PLAN.seeds()


one_input = _PLAN.one_input
