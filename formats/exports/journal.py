"""Resuming an interrupted export: what each written group leaves in the staging folder, and what
the next run with the same command takes from it.

An export writes into a staging folder beside its output (`.NAME.mixtrain-export-<id>`). Beside
the LeRobot files, it keeps a journal under `_resume/` (removed before publication):

- `export.json`, written by the launcher before any group: the output it is for and the export's
  identity, a digest of the converter version, the layout and the options that shape the files,
  the input's metadata and the signature (size and mtime, or generation/etag) of every file of
  the input. Any change to any of them makes every recorded group useless.
- `groups/GGGGGG.json`, one per group, written by the worker right after the group's files: each
  file's staging-relative path, size and SHA-256, and the group's episode records (a table: what
  the dataset-wide `meta/` files are built from) as Arrow IPC bytes, so their types come back exactly.
- `plan/`, the run's writer for its workers (transforms/staged_plan.py: pickled, signed with a
  key made for the run that never leaves the job), written anew by each run and never resumed.

Both are sealed (the SHA-256 of their own canonical JSON). The next run takes a group when its
entry is whole, names this identity, and every file it lists is there at its size; a worker checks
the digests before the group's records are used. Everything else is written again, and the output
is byte-identical to one uninterrupted export's. The journal is JSON and Arrow: it is read back
from a folder others may write, and nothing in it is unpickled.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from typing import Any

import pyarrow as pa

from formats import storage
from formats.arrow_types import from_ipc, to_ipc
from formats.errors import FormatError
from formats.mixtrain import fingerprint, resume

__all__ = ["JOURNAL_DIR", "HEADER", "GROUPS_DIR", "identity", "write_header", "read_header", "record_group", "recorded_groups", "recorded_group",
           "check_group", "records_of", "records_bytes"]

JOURNAL_DIR = resume.RESUME_DIR  # the same name as a conversion's: resume.Lease renews `_resume/alive` in it
HEADER = f"{JOURNAL_DIR}/export.json"
PUBLISHING = f"{JOURNAL_DIR}/publishing"  # on an object store: the files are being moved into the output
GROUPS_DIR = f"{JOURNAL_DIR}/groups"
PLAN_DIR = f"{JOURNAL_DIR}/plan"  # the run's plan files for its workers (transforms/staged_plan.py), rewritten by each run
VERSION = 1
KIND = "mixtrain-export"


def _unsealed(data: bytes | None) -> dict | None:
    """The entry's fields when it parses, was written by this journal version and its seal matches; else None."""
    try:
        value = json.loads(data) if isinstance(data, bytes) else None
    except ValueError:
        return None
    if not isinstance(value, dict) or value.get("journal") != VERSION or value.get("kind") != KIND:
        return None
    body = {key: item for key, item in value.items() if key != "sha256"}
    return body if value.get("sha256") == resume.sealed(body)["sha256"] else None


def identity(dataset, layout: str, options: dict[str, Any]) -> str:
    """What the export's files depend on: converter version, layout, options and the input (its
    metadata and every file's signature, from one listing)."""
    import formats

    value = {"version": formats.__version__, "layout": layout, "options": options, "metadata": dataset.metadata,
             "input": storage.url_for(dataset.fs, dataset.root), "files": fingerprint.signatures(dataset.fs, dataset.root)}
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def write_header(fs, staging: str, *, output: str, export_identity: str, groups: int) -> None:
    value = {"journal": VERSION, "kind": KIND, "output": resume.output_identity(fs, output), "identity": export_identity,
             "groups": groups, "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    resume.put_whole(fs, storage.join(staging, HEADER), json.dumps(resume.sealed(value), sort_keys=True).encode())


def read_header(fs, staging: str) -> dict | None:
    """The staging folder's journal header, or None where it has none that parses and is sealed."""
    try:
        return _unsealed(fs.cat_file(storage.join(staging, HEADER)))
    except (OSError, FileNotFoundError):
        return None


def records_bytes(entry: dict) -> bytes:
    """A group entry's episode records as the Arrow IPC stream they were recorded as."""
    return base64.b64decode(entry["records"], validate=True)


def records_of(entry: dict) -> pa.Table:
    """The episode records a group entry holds (Arrow IPC, read; never unpickled)."""
    table = from_ipc(records_bytes(entry))
    if "episode_index" not in table.column_names or table.column("episode_index").type != pa.int64():
        raise ValueError("not the export's episode records")
    return table


def record_group(fs, staging: str, export_identity: str, group: int, records: pa.Table, files: list[str]) -> None:
    """Group `group` is written: its files' sizes and digests and its records, sealed, in one
    entry written whole (a kill leaves no half entry). `files`: staging-relative paths."""
    blob = to_ipc(records)
    listed = []
    for relative in files:
        size, sha = resume.digest(fs, storage.join(staging, relative))
        listed.append([relative, size, sha])
    value = {"journal": VERSION, "kind": KIND, "identity": export_identity, "group": int(group), "files": listed,
             "records": base64.b64encode(blob).decode()}
    resume.put_whole(fs, storage.join(staging, GROUPS_DIR, f"{group:06d}.json"), json.dumps(resume.sealed(value), sort_keys=True).encode())


def _relative_ok(relative: Any) -> bool:
    return (isinstance(relative, str) and bool(relative) and not relative.startswith("/") and "\\" not in relative
            and all(part not in ("", ".", "..") for part in relative.split("/")) and relative.split("/")[0] != JOURNAL_DIR)


def _entry_ok(value: dict, export_identity: str, groups: int) -> bool:
    try:
        group, files = value["group"], value["files"]
        return (value["identity"] == export_identity and resume.is_count(group) and group < groups and isinstance(files, list)
                and all(isinstance(f, list) and len(f) == 3 and _relative_ok(f[0]) and resume.is_count(f[1]) and resume.is_sha256(f[2])
                        for f in files)
                and isinstance(value["records"], str))
    except (KeyError, TypeError):
        return False


def _group_entry(data: bytes | None, name: str, export_identity: str, groups: int) -> dict | None:
    """The entry stored under `name`, when whole, of this identity, naming only paths inside the
    folder, and its records readable; else None."""
    value = _unsealed(data)
    if value is None or not _entry_ok(value, export_identity, groups) or name != f"{GROUPS_DIR}/{value['group']:06d}.json":
        return None
    try:
        records_of(value)
    except (pa.ArrowException, ValueError, TypeError, KeyError):
        return None
    return value


def recorded_groups(fs, staging: str, export_identity: str, groups: int) -> dict[int, dict]:
    """The groups an interrupted export of the same identity wrote whole: group -> entry. An entry
    that does not parse, is not sealed, names another identity or a path outside the folder, or
    lists a file that is missing or of another size is left out (its group is written again)."""
    root = staging.rstrip("/") + "/"
    sizes = {path[len(root):]: int(info.get("size") or 0) for path, info in fs.find(staging, detail=True).items()
             if info.get("type") != "directory" and path.startswith(root)}
    names = sorted(name for name in sizes if name.startswith(GROUPS_DIR + "/") and name.endswith(".json"))
    texts = fs.cat([storage.join(staging, name) for name in names], on_error="return") if names else {}
    found: dict[int, dict] = {}
    for name in names:
        value = _group_entry(texts.get(storage.join(staging, name)), name, export_identity, groups)
        if value is not None and all(sizes.get(relative) == size for relative, size, _ in value["files"]):
            found[value["group"]] = value
    return found


def recorded_group(fs, staging: str, export_identity: str, groups: int, group: int) -> dict | None:
    """One group's entry, read again on the worker that takes it (its files are then checked)."""
    name = f"{GROUPS_DIR}/{group:06d}.json"
    try:
        data = fs.cat_file(storage.join(staging, name))
    except (OSError, FileNotFoundError):
        return None
    return _group_entry(data, name, export_identity, groups)


def check_group(fs, staging: str, entry: dict) -> None:
    """Every file of a recorded group has its recorded digest (checked on a worker before its
    records are used). A file changed since is one error naming it; the entry is removed first,
    so that the next run writes the group again."""
    for relative, size, sha in entry["files"]:
        path = storage.join(staging, relative)
        try:
            found = resume.digest(fs, path)
        except FileNotFoundError:
            found = None
        if found != (size, sha):
            try:
                fs.rm(storage.join(staging, GROUPS_DIR, f"{entry['group']:06d}.json"))
            except (OSError, FileNotFoundError):
                pass
            raise FormatError(f"{path}: changed since the interrupted export wrote it (its SHA-256 differs); run the same command "
                              "again to write its group anew")
