"""Fingerprints for --incremental: what a unit of the source (an episode, a scene, a TFRecord
shard) was converted from, so a nightly rerun can tell unchanged units from changed ones.

A unit's fingerprint hashes: the run's context (converter version, the options that shape the
output, the output schema), the files every unit depends on (e.g. info.json, manifest.json,
features.json; for L5Kit every file), the unit's own address in the source (its ref: offsets,
lengths, tasks...), and the signature of each file the unit reads (size plus mtime on a local
disk; generation, etag or md5 on object stores). One recursive listing of the source gives every
signature, so planning costs one listing, not a request per file.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import json
from collections.abc import Callable
from typing import Any

import fsspec
import pyarrow.parquet as pq

from formats import mixtrain, storage
from formats.mixtrain import publish

__all__ = ["Unit", "Fingerprints", "signatures", "fingerprints", "context_hash", "reusable"]


@dataclasses.dataclass(frozen=True)
class Unit:
    """A unit of incremental work: `key` names it; its sequences are the one whose id is `key`,
    or every id starting with `prefix`; `files` are the paths (files or folders) it reads."""

    key: str
    files: tuple[str, ...]
    prefix: str | None = None

    def owns(self, sequence_id: str) -> bool:
        return sequence_id.startswith(self.prefix) if self.prefix is not None else sequence_id == self.key


def _signature(info: dict) -> str:
    for key in ("generation", "etag", "md5Hash", "ETag"):
        if info.get(key):
            return f"{info.get('size')}:{info[key]}"
    return f"{info.get('size')}:{info.get('mtime', info.get('updated', info.get('LastModified', '')))}"


def signatures(fs: fsspec.AbstractFileSystem, root: str) -> dict[str, str]:
    """Relative path -> signature of every file under root (one recursive listing)."""
    listing = fs.find(root, detail=True)
    return {path[len(root) + 1:]: _signature(info) for path, info in listing.items() if info.get("type") != "directory"}


# One encoder for every digest: json.dumps with options builds a new one per call, which was a
# third of planning at 100,000 episodes (a digest per unit). The JSON text is the same.
_ENCODER = json.JSONEncoder(sort_keys=True, default=str)


def _digest(value: Any) -> str:
    return hashlib.sha256(_ENCODER.encode(value).encode()).hexdigest()


def context_hash(converter_version: str, options: dict, columns: list) -> str:
    """What every unit's fingerprint shares: a change here reconverts everything."""
    schema = [(spec.name, spec.kind, str(spec.arrow_type), spec.meta) for spec in columns]
    return _digest({"converter": converter_version, "options": options, "schema": schema})


def fingerprints(units: list[tuple[Unit, Any]], signed: dict[str, str], shared_files: list[str], context: str,
                 names: list[str] | None = None) -> dict[str, dict]:
    """unit key -> {"fingerprint", "prefix"} for each (unit, ref) pair (`names`: sorted(signed), if already sorted)."""
    names = sorted(signed) if names is None else names  # a folder's files are one contiguous range of the sorted names
    base = _digest({"context": context, "shared": _signed(shared_files, signed, names)})
    return {unit.key: {"fingerprint": _digest({"base": base, "ref": repr(ref), "files": _signed(unit.files, signed, names)}),
                       "prefix": unit.prefix}
            for unit, ref in units}


@dataclasses.dataclass(frozen=True)
class Fingerprints:
    """What a run records for the next --incremental run (`_fingerprints.json`: the context and
    unit key -> {"fingerprint", "prefix"}), computed piece by piece as it is written rather than
    held: a million units' fingerprints and Unit objects took 480 MB on the launcher. `known`
    holds them all when planning needed them (--incremental compares them with the previous run's).
    A piece's units come from `source.incremental_units` on that piece's refs, as the whole list would give them."""

    context: str
    source: Any  # the Source whose incremental_units pairs each ref with its unit
    refs: tuple
    signed: dict  # relative path -> signature of every file of the source (`signatures`)
    known: dict | None = None

    def pieces(self, size: int = 100_000):
        """Dicts of unit key -> {"fingerprint", "prefix"}, in the refs' order, `size` units each."""
        if self.known is not None:
            items = list(self.known.items())
            for start in range(0, len(items), size):
                yield dict(items[start:start + size])
            return
        names = sorted(self.signed)
        for start in range(0, len(self.refs), size):
            units, shared = self.source.incremental_units(list(self.refs[start:start + size]))
            yield fingerprints(units, self.signed, shared, self.context, names)

    @property
    def units(self) -> dict:
        if self.known is not None:
            return self.known
        merged: dict = {}
        for piece in self.pieces():
            merged.update(piece)
        return merged


def _signed(paths, signed: dict[str, str], names: list[str]) -> list:
    """(path, signature) of each file; a folder stands for every file under it ("" for all)."""
    found = []
    for path in sorted(paths):
        if path in signed:
            found.append((path, signed[path]))
            continue
        prefix = path.rstrip("/") + "/" if path else ""
        for name in names[bisect.bisect_left(names, prefix):]:
            if not name.startswith(prefix):
                break
            found.append((name, signed[name]))
    return found


def reusable(fs: fsspec.AbstractFileSystem, root: str, units: list, current: dict, context: str | None = None) -> dict | None:
    """What an incremental run can take from the published dataset: the units whose fingerprint
    did not change and the ids of their sequences. None when there is nothing to compare with.

    `context_changed` says that the previous output was written with another `context` (other
    options, another converter version or schema): then no unit can be reused, and the user
    should be told why rather than find a full conversion where they expected an incremental one.
    The standalone layout's and the lake tables' (`formats.mixtrain.tables.reusable` picks Lance's)."""
    if not fs.exists(storage.join(root, mixtrain.SIDECAR)) or not fs.exists(storage.join(root, mixtrain.FINGERPRINTS_FILE)):
        return None
    text = fs.cat_file(storage.join(root, mixtrain.FINGERPRINTS_FILE)).decode() or "{}"  # empty: nothing recorded
    same, owns, context_changed = unchanged(units, current, json.loads(text), context)
    sidecar = mixtrain.read_sidecar(fs, root)
    published = publish.published_root(fs, root)
    ids = set()
    for shard in sidecar.get("shards", []):
        with storage.arrow_input(fs, storage.join(published, shard)) as handle:
            storage.check_parquet_footer(handle, storage.join(published, shard))
            ids.update(filter(owns, pq.read_table(handle, columns=["sequence_id"]).column("sequence_id").to_pylist()))
    return {"units": same, "ids": ids, "shards": sidecar.get("shards", []), "context_changed": context_changed,
            "root_url": storage.url_for(fs, published), "created_at": sidecar.get("created_at")}


def unchanged(units: list, current: dict, recorded: dict, context: str | None) -> tuple[set, Callable[[str], bool], bool]:
    """Against the fingerprints a previous run recorded: the keys of the units that did not
    change, a test of whether a sequence id belongs to one of them, and whether the previous run's
    context differed (then nothing matches, and the user is told why)."""
    previous = recorded.get("units", {})
    same = {key for key, value in current.items() if previous.get(key, {}).get("fingerprint") == value["fingerprint"]}
    owners = [unit for unit, _ in units if unit.key in same]
    exact = {unit.key for unit in owners if unit.prefix is None}
    prefixes = tuple(unit.prefix for unit in owners if unit.prefix is not None)

    def owns(sequence_id: str) -> bool:
        return sequence_id in exact or bool(prefixes and sequence_id.startswith(prefixes))

    return same, owns, context is not None and bool(previous) and recorded.get("context") != context
