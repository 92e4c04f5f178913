"""The source registry: format id -> `Source` (formats/source.py). The built-in formats register
themselves when imported here; another format registers with `register` (from its own module,
a plugin's entry point in the `mixtrain_convert.sources` group, or a test) without editing this file."""

from __future__ import annotations

import contextlib
import importlib
import logging
from collections.abc import Iterator
from importlib import metadata

import fsspec

from formats.errors import FormatError
from formats.source import Source, SourceRef

__all__ = ["SOURCES", "register", "unregister", "registered", "get", "detect", "sequence_count"]

SOURCES: dict[str, Source] = {}
ENTRY_POINT_GROUP = "mixtrain_convert.sources"


def register(source: Source) -> Source:
    """Make `source` known to --source, auto-detection, convert, validate and the contract tests."""
    if source.id in SOURCES and type(SOURCES[source.id]) is not type(source):
        raise ValueError(f"source id {source.id!r} is already registered by {type(SOURCES[source.id]).__name__}")
    SOURCES[source.id] = source
    return source


def unregister(source_id: str) -> None:
    SOURCES.pop(source_id, None)


@contextlib.contextmanager
def registered(source: Source) -> Iterator[Source]:
    """`source` registered for the duration of a with block (tests)."""
    register(source)
    try:
        yield source
    finally:
        unregister(source.id)


def get(name: str) -> Source:
    if name not in SOURCES:
        raise FormatError(f"unknown source format {name!r}; known: {', '.join(sorted(SOURCES))}")
    return SOURCES[name]


def detect(fs: fsspec.AbstractFileSystem, root: str) -> str:
    """The id of the one format whose `detect` accepts root; a clear error for none or several."""
    if not fs.exists(root):
        raise FormatError(f"{root}: input not found")
    found = [name for name, source in SOURCES.items() if source.detect(fs, root)]
    if not found:
        versions = sorted(path.rstrip("/").rsplit("/", 1)[-1] for path in fs.ls(root, detail=False)
                          if fs.isdir(path) and fs.exists(f"{path.rstrip('/')}/dataset_info.json"))
        if versions:
            raise FormatError(f"{root}: a TFDS dataset folder; pass one of its version folders as --input "
                              f"({', '.join(f'{root}/{v}' for v in versions)})")
        raise FormatError(
            f"{root}: not a dataset of a known format ({', '.join(sorted(SOURCES))}); "
            + ", ".join(f"for {source.expects}" for source in SOURCES.values() if source.expects)
        )
    if len(found) > 1:
        raise FormatError(f"{root}: looks like several formats ({', '.join(found)}); pass --source")
    return found[0]


def sequence_count(refs: list[SourceRef]) -> int | None:
    """How many sequences `refs` hold, None when some ref cannot tell before it is read."""
    counts = [ref.sequence_count for ref in refs]
    return None if None in counts else sum(counts)


BUILTIN = ("formats.lerobot_v3", "formats.ortf", "formats.l5kit", "formats.rlds")


def _register_builtins() -> None:
    """The built-in formats, then any plugin's: each registers itself when imported."""
    for module in BUILTIN:
        importlib.import_module(module)
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            entry.load()
        except Exception as error:  # noqa: BLE001 - a broken plugin must not break every command
            logging.getLogger(__name__).warning("source plugin %s could not be loaded (left out): %s: %s", entry.value,
                                                type(error).__name__, error)


_register_builtins()
