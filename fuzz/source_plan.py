"""What the three source-metadata harnesses share: rewrite one metadata file of a real dataset,
plan the dataset, and load its first planned sequence (where the index rows are used).

Contract (each harness states it too): `Source.plan`, `open`, `expand` and `load` raise nothing
but ConversionError, within 1 s and 256 MiB (fuzz/contract.py).
"""

from __future__ import annotations

import os
import shutil

from formats import sources, storage
from fuzz.surfaces import Surface


class SourcePlan:
    """The datasets (one Surface each) of one source format and the options to plan them with."""

    def __init__(self, source: str, options: dict) -> None:
        self.source, self.options = source, options
        self.surfaces: list[Surface] = []

    def add(self, root: str, files: list[str]) -> None:
        self.surfaces.append(Surface(root, [name for name in files if os.path.exists(os.path.join(root, name))]))

    def add_copy(self, fixture: str, work: str, files: list[str]) -> None:
        """A fixture copied into `work` first (fixtures are read-only and shared)."""
        target = os.path.join(work, os.path.basename(fixture.rstrip("/")))
        shutil.copytree(fixture, target)
        self.add(target, files)

    def seeds(self) -> list[bytes]:
        return [bytes([number]) + seed for number, surface in enumerate(self.surfaces) for seed in surface.seeds()]

    def one_input(self, data: bytes) -> None:
        if len(data) < 2:
            return
        surface = self.surfaces[data[0] % len(self.surfaces)]
        change = surface.mutated(data[1:])
        if change is None:
            return
        name, content = change
        surface.apply(name, content)
        try:
            source = sources.get(self.source)
            fs, root = storage.open_root(surface.root)
            meta, refs = source.plan(fs, root, dict(self.options))
            if refs:
                reader = source.open(fs, root, meta)
                for ref in reader.expand(refs[0]):
                    reader.load(ref)
                    break
        finally:
            surface.restore(name)
