"""The source registry: format id -> module with `detect`, `plan`, `load`."""

from __future__ import annotations

import types

import fsspec

from formats import l5kit, lerobot_v3, ortf, rlds
from formats.errors import FormatError

__all__ = ["SOURCES", "get", "detect", "sequence_count"]

SOURCES: dict[str, types.ModuleType] = {lerobot_v3.FORMAT: lerobot_v3, ortf.FORMAT: ortf, l5kit.FORMAT: l5kit, rlds.FORMAT: rlds}


def get(name: str) -> types.ModuleType:
    if name not in SOURCES:
        raise FormatError(f"unknown source format {name!r}; known: {', '.join(sorted(SOURCES))}")
    return SOURCES[name]


def detect(fs: fsspec.AbstractFileSystem, root: str) -> str:
    """The id of the one format whose `detect` accepts root; a clear error for none or several."""
    if not fs.exists(root):
        raise FormatError(f"{root}: input not found")
    found = [name for name, module in SOURCES.items() if module.detect(fs, root)]
    if not found:
        versions = sorted(path.rstrip("/").rsplit("/", 1)[-1] for path in fs.ls(root, detail=False)
                          if fs.isdir(path) and fs.exists(f"{path.rstrip('/')}/dataset_info.json"))
        if versions:
            raise FormatError(f"{root}: a TFDS dataset folder; pass one of its version folders as --input "
                              f"({', '.join(f'{root}/{v}' for v in versions)})")
        raise FormatError(
            f"{root}: not a dataset of a known format ({', '.join(sorted(SOURCES))}); "
            "for LeRobot v3 expected meta/info.json, for L5Kit a zarr group with scenes/.zarray, "
            "for RLDS a TFDS version folder with dataset_info.json and features.json, for ORTF meta/manifest.json"
        )
    if len(found) > 1:
        raise FormatError(f"{root}: looks like several formats ({', '.join(found)}); pass --source")
    return found[0]


def sequence_count(refs: list) -> int | None:
    """How many sequences `refs` hold: one per ref, or a ref's `sequence_count` (RLDS: a shard's
    records), None when some ref cannot tell before it is read."""
    counts = [getattr(ref, "sequence_count", 1) for ref in refs]
    return None if None in counts else sum(counts)
