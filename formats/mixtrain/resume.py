"""Resuming an interrupted conversion: what a run records as it goes, and what the next run with
the same command takes from it.

A run's staging folder (`publish.staging_root`, or a lake table's run folder) holds, beside the
rows and files it writes, a journal under `_resume/`:

- `run-NNNN.json`, one per run that worked in the folder (the first, then each resumption, NNNN
  its generation), written by the launcher before any worker starts: the output, the context hash
  (converter version, the options that shape the output, the schema:
  `formats.mixtrain.fingerprint.context_hash`), the options as recorded, when it started, and the
  fingerprint of every unit it was to convert (the one `--incremental` keeps).
- `done/<name>.json`, one per spill file, written by the worker right after it
  (`transforms/write.py`): the spill file's size and SHA-256, and for each of its rows the sequence
  id, its size, the statistics computed upstream, its video notes and every file the row names
  (size and SHA-256). A row is recorded only once it and its files are on disk.
- `tallies/<name>.json`, for a unit the plan could not count (RLDS shards): how many sequences a
  worker found in it.

The next run takes a unit from the journal when the run that recorded it had the unit's current
fingerprint (same inputs, options, converter) and recorded every sequence of it, and every file
recorded for them is in the folder with its recorded size (`plan`); the digests are checked on a
worker before the rows are used (`transforms/resume.py`). Anything else is converted again. The
journal is JSON: it is read back from a folder others may write, and nothing in it is unpickled.
"""

from __future__ import annotations

import base64
import bisect
import dataclasses
import hashlib
import json
import os
import time
import uuid
from typing import Any

import numpy as np

from formats import storage
from formats.mixtrain import FILES_DIR, publish
from formats.mixtrain.stats import ColumnStats

__all__ = ["RESUME_DIR", "SPILL_DIR", "put_whole", "sealed", "is_count", "is_sha256",
           "clear", "forget", "tidy", "Journal", "Resumption", "digest", "write_entry", "write_tally",
           "write_header", "read_journal", "interrupted", "Lease", "check_no_leased_run", "collect_leftovers", "output_identity",
           "plan", "options_changed", "encode_stats", "decode_stats", "describe"]

RESUME_DIR = "_resume"
SPILL_DIR = "_rows"  # the spilled rows (transforms/write.py), which journal entries stand on
DONE_DIR = f"{RESUME_DIR}/done"
TALLY_DIR = f"{RESUME_DIR}/tallies"
VERSION = 1
_CLAIM = (publish.OWNER_FILE, publish.LOCK_FILE)  # the run's claim on its folder, never cleared
_CHUNK = 1 << 20
_NUMERIC_KINDS = "biuf"


def digest(fs, path: str) -> tuple[int, str]:
    """(size, SHA-256 hex) of a file, read in 1 MB pieces."""
    hasher, size = hashlib.sha256(), 0
    with fs.open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            hasher.update(chunk)
            size += len(chunk)
    return size, hasher.hexdigest()


def put_whole(fs, path: str, data: bytes) -> None:
    """Written whole or not at all: a local file through a renamed temporary (a kill mid-write leaves
    no half entry under the final name); an object store's put is atomic already."""
    local = storage.local_path(fs, path)
    if local is None:
        fs.pipe_file(path, data)
        return
    os.makedirs(os.path.dirname(local), exist_ok=True)
    temporary = f"{local}.tmp-{os.getpid()}"
    with open(temporary, "wb") as handle:
        handle.write(data)
    os.replace(temporary, local)


def output_identity(fs, output: str) -> str:
    """The output a journal belongs to, the same however it was named (a local path through a
    symlink, `~`, `file://`): work is never reused across outputs, and always for the same one."""
    local = storage.local_path(fs, output)
    return f"file://{os.path.realpath(local)}" if local is not None else storage.url_for(fs, output)


# --- what runs and workers write --------------------------------------------------------------

def write_header(fs, staging: str, generation: int, *, output: str, run_id: str, context: str, options: dict,
                 units: dict[str, str]) -> None:
    """The journal's run record of one generation (`units`: unit key -> fingerprint)."""
    value = {"journal": VERSION, "generation": generation, "run": run_id, "output": output, "context": context,
             "options": options, "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "units": units}
    put_whole(fs, storage.join(staging, RESUME_DIR, f"run-{generation:04d}.json"), json.dumps(value, sort_keys=True).encode())


def write_entry(fs, staging: str, generation: int, spill_path: str, batch_ends: tuple[int, ...], rows: list[dict]) -> None:
    """One spill file's record (`rows`: {"id", "nbytes", "stats", "notes", "files"} per row, in the
    file's order, `files` the staging-relative paths the row names). Sizes and digests are taken
    here, after everything is written."""
    size, sha = digest(fs, spill_path)
    recorded = []
    for row in rows:
        files = []
        for relative in row["files"]:
            file_size, file_sha = digest(fs, storage.join(staging, relative))
            files.append([relative, file_size, file_sha])
        recorded.append({"id": row["id"], "nbytes": int(row["nbytes"]), "stats": encode_stats(row["stats"]),
                         "notes": row["notes"], "files": files, **({"facts": row["facts"]} if row.get("facts") else {})})
    relative = spill_path[len(staging.rstrip("/")) + 1:]
    value = {"journal": VERSION, "generation": generation, "spill": [relative, size, sha], "batch_ends": list(batch_ends),
             "rows": recorded}
    put_whole(fs, storage.join(staging, DONE_DIR, f"{uuid.uuid4().hex}.json"), json.dumps(sealed(value), sort_keys=True).encode())


def sealed(value: dict) -> dict:
    """The entry with the SHA-256 of its own canonical JSON: a byte changed in it (statistics,
    notes, sizes, which the files' digests do not cover) makes it unreadable, not believed."""
    return {**value, "sha256": hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()}


def write_tally(fs, staging: str, generation: int, unit: str, count: int) -> None:
    name = hashlib.sha256(unit.encode()).hexdigest()[:32]
    value = {"journal": VERSION, "generation": generation, "unit": unit, "count": int(count)}
    put_whole(fs, storage.join(staging, TALLY_DIR, f"{generation:04d}-{name}.json"), json.dumps(value, sort_keys=True).encode())


def _array(array: np.ndarray) -> dict:
    array = np.ascontiguousarray(array)
    return {"dtype": array.dtype.str, "shape": list(array.shape), "data": base64.b64encode(array.tobytes()).decode()}


def _unarray(value: dict) -> np.ndarray:
    dtype = np.dtype(value["dtype"])
    if dtype.kind not in _NUMERIC_KINDS or dtype.hasobject:
        raise ValueError(f"not a numeric dtype: {value['dtype']}")
    shape = tuple(int(n) for n in value["shape"])
    if any(n < 0 for n in shape) or len(shape) > 4:
        raise ValueError("not an array shape")
    data = base64.b64decode(value["data"], validate=True)
    if len(data) != dtype.itemsize * int(np.prod(shape, dtype=np.int64)):
        raise ValueError("array bytes do not match its shape")
    return np.frombuffer(data, dtype=dtype).reshape(shape).copy()


def encode_stats(stats: dict[str, ColumnStats]) -> dict:
    """Statistics computed upstream (image statistics), exactly: arrays as their bytes."""
    return {key: {"count": int(value.count), "mean": _array(value.mean), "m2": _array(value.m2), "min": _array(value.min),
                  "max": _array(value.max), "levels": [_array(level) for level in value.levels],
                  "capacity": int(value.capacity), "image": bool(value.image),
                  **({"shift": _array(value.shift)} if value.shift is not None else {})}
            for key, value in sorted(stats.items())}


def decode_stats(value: dict) -> dict[str, ColumnStats]:
    return {key: ColumnStats(count=int(item["count"]), mean=_unarray(item["mean"]), m2=_unarray(item["m2"]),
                             min=_unarray(item["min"]), max=_unarray(item["max"]),
                             levels=[_unarray(level) for level in item["levels"]], capacity=int(item["capacity"]),
                             image=bool(item["image"]), shift=_unarray(item["shift"]) if "shift" in item else None)
            for key, item in value.items()}


# --- what the next run finds ------------------------------------------------------------------

@dataclasses.dataclass
class Journal:
    """An interrupted run's staging folder, as read back."""

    staging: str
    run_id: str
    headers: dict[int, dict]
    entries: list[dict]  # journal entries as written (only those that parse and match the schema)
    tallies: list[dict]
    sizes: dict[str, int]  # staging-relative path -> size, one listing
    unreadable: int = 0  # entries that do not parse or that another version wrote

    @property
    def bytes(self) -> int:
        return sum(self.sizes.values())

    @property
    def latest(self) -> dict | None:
        return self.headers[max(self.headers)] if self.headers else None

    @property
    def sequences(self) -> int:
        """Rows recorded (what the start line reports; a resumption may take fewer)."""
        return len({row["id"] for entry in self.entries for row in entry["rows"]})


def _entry_ok(value: Any) -> bool:
    """Whether a journal entry is whole (its seal matches) and every field is what `write_entry`
    writes: types, increasing batch ends covering the rows, statistics that decode, digests of 64
    hex digits. What fails is not used (its units are converted again), never half-used."""
    try:
        body = {key: item for key, item in value.items() if key != "sha256"}
        if value.get("sha256") != sealed(body)["sha256"]:
            return False
        spill, rows, ends = value["spill"], value["rows"], value["batch_ends"]
        ok = (value.get("journal") == VERSION and is_count(value["generation"]) and isinstance(spill[0], str) and is_count(spill[1])
              and is_sha256(spill[2]) and isinstance(rows, list) and rows and isinstance(ends, list) and all(is_count(end) for end in ends)
              and all(a < b for a, b in zip([0, *ends], ends)) and ends[-1] == len(rows))
        for row in rows if ok else ():
            ok = ok and isinstance(row["id"], str) and is_count(row["nbytes"]) and isinstance(row["notes"], dict) \
                and all(isinstance(key, str) for key in row["notes"]) and isinstance(row["stats"], dict) \
                and isinstance(row.get("facts", {}), dict) and all(isinstance(key, str) for key in row.get("facts", {})) \
                and all(isinstance(f, list) and len(f) == 3 and isinstance(f[0], str) and is_count(f[1]) and is_sha256(f[2]) for f in row["files"])
            decode_stats(row["stats"]) if ok else None
        return bool(ok)
    except (KeyError, IndexError, TypeError, AttributeError, ValueError, OverflowError):
        return False


def is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


def is_sha256(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(char in "0123456789abcdef" for char in value)


def read_journal(fs, staging: str, run_id: str) -> Journal | None:
    """The journal of a staging folder, or None where it has none (not a resumable run)."""
    resume = storage.join(staging, RESUME_DIR)
    if not fs.exists(resume):
        return None
    root = staging.rstrip("/") + "/"
    sizes = {path[len(root):]: int(info.get("size") or 0) for path, info in fs.find(staging, detail=True).items()
             if info.get("type") != "directory" and path.startswith(root)}
    journal = Journal(staging, run_id, {}, [], [], sizes)
    names = sorted(name for name in sizes if name.startswith(RESUME_DIR + "/") and name.endswith(".json"))
    texts = fs.cat([storage.join(staging, name) for name in names], on_error="return") if names else {}
    for name in names:
        data = texts.get(storage.join(staging, name))
        try:
            value = json.loads(data) if isinstance(data, bytes) else None
        except ValueError:
            value = None
        if not isinstance(value, dict) or value.get("journal") != VERSION:
            journal.unreadable += 1
        elif name.startswith(DONE_DIR + "/") and _entry_ok(value):
            journal.entries.append({**value, "name": name})
        elif name.startswith(TALLY_DIR + "/") and isinstance(value.get("unit"), str) and is_count(value.get("count")) \
                and is_count(value.get("generation")):
            journal.tallies.append(value)
        elif name.count("/") == 1 and name.split("/")[1].startswith("run-") and is_count(value.get("generation")) \
                and isinstance(value.get("units"), dict) and isinstance(value.get("context"), str) \
                and isinstance(value.get("options"), dict) and isinstance(value.get("output"), str):
            journal.headers[value["generation"]] = value
        else:
            journal.unreadable += 1
    return journal


def options_changed(previous: dict, current: dict) -> list[str]:
    """The recorded options (mixtrain.json's `converter.options`) that differ, as the flags that
    set them: `video_encoding`'s fields are --video_<field>, `source_options`' their own flags."""
    prefixes = {"video_encoding": "video_", "source_options": ""}
    changed = []
    for name in sorted(set(previous) | set(current)):
        before, after = previous.get(name), current.get(name)
        if before == after:
            continue
        if name in prefixes and isinstance(before, dict) and isinstance(after, dict):
            changed += [f"--{prefixes[name]}{key}" for key in sorted(set(before) | set(after)) if before.get(key) != after.get(key)]
        else:
            changed.append(f"--{name}")
    return changed


@dataclasses.dataclass
class Resumption:
    """What a run takes from an interrupted run's journal."""

    journal: Journal
    pending: list  # the refs still to convert, in plan order
    spilled: list[tuple[dict, tuple[int, ...]]]  # (journal entry, positions of its rows taken), in journal order
    tallies: list[tuple[str, int]]  # (unit key, sequences) for taken units the plan could not count
    sequences: int  # sequences taken
    generation: int  # this run's generation


def plan(journal: Journal, units: list, current: dict[str, dict]) -> Resumption:
    """The units of `units` ((Unit, ref) pairs of the refs to convert, in plan order) that the
    journal holds whole and valid, and the rest still to convert. `current`: unit key ->
    {"fingerprint", ...} as this run computes them."""
    exact = {unit.key: index for index, (unit, _) in enumerate(units) if unit.prefix is None}
    prefixed = sorted((unit.prefix, index) for index, (unit, _) in enumerate(units) if unit.prefix is not None)
    prefixes = [prefix for prefix, _ in prefixed]

    def owner(sequence_id: str) -> int | None:
        if sequence_id in exact:
            return exact[sequence_id]
        at = bisect.bisect_right(prefixes, sequence_id) - 1  # the greatest prefix not after the id
        return prefixed[at][1] if at >= 0 and sequence_id.startswith(prefixes[at]) else None

    def valid_file(relative: str, size: int) -> bool:
        return ".." not in relative.split("/") and not relative.startswith("/") and journal.sizes.get(relative) == size

    # unit index -> generation -> [(entry number, position, sequence id)]
    found: dict[int, dict[int, list]] = {}
    for number, entry in enumerate(journal.entries):
        header = journal.headers.get(entry["generation"])
        spill, size, _ = entry["spill"]
        if header is None or not spill.startswith(SPILL_DIR + "/") or not valid_file(spill, size):
            continue
        for position, row in enumerate(entry["rows"]):
            index = owner(row["id"])
            if index is None:
                continue
            key = units[index][0].key
            if header["units"].get(key) != (current.get(key) or {}).get("fingerprint"):
                continue
            if all(valid_file(relative, file_size) for relative, file_size, _ in row["files"]):
                found.setdefault(index, {}).setdefault(entry["generation"], []).append((number, position, row["id"]))
    counted = {}
    for tally in journal.tallies:
        header = journal.headers.get(tally["generation"])
        if header is not None:
            counted[(tally["unit"], tally["generation"])] = tally["count"]
    taken: dict[int, list[int]] = {}
    tallies, done, sequences = [], set(), 0
    for index, generations in found.items():
        unit, ref = units[index]
        for generation in sorted(generations, reverse=True):  # the newest complete record of the unit
            rows = generations[generation]
            ids = [sequence_id for _, _, sequence_id in rows]
            expected = ref.sequence_count if ref.sequence_count is not None else counted.get((unit.key, generation))
            if expected is None or len(ids) != expected or len(set(ids)) != len(ids):
                continue
            for number, position, _ in rows:
                taken.setdefault(number, []).append(position)
            if ref.sequence_count is None:
                tallies.append((unit.key, expected))
            done.add(index)
            sequences += expected
            break
    pending = [ref for index, (_, ref) in enumerate(units) if index not in done]
    spilled = [(journal.entries[number], tuple(sorted(positions))) for number, positions in sorted(taken.items())]
    generation = max(journal.headers, default=0) + 1
    return Resumption(journal, pending, spilled, tallies, sequences, generation)


def clear(fs, staging: str, keep: tuple[str, ...] = ()) -> None:
    """Everything in a staging folder but the run's claim on it (`keep`): a journal that cannot be
    resumed is discarded with what it recorded, and the run starts afresh in the same folder."""
    if fs.exists(staging):
        publish.remove_paths(fs, [], [entry for entry in fs.ls(staging, detail=False)
                                      if entry.rstrip("/").rsplit("/", 1)[-1] not in {*_CLAIM, *keep}])


def forget(fs, staging: str, entry: dict) -> None:
    """Remove a journal entry whose files changed since: the next run converts its sequences again."""
    path = storage.join(staging, entry["name"])
    if fs.exists(path):
        fs.rm(path)


def tidy(fs, journal: Journal, resumption: Resumption, keep: tuple[str, ...] = ()) -> None:
    """What a resumption does not take is removed before it starts: journal entries none of whose
    rows are taken, with their spill files; files under `files/` that no taken row names (a
    sequence converted again writes its own, and one no longer planned must not be published);
    and every other top-level entry of the folder but the run's claim and `keep` (the interrupted
    run's plan files, shards and statistics, which this run writes anew)."""
    taken = {id(entry) for entry, _ in resumption.spilled}
    named = {relative for entry, positions in resumption.spilled for position in positions
             for relative, _, _ in entry["rows"][position]["files"]}
    used = {entry["spill"][0] for entry, _ in resumption.spilled}
    stale = [entry["name"] for entry in journal.entries if id(entry) not in taken]
    stale += [entry["spill"][0] for entry in journal.entries if id(entry) not in taken and entry["spill"][0] not in used]
    stale += [relative for relative in journal.sizes if relative.startswith(FILES_DIR + "/") and relative not in named]
    stale = [storage.join(journal.staging, relative) for relative in sorted(set(stale)) if relative in journal.sizes]
    kept = {FILES_DIR, SPILL_DIR, RESUME_DIR, *_CLAIM, *keep}
    others = [entry for entry in fs.ls(journal.staging, detail=False) if entry.rstrip("/").rsplit("/", 1)[-1] not in kept]
    publish.remove_paths(fs, stale, others)


LEASE = f"{RESUME_DIR}/alive"
LEASE_SECONDS = 30.0  # how often a live launcher renews its lease on an object store's staging
LEASE_STALE = 150.0  # a lease older than this: the run is taken for stopped


class Lease:
    """A live run's claim on a staging folder where no lock can be held (object stores): the
    launcher rewrites `_resume/alive` every LEASE_SECONDS while it lives; another launcher takes
    the folder over only once the lease is LEASE_STALE old (`interrupted`). Local disks use the
    owner file and its lock instead (`publish.claim_staging`)."""

    def __init__(self, fs, staging: str):
        import threading

        self._fs, self._path, self._stop = fs, storage.join(staging, LEASE), threading.Event()
        self._journal = storage.join(staging, RESUME_DIR)
        self._thread = threading.Thread(target=self._renew, name="mixtrain-lease", daemon=True)

    def __enter__(self) -> Lease:
        if not storage.is_local(self._fs):
            self._write()
            self._thread.start()
        return self

    def __exit__(self, *_) -> None:
        """The run is over (published, failed or interrupted): the lease is given up, so that the
        same command run again resumes at once; only a killed launcher leaves a live one."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=10)
            try:
                if self._fs.exists(self._path):
                    self._fs.rm(self._path)
            except Exception:  # noqa: BLE001 - a lease left behind lapses by itself
                pass

    def _write(self) -> None:
        self._fs.pipe_file(self._path, json.dumps({"renewed": time.time()}).encode())

    def _renew(self) -> None:
        while not self._stop.wait(LEASE_SECONDS):
            try:
                if not self._fs.exists(self._journal):  # the publish step removed the journal: the run is over
                    return
                self._write()
            except Exception:  # noqa: BLE001 - a store that failed once may answer next time; the run's own steps report it
                pass


def _lease_age(fs, staging: str) -> float | None:
    """Seconds since the folder's lease was renewed, while it is live (object stores); else None."""
    return publish.renewal_age(fs, storage.join(staging, LEASE), LEASE_STALE)


def _leased(fs, staging: str) -> bool:
    return _lease_age(fs, staging) is not None


def check_no_leased_run(fs, output: str) -> None:
    """One writer per output on object stores too (a local disk's is `publish.check_no_live_run`):
    refuse to start while another run's staging folder holds a live lease."""
    from formats.errors import ConversionError
    from formats.mixtrain.tables import lake

    if storage.is_local(fs):
        return
    folders = [folder for folder, _ in publish.staging_folders(fs, output)]
    folders += [storage.join(output, lake.RUNS_DIR, name) for _, name in lake.pending_runs(fs, output)]
    for folder in folders:
        shown, where = storage.shown(fs, output), storage.shown(fs, folder)
        age = _lease_age(fs, folder)
        if age is not None:
            raise ConversionError(f"{shown}: another conversion is writing this output (its staging {where} holds a lease renewed "
                                  f"{age:.0f} s ago); wait for it to finish, or, if it was stopped, run again in "
                                  f"{LEASE_STALE - age:.0f} s, when its lease has lapsed, to resume it")
        age = publish.publishing_age(fs, folder)
        if age is not None:
            raise ConversionError(f"{shown}: another conversion is publishing this output (its staging {where} renewed its "
                                  f"publication's heartbeat {age:.0f} s ago); wait for it to finish, or, if it was stopped, run "
                                  f"again in {publish.HEARTBEAT_STALE - age:.0f} s, when it has lapsed")


# A publish step's `.done` marker waits for its launcher (`publish.take_done`), which may sit through
# a job's teardown for minutes: one is taken for a leftover only after a day.
DONE_MARKER_STALE = 86400.0


def collect_leftovers(fs, output: str, keep: str | None) -> list[str]:
    """Remove what killed publications left beside an object-store output (a local disk's is
    collected after publication, `publish.collect_garbage`): a staging folder without a journal
    (its publication started: nothing would ever resume it), whose publication heartbeat and
    launcher lease have both lapsed, but `keep` (the folder this run resumes); with it, its
    `.published` marker. A folder with a journal is an interrupted conversion's, resumed or
    discarded (`--fresh`) as before, never collected here; a live one (a heartbeat or a lease
    renewed within 150 s) never. Returns the paths removed."""
    if storage.is_local(fs):
        return []
    removed = []
    for folder, _ in publish.staging_folders(fs, output):
        if folder == keep or _leased(fs, folder) or publish.publishing_age(fs, folder) is not None:
            continue
        if fs.exists(storage.join(folder, RESUME_DIR)):
            continue
        publish.discard_staging(fs, folder, output)
        removed.append(folder)
    for marker in publish.staging_markers(fs, output):
        folder, suffix = marker.rsplit(".", 1)
        if fs.exists(folder):
            continue
        if folder in removed or (suffix == "published" and _age(fs, marker) > LEASE_STALE) or _age(fs, marker) > DONE_MARKER_STALE:
            fs.rm(marker)
            removed.append(marker)
    return removed


def _age(fs, path: str) -> float:
    """Seconds since an object was written (0 when the store does not say: kept)."""
    try:
        return max(0.0, time.time() - fs.modified(path).timestamp())
    except (OSError, NotImplementedError, AttributeError, ValueError):
        return 0.0


def interrupted(fs, output: str, lake_table: bool | None = None) -> list[Journal]:
    """The journals of the runs for `output` that stopped before publishing and that no live run
    owns (a local owner, an object store's lease), newest first: the standalone layout's staging folders (`lake_table` False), a lake
    table's uncommitted run folders (True), or both (None: what `inspect` shows)."""
    from formats.mixtrain.tables import lake

    found = []
    if lake_table is not True:
        found += publish.interrupted_stagings(fs, output)
    if lake_table is not False:
        found += lake.pending_runs(fs, output)
    found = [(folder, run) for folder, run in found if not _leased(fs, folder)]
    journals = [resume for resume in (read_journal(fs, folder, run) for folder, run in found) if resume is not None]
    return sorted(journals, key=lambda journal: journal.run_id, reverse=True)


def describe(journal: Journal, fs) -> str:
    """An interrupted run's staging in a few words: which run, when, how much it holds, and where
    (as a user names it: with its store's scheme)."""
    first = journal.headers[min(journal.headers)] if journal.headers else {}
    when = first.get("started_at", "at an unknown time")
    ignored = f", {journal.unreadable} unreadable journal file(s) ignored" if journal.unreadable else ""
    return (f"run {journal.run_id} (started {when}): {journal.sequences} sequences recorded{ignored}, "
            f"{journal.bytes / 1e6:.1f} MB staged in {storage.shown(fs, journal.staging)}")
