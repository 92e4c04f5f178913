"""Table formats: how a finished, staged Mixtrain dataset becomes the published one.

Every run stages the complete standalone layout first (data/*.parquet shards, files/ videos,
stats.json, _errors.jsonl, _fingerprints.json); only the last step differs by table format. A
publisher receives that staging folder and makes it the output: `parquet` moves it into place
with mixtrain.json (the standalone layout, `formats.mixtrain.publish.publish`), a lake format commits the staged
shards to a table whose `mixtrain` property holds the same JSON. One registry, one signature, so
the publish step names no format and a new format is one `register` call.

Lake modules (pyiceberg, deltalake) are imported only when their format is used.
A format may also register a per-shard step (`stage_shard`), run by the worker that wrote a staged
shard: lance writes that shard's rows as fragments there, in parallel, and its publisher only
commits them.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Protocol

from formats.mixtrain import fingerprint
from formats.mixtrain import publish as standalone  # `publish` below is the registry's

__all__ = ["DEFAULT", "TableSettings", "Publisher", "register", "publisher_for", "names", "publish", "stage_shard", "reusable"]

DEFAULT = "parquet"


@dataclasses.dataclass(frozen=True)
class TableSettings:
    """What a publisher needs besides the staged files (picklable: it travels to the worker that publishes).

    format: the table format name (a key of the registry).
    run_id: this run's id (names the run's folders and the lake commit).
    incremental: --incremental was given (commit only what changed against the current table).
    catalog: lake catalog: "" for the embedded default under the output, else a pyiceberg-style
      catalog name or URI (Iceberg).
    table: the table's name in the catalog (Iceberg "namespace.table").
    partition_by: scalar columns to partition by (lake formats that support it).
    base: the table state this run planned against (Iceberg snapshot id, Delta version; "" for
      none): a commit refuses to land on another writer's newer state.
    """

    format: str = DEFAULT
    run_id: str = ""
    incremental: bool = False
    catalog: str = ""
    table: str = ""
    partition_by: tuple[str, ...] = ()
    video_storage: str = ""  # lance: "blob" (MP4 bytes in the table, the default) or "reference" (paths)
    base: str = ""


class Publisher(Protocol):
    def __call__(self, fs, staging: str, output: str, sidecar: dict, settings: TableSettings) -> None:
        """Publish the staged dataset at `staging` (fs paths, no protocol) to `output` with metadata
        `sidecar` (the mixtrain.json content). Raise ConversionError (one line) if it cannot; the
        previous published dataset must then stay current and readable."""


def _publish_parquet(fs, staging: str, output: str, sidecar: dict, settings: TableSettings) -> None:
    """The standalone layout: staged folder moved into place, mixtrain.json last."""
    standalone.publish(fs, staging, output, sidecar)


# name -> a Publisher, or "module:function" imported on first use (heavy lake libraries).
_REGISTRY: dict[str, Publisher | str] = {DEFAULT: _publish_parquet, "iceberg": "formats.mixtrain.tables.iceberg:publish",
                                         "delta": "formats.mixtrain.tables.delta:publish", "lance": "formats.mixtrain.tables.lance:publish_table"}


# name -> a step the worker that wrote a shard runs on it (optional): a format whose rows can be
# written in parallel prepares them there, and its publisher only commits (lance: fragments).
_SHARD_STEPS: dict[str, str] = {"lance": "formats.mixtrain.tables.lance:stage_shard"}


def stage_shard(fs, staging: str, shard: str, video_columns: list[str], settings: TableSettings | None) -> None:
    """Run the table format's per-shard step on a shard just written under `staging` (if it has one)."""
    entry = _SHARD_STEPS.get((settings or TableSettings()).format)
    if entry is not None:
        module, function = entry.split(":")
        getattr(importlib.import_module(module), function)(fs, staging, shard, video_columns, settings)


def register(name: str, publisher: Publisher | str) -> None:
    """Add a table format: a Publisher, or "package.module:function" naming one (imported lazily)."""
    _REGISTRY[name] = publisher


def names() -> list[str]:
    return sorted(_REGISTRY)


def publisher_for(name: str) -> Publisher:
    entry = _REGISTRY.get(name)
    if entry is None:
        raise KeyError(f"unknown table format {name!r} (known: {', '.join(names())})")
    if isinstance(entry, str):
        module, function = entry.split(":")
        entry = _REGISTRY[name] = getattr(importlib.import_module(module), function)
    return entry


def reusable(fs, root: str, units: list, current: dict, context: str | None = None) -> dict | None:
    """What --incremental can take from the published output at `root` (`fingerprint.reusable`):
    a Lance dataset keeps its fingerprints in its own metadata, every other layout in _fingerprints.json."""
    from formats.mixtrain.tables import lance

    if lance.is_dataset(fs, root):
        return lance.reusable(fs, root, units, current, context)
    return fingerprint.reusable(fs, root, units, current, context)


def publish(fs, staging: str, output: str, sidecar: dict, settings: TableSettings | None = None) -> None:
    """Publish with the publisher of `settings.format` (the standalone layout by default)."""
    settings = settings or TableSettings()
    publisher_for(settings.format)(fs, staging, output, sidecar, settings)


