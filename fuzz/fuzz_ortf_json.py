"""Harness: ORTF v0.2 metadata (meta/manifest.json, meta/episodes.parquet, meta/tasks.jsonl,
meta/stats.json), as formats/sources/ortf plans and loads them.

Input: a byte choosing the file and the mode (raw bytes, structure-aware JSON edits from
fuzz/jsonmut.py, or index-row edits from fuzz/surfaces.py) of the product's ORTF sample (no ORTF
fixture exists). Contract: plan, then expanding and loading the first episode, raise nothing but
ConversionError, within 1 s and 256 MiB per input (fuzz/contract.py).
"""

from __future__ import annotations

import os

from formats.sources.ortf.sample import write_dataset
from fuzz.source_plan import SourcePlan

MAX_LEN = 20_000
SMOKE_RUNS = 100
FILES = ["meta/manifest.json", "meta/episodes.parquet", "meta/tasks.jsonl", "meta/stats.json"]
_PLAN = SourcePlan("ortf", {})


def prepare(work: str) -> list[bytes]:
    sample = os.path.join(work, "ortf_sample")
    write_dataset(sample)
    _PLAN.add(sample, FILES)
    return _PLAN.seeds()


one_input = _PLAN.one_input
