"""Synthetic datasets written the way each format's own tools write them, apart from the readers:
for the tests, the benches and `python -m pipelines.make_sample`. Never imported by a conversion.

One registry, keyed by source id: `SAMPLES[id]` is a `Sample` (how to write a small dataset of
that format, and what converting it needs). The contract tests (tests/contract.py) run over every registered source with its sample; a new
source registers its sample with `register` beside its reader (or from a test).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from formats.sources import Registry

__all__ = ["Sample", "SAMPLES", "register", "unregister", "get"]


@dataclasses.dataclass(frozen=True)
class Sample:
    """How to write datasets of one source format.

    `small(path)` writes a few short sequences with every kind of column the format has (the
    contract tests' input) and returns the writer's truth or None; `bundled(path, episodes)` writes
    the `make_sample` dataset and returns what it wrote in words ("an ortf sample with 12 episodes
    (337 steps)"); `convert_args` are command-line options converting either needs;
    `bundled_choices` names the keyword options `bundled` also takes, each with its choices (the
    first is the default): `make_sample` offers them as options of this format only.
    """

    source: str
    small: Callable[[str], Any]
    bundled: Callable[..., str]
    convert_args: tuple[str, ...] = ()
    bundled_choices: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)


# The built-in writers (sources/<format>/sample.py) register themselves when imported, on first
# use of the registry (ORTF's writer imports LeRobot's frames: no cycle through this package).
_REGISTRY = Registry(("formats.sources.lerobot_v3.sample", "formats.sources.lerobot_v2.sample", "formats.sources.ortf.sample",
                      "formats.sources.l5kit.sample", "formats.sources.rlds.sample"))


def register(sample: Sample) -> Sample:
    _REGISTRY.add(sample.source, sample)
    return sample


def unregister(source: str) -> None:
    _REGISTRY.remove(source)


__getattr__ = _REGISTRY.module_attribute("SAMPLES", __name__)


def get(source: str) -> Sample:
    known = _REGISTRY.all()
    if source not in known:
        raise KeyError(f"no sample writer for source {source!r}; known: {', '.join(sorted(known))}")
    return known[source]
