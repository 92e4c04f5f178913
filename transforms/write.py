"""WriteMixtrain: sequences -> sharded Parquet, stats.json, then publish and mixtrain.json last.

Everything is written under the run's staging folder (formats/mixtrain/publish.py: a hidden sibling of a
local output, `_staging/<run>/` inside an object-store output, `runs/<run>/` inside a lake table);
only the final step publishes it, through the publisher of the table format (formats/tables): the
standalone layout's mixtrain.json, whose presence marks a finished dataset, is written after all else.

Sequence data never crosses a shuffle. Each worker spills its rows, already in Arrow form, to
Arrow IPC files under the staging folder (`_rows/<shard>/`), and only (shard, sequence id,
where its row is) records are grouped by shard. The shard writer then streams the rows in
sequence-id order into Parquet one row group at a time, computing statistics as it goes: memory
stays at about one row group however long the sequences or large the shard, and a runner that
materialises shuffles (the local one, Dataflow's shuffle service) moves kilobytes, not the
trajectories.
"""

from __future__ import annotations

import bisect
import collections
import concurrent.futures
import contextlib
import dataclasses
import functools
import itertools
import json
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.transforms.window import GlobalWindows

from formats import mixtrain, storage
from formats.errors import ConversionError, FormatError, describe_skip_limit, error_record, skipped_counts
from formats.mixtrain import publish, quality, resume, tables
from formats.mixtrain.fingerprint import Fingerprints
from formats.mixtrain.publish import stop_point
from formats.mixtrain.stats import ColumnStats, non_finite_counts, table_stats
from formats.mixtrain.tables import lake
from formats.sequence import VIDEO, ColumnSpec, DatasetMeta, Sequence, written_files
from transforms import staged_plan
from transforms.errors import ERRORS, FAIL, SKIP
from transforms.progress import flush, report
from transforms.read import TALLIES, staged_refs
from transforms.reuse import KEPT_IDS
from transforms.stats import MergeShardsFn

__all__ = ["WriteMixtrain", "ShardResult", "Planned", "Checks", "stage_fingerprints", "staged_fingerprints"]


@dataclasses.dataclass
class ShardResult:
    index: int
    rows: int
    timesteps: int
    bytes: int
    stats: dict[str, ColumnStats]
    errors: list = dataclasses.field(default_factory=list)
    non_finite: dict = dataclasses.field(default_factory=dict)  # column -> NaN/inf values kept
    video_notes: dict = dataclasses.field(default_factory=dict)  # column -> {sequence_id: note} (Sequence.video_notes)
    arrived: int = 0  # rows that reached the shard writer, duplicates included (what arrived, against the plan)
    quality: quality.Partial | None = None  # the rows' data-quality findings (None: not computed)


@dataclasses.dataclass(frozen=True)
class Planned:
    """What the plan promises the publish step, so that a run on any runner that lost elements
    (a dropped bundle, a runner translating a primitive wrongly) fails instead of publishing a
    short dataset: `sequences` counted on the launcher (refs that know their count, plus the
    sequences --incremental reuses), and `counted_on_workers` units that count theirs only when a
    worker indexes them (each reports a tally, `transforms.read.TALLIES`, or fails as a unit)."""

    sequences: int
    counted_on_workers: int = 0

    @classmethod
    def of(cls, refs: list, reused: int = 0) -> Planned:
        counts = [ref.sequence_count for ref in refs]
        return cls(sum(count for count in counts if count is not None) + reused, counts.count(None))


SPILL_DIR = resume.SPILL_DIR
FINGERPRINTS = "fingerprints.pkl"  # in the plan folder: the context hash, then pieces of {unit key -> fingerprint}
SPILL_BYTES = 8 << 20  # a shard's buffered rows are written out once they reach this much Arrow data
SPILL_BUFFER_BYTES = 64 << 20  # and the largest shard's rows whenever all shards' buffers reach this


@dataclasses.dataclass(frozen=True)
class SpilledFile:
    """The rows of one spill file, as one record: what crosses the shuffle to the shard writer
    (a record per row was 20,000 pickled objects for 20,000 short episodes, all on the tail)."""

    path: str
    sequence_ids: tuple[str, ...]  # the file's rows, in id order
    nbytes: tuple[int, ...]
    extra_stats: tuple[dict, ...]
    video_notes: tuple[dict, ...]
    batch_ends: tuple[int, ...]  # the file's record batches: the row each one ends before
    positions: tuple[int, ...] | None = None  # the rows to take (a resumption takes some of a file's), None: all
    facts: tuple[dict, ...] = ()  # each row's Sequence.source_facts (empty: none recorded)
    quality: quality.Partial | None = None  # the data-quality checks of all its rows, made where it was spilled (None: not made)

    def rows(self) -> list[SpilledRow]:
        facts = self.facts or ({},) * len(self.sequence_ids)
        checked = self.quality is not None and self.positions is None
        rows = [SpilledRow(sequence_id, self.path, position, self.batch_ends, size, stats, notes, fact, checked)
                for position, (sequence_id, size, stats, notes, fact)
                in enumerate(zip(self.sequence_ids, self.nbytes, self.extra_stats, self.video_notes, facts, strict=True))]
        return rows if self.positions is None else [rows[position] for position in self.positions]


@dataclasses.dataclass(frozen=True)
class SpilledRow:
    """Where one sequence's row waits for its shard writer: row `position` of the IPC file `path`."""

    sequence_id: str
    path: str
    position: int
    batch_ends: tuple[int, ...]  # its file's (SpilledFile.batch_ends), one tuple shared by the file's rows
    nbytes: int  # what the row weighs (closes row groups by size without reading the row first)
    extra_stats: dict  # statistics computed upstream (video frames), which the row cannot give back
    video_notes: dict = dataclasses.field(default_factory=dict)  # column -> how its file was written, if not as the column says
    facts: dict = dataclasses.field(default_factory=dict)  # Sequence.source_facts: for the quality checks
    checked: bool = False  # its file's quality checks cover it (else the shard writer checks it)


class _SpillRowsFn(beam.DoFn):
    """Sequences -> Arrow rows in IPC files under the staging folder, and a (shard, SpilledFile) record per file.

    With `generation` (a converting run's, not the reused rows'), each file is recorded in the
    run's resume journal as soon as it is written (`formats.mixtrain.resume`): a kill then loses
    at most what the workers held (`_spill_interval` of work each). `file_prefix`: what the rows' file
    references start with before the staging-relative path (a lake run's `runs/<run>/`)."""

    def __init__(self, staging_url: str, columns: list[ColumnSpec], num_shards: int, shard_rows: int | None = None,
                 generation: int | None = None, file_prefix: str = "", checks: Checks | None = None):
        self._checks = checks  # the data-quality checks run here, on the converting workers, not on the shard writers' tail
        self._staging_url = staging_url
        self._columns = columns
        self._num_shards = num_shards
        self._shard_rows = shard_rows  # the rows a shard is planned to hold, when the plan knows
        self._generation = generation
        self._file_prefix = file_prefix

    def setup(self):
        self._fs, self._root = storage.open_root(self._staging_url)
        self._schema = mixtrain.arrow_schema(self._columns)
        self._started = time.monotonic()

    def start_bundle(self):
        self._buffers: dict[int, list] = {}
        self._sizes: dict[int, int] = {}
        self._since = None

    def process(self, sequence: Sequence):
        shard, size = mixtrain.shard_of(sequence.sequence_id, self._num_shards), _approximate_bytes(sequence)
        self._buffers.setdefault(shard, []).append((sequence, size))
        self._sizes[shard] = self._sizes.get(shard, 0) + size
        self._since = self._since or time.monotonic()
        # Files of about SPILL_BYTES per shard, however many shards, and a bounded buffer.
        if self._sizes[shard] >= SPILL_BYTES:
            yield from self._spill(shard)
        elif sum(self._sizes.values()) >= SPILL_BUFFER_BYTES:
            yield from self._spill(max(self._sizes, key=lambda s: (self._sizes[s], s)))
        elif self._generation is not None and time.monotonic() - self._since >= _spill_interval(self._since - self._started):
            for buffered in sorted(self._buffers):  # recorded for a resumption: a kill loses at most this much work
                yield from self._spill(buffered)
        if not self._buffers:
            self._since = None

    def finish_bundle(self):
        for shard in sorted(self._buffers):
            for record in self._spill(shard):
                yield GlobalWindows.windowed_value(record)

    def _spill(self, shard: int):
        # In id order: the rows a shard's row group takes from this file (a range of ids) are then
        # neighbours, read a batch at a time rather than a row at a time.
        buffered = sorted(self._buffers.pop(shard), key=lambda item: item[0].sequence_id)
        del self._sizes[shard]
        folder = storage.join(self._root, SPILL_DIR, f"{shard:05d}")
        self._fs.makedirs(folder, exist_ok=True)
        path = storage.join(folder, f"{uuid.uuid4().hex}.arrow")
        # One Arrow table for the whole buffer (column building per row cost more than the rows),
        # written in record batches of at most SPILL_BATCH_ROWS rows or SPILL_BATCH_BYTES (a batch
        # is what the shard writer reads to pick a row from it).
        table = mixtrain.sequences_to_table([sequence for sequence, _ in buffered], self._columns)
        if any(column.num_chunks > 1 for column in table.columns):  # a slice must be one record batch
            table = table.combine_chunks()
        ends = _batch_ends([size for _, size in buffered], _batch_rows(len(buffered), self._shard_rows))
        with self._fs.open(path, "wb") as handle, pa.ipc.new_file(handle, self._schema) as writer:
            for start, end in zip((0, *ends), ends):
                writer.write_table(table.slice(start, end - start))  # no copy (combine_chunks would copy even one chunk)
        if self._generation is not None:
            resume.write_entry(self._fs, self._root, self._generation, path, ends,
                               [{"id": sequence.sequence_id, "nbytes": size, "stats": sequence.extra_stats,
                                 "notes": sequence.video_notes, "facts": sequence.source_facts,
                                 "files": [path[len(self._file_prefix):] for path in written_files(sequence)
                                           if path.startswith(self._file_prefix)]}
                                for sequence, size in buffered])
            stop_point("conversion", "rows-spilled")
        found = None
        if self._checks is not None:
            facts = _facts(self._columns, [(sequence.extra_stats, sequence.source_facts) for sequence, _ in buffered])
            found = quality.group_partial(table, self._columns, self._checks.fps, self._checks.thresholds, facts)
        yield shard, SpilledFile(path, tuple(sequence.sequence_id for sequence, _ in buffered), tuple(size for _, size in buffered),
                                 tuple(dict(sequence.extra_stats) for sequence, _ in buffered),
                                 tuple(dict(sequence.video_notes) for sequence, _ in buffered), ends,
                                 facts=tuple(dict(sequence.source_facts) for sequence, _ in buffered), quality=found)


# A converting worker's rows are spilled, and recorded for a resumption, once they have waited
# SPILL_SECONDS or SPILL_FRACTION of the time the worker has been at work, whichever is longer: a
# kill loses at most that much of each worker's work, and a run of hours writes a few hundred
# small files per worker and shard, not one a second.
SPILL_SECONDS = 1.0
SPILL_FRACTION = 0.02


def _spill_interval(working: float) -> float:
    return max(SPILL_SECONDS, SPILL_FRACTION * working)


SPILL_BATCH_ROWS = 64
SPILL_BATCH_BYTES = 1 << 20


def _batch_rows(file_rows: int, shard_rows: int | None) -> int:
    """Rows per record batch of a spill file: about what one of the shard's row groups takes from
    it (ROW_GROUP_ROWS x its share of the shard), at most SPILL_BATCH_ROWS. A small file among many
    (many bundles) gets small batches: a row group reading one row of a 64-row batch decoded 64."""
    if not shard_rows:
        return SPILL_BATCH_ROWS
    return max(1, min(SPILL_BATCH_ROWS, mixtrain.ROW_GROUP_ROWS * file_rows // shard_rows))


def _batch_ends(sizes: list[int], batch_rows: int = SPILL_BATCH_ROWS) -> tuple[int, ...]:
    """Where a spill file's record batches end: at `batch_rows` rows or SPILL_BATCH_BYTES,
    whichever comes first (a long episode is a batch of its own)."""
    ends, rows, size = [], 0, 0
    for position, row_size in enumerate(sizes):
        if rows and (rows >= batch_rows or size + row_size > SPILL_BATCH_BYTES):
            ends.append(position)
            rows, size = 0, 0
        rows += 1
        size += row_size
    return (*ends, len(sizes)) if sizes else ()


def _approximate_bytes(sequence: Sequence) -> int:
    """What a row weighs in Arrow, near enough to decide when to spill."""
    arrays = [sequence.timestamp, *sequence.trajectories.values(), *(v for v in sequence.steps.values() if v is not None)]
    return sum(getattr(array, "nbytes", 0) for array in arrays) + 256


def _row_groups(rows: list[SpilledRow]) -> list[list[SpilledRow]]:
    """Consecutive rows closed at ROW_GROUP_ROWS rows or ROW_GROUP_BYTES, whichever comes first."""
    groups, group, size = [], [], 0
    for row in rows:
        group.append(row)
        size += row.nbytes
        if len(group) >= mixtrain.ROW_GROUP_ROWS or size >= mixtrain.ROW_GROUP_BYTES:
            groups.append(group)
            group, size = [], 0
    return groups + [group] if group else groups


class _SpilledRowReader:
    """A row group's rows out of the spill files, keeping a few files open, and each one's last
    batch: rows come in sequence-id order, which jumps between the files of different workers and
    bundles, and a row group takes a range of each file's (id-ordered) rows."""

    def __init__(self, fs, schema: pa.Schema, keep: int = 16, keep_bytes: int = 32 << 20):
        self._fs = fs
        self._schema = schema
        self._open: OrderedDict = OrderedDict()  # path -> (IPC reader, source)
        self._keep = keep
        # Batches read and not done with, (path, index) -> batch: a file's next row groups take
        # their rows, and with more files than `keep` open (many bundles) each would read it again.
        self._batches: dict = {}
        self._batch_bytes = 0
        self._keep_bytes = keep_bytes

    def group(self, rows: list[SpilledRow]) -> pa.Table:
        """`rows` (in id order) as one table of one chunk per column, in their order."""
        if not rows:
            return self._schema.empty_table()
        by_file: dict[str, list[SpilledRow]] = {}
        for row in rows:
            by_file.setdefault(row.path, []).append(row)
        pieces, ids = [], []
        for path, found in by_file.items():
            found.sort(key=lambda row: row.position)
            pieces += self._rows(path, found[0].batch_ends, [row.position for row in found])
            ids += [row.sequence_id for row in found]
        table = pa.Table.from_batches(pieces, schema=self._schema)
        order = sorted(range(len(ids)), key=ids.__getitem__)
        if order != list(range(len(ids))):  # a copy of the group: not for one file's rows, or a long episode's own group
            table = table.take(order)
        table = table.combine_chunks()
        wanted = [row.sequence_id for row in rows]
        if table.column("sequence_id").to_pylist() != wanted:
            got = next(i for i, (a, b) in enumerate(zip(table.column("sequence_id").to_pylist(), wanted, strict=True)) if a != b)
            raise FormatError(f"the spilled row of {wanted[got]} in {rows[got].path} holds another sequence (damaged staging)")
        return table

    def _rows(self, path: str, batch_ends: tuple[int, ...], positions: list[int]) -> list[pa.RecordBatch]:
        """The rows at `positions` (ascending) of one spill file, a slice of each batch they are in."""
        pieces, start = [], 0
        while start < len(positions):
            index = bisect.bisect_right(batch_ends, positions[start])
            first = batch_ends[index - 1] if index else 0
            stop = bisect.bisect_left(positions, batch_ends[index], start)
            batch = self._batches.pop((path, index), None)
            if batch is None:
                batch = self._reader(path).get_batch(index)
                if batch.num_rows != batch_ends[index] - first:
                    raise FormatError(f"{path}: batch {index} holds {batch.num_rows} rows, not {batch_ends[index] - first} (damaged staging)")
            else:
                self._batch_bytes -= batch.nbytes
            local = [position - first for position in positions[start:stop]]
            contiguous = local[-1] - local[0] + 1 == len(local)
            pieces.append(batch.slice(local[0], len(local)) if contiguous else batch.take(pa.array(local)))
            # Kept when rows are left for a later group (a long episode is a batch of its own) and it
            # fits: the batches kept are as needed as this one (the groups cycle through the files),
            # so a full cache keeps them rather than evicting what the next group reads.
            if positions[stop - 1] < batch_ends[index] - 1 and self._batch_bytes + batch.nbytes <= self._keep_bytes:
                self._batches[(path, index)] = batch
                self._batch_bytes += batch.nbytes
            start = stop
        return pieces

    def _reader(self, path: str) -> pa.ipc.RecordBatchFileReader:
        entry = self._open.get(path)
        if entry is None:
            local = storage.local_path(self._fs, path)
            # Plain reads, not a memory map: mapped pages would stay resident while the file is open.
            source = pa.OSFile(local) if local else storage.open_input(self._fs, path)
            entry = self._open[path] = (pa.ipc.open_file(source), source)
            while len(self._open) > self._keep:
                self._open.popitem(last=False)[1][1].close()
        self._open.move_to_end(path)
        return entry[0]

    def close(self):
        for _, source in self._open.values():
            source.close()
        self._open.clear()
        self._batches.clear()
        self._batch_bytes = 0


def group_stats(table: pa.Table, rows: list[SpilledRow], columns: list[ColumnSpec]) -> dict[str, ColumnStats]:
    """A row group's statistics: its Arrow columns', and what upstream steps computed for its rows
    (video frames), merged in row order."""
    stats = table_stats(table, columns)
    for key in sorted({key for row in rows for key in row.extra_stats}):
        partials = [row.extra_stats[key] for row in rows if key in row.extra_stats]
        stats[key] = functools.reduce(ColumnStats.merge, partials)
    return stats


class _WriteShardFn(beam.DoFn):
    """(shard, [SpilledFile]) -> the shard's Parquet file, streamed a row group at a time."""

    def __init__(self, staging_url: str, columns: list[ColumnSpec], on_error: str = FAIL, table: tables.TableSettings | None = None,
                 checks: Checks | None = None):
        self._staging_url = staging_url
        self._columns = columns
        self._on_error = on_error
        self._table = table
        self._checks = checks

    def setup(self):
        self._fs, self._root = storage.open_root(self._staging_url)
        self._schema = mixtrain.arrow_schema(self._columns)

    def process(self, element):
        index, files = element
        files = list(files)  # read twice: its rows, then its files' quality checks
        ordered = sorted((row for spilled in files for row in spilled.rows()), key=lambda r: r.sequence_id)
        arrived = len(ordered)  # duplicates included: what arrived, against the plan
        errors = []
        duplicates = {current.sequence_id for previous, current in zip(ordered, ordered[1:]) if previous.sequence_id == current.sequence_id}
        for sequence_id in sorted(duplicates):
            error = FormatError(f"{sequence_id}: duplicate sequence id (two source episodes map to it)")
            if self._on_error != SKIP:
                raise error
            errors.append(error_record(error, sequence=sequence_id, stage="write"))
        ordered = [r for r in ordered if r.sequence_id not in duplicates]  # skipped: every copy, none chosen at random
        path = storage.join(self._root, mixtrain.shard_path(index))
        self._fs.makedirs(storage.join(self._root, mixtrain.DATA_DIR), exist_ok=True)
        result = ShardResult(index=index, rows=len(ordered), timesteps=0, bytes=0, stats={}, errors=errors, arrived=arrived,
                             quality=quality.Partial() if self._checks is not None else None)
        # The checks its spill files carry, made on the converting workers; a shard whose duplicate
        # ids were dropped checks its rows itself (a file's checks cover rows that are not written).
        trust_files = not duplicates
        if result.quality is not None and trust_files:
            for spilled in files:
                if spilled.quality is not None and spilled.positions is None:
                    result.quality.merge(spilled.quality)
        reader = _SpilledRowReader(self._fs, self._schema)
        # A row group's statistics are computed on a thread while the next groups are read and
        # encoded (numpy and Arrow release the GIL), folded in row-group order: the same numbers.
        # The next row group is read on a thread of its own while this one is encoded: the shard is
        # the run's tail, and Parquet's encoding alone (one thread) is half of its step.
        pending: collections.deque = collections.deque()
        groups = _row_groups(ordered) if ordered else [[]]
        try:
            with (concurrent.futures.ThreadPoolExecutor(STATS_THREADS, thread_name_prefix="mixtrain-stats") as pool,
                  concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mixtrain-shard-read") as reading):
                upcoming = reading.submit(reader.group, groups[0])
                with self._fs.open(path, "wb") as handle, mixtrain.shard_writer(handle, self._schema, row_by_row=True) as writer:
                    for number, group in enumerate(groups):
                        table = upcoming.result()
                        # Row groups held at once: the one written, the next read ahead, those waiting
                        # for their statistics (at most STATS_THREADS, and HELD_BYTES together); a row
                        # group over half of that (one long episode) is held alone, its statistics
                        # done before the next is read.
                        large = table.nbytes > HELD_BYTES // 2
                        while pending and (len(pending) >= STATS_THREADS or sum(size for _, size in pending) + table.nbytes > HELD_BYTES):
                            _fold(pending.popleft()[0].result(), result)
                        if number + 1 < len(groups) and not large:
                            upcoming = reading.submit(reader.group, groups[number + 1])
                        pending.append((self._write_group(writer, table, group, result, pool, trust_files), table.nbytes))
                        del table
                        if large:
                            while pending:
                                _fold(pending.popleft()[0].result(), result)
                            if number + 1 < len(groups):
                                upcoming = reading.submit(reader.group, groups[number + 1])
                while pending:
                    _fold(pending.popleft()[0].result(), result)
        finally:
            reader.close()
        result.bytes = self._fs.size(path)
        if ordered:  # the table format's own work on the shard, in parallel on the workers (lance: fragments)
            tables.stage_shard(self._fs, self._root, mixtrain.shard_path(index), [c.name for c in self._columns if c.kind == VIDEO],
                               self._table)
        stop_point("conversion", "shard-written")
        report(shards=1, bytes=result.bytes)
        flush()  # the last shards end the run: their counts now, not a tick later
        yield result

    def _write_group(self, writer, table: pa.Table, rows: list[SpilledRow], result: ShardResult,
                     pool: concurrent.futures.Executor, trust_files: bool = True) -> concurrent.futures.Future:
        """One row group (`table`: `rows`, one chunk per column) written; its statistics submitted
        to `pool` (a future of `_group_summary`). Written row by row (shard_writer): the pages of
        earlier versions' tables of 1-row chunks, hence their bytes."""
        writer.write_table(table, row_group_size=max(1, table.num_rows))
        for row in rows:
            for column, note in row.video_notes.items():
                result.video_notes.setdefault(column, {})[row.sequence_id] = note
        result.timesteps += sum(table.column("length").to_pylist())
        return pool.submit(_group_summary, table, rows, self._columns, self._checks, trust_files)


@dataclasses.dataclass(frozen=True)
class Checks:
    """The data-quality checks' settings (formats/mixtrain/quality.py): the dataset's declared rate
    and the thresholds; the rows' spillers run the checks, the shard writers merge them."""

    fps: float | None
    thresholds: quality.Thresholds


STATS_THREADS = 2  # threads computing row groups' statistics beside the shard writer
HELD_BYTES = 64 << 20  # Arrow bytes of row groups held at once beyond the one being written


def _facts(columns: list[ColumnSpec], rows: list[tuple[dict, dict]]) -> list[dict] | None:
    """What the quality checks take of each row beyond its values, from its (extra_stats,
    source_facts): the source's facts and each video column's image statistics (frames decoded in
    this pass). None when no row has any: the checks then skip their pass over the rows' facts."""
    videos = [spec.name for spec in columns if spec.kind == VIDEO]
    if not videos and not any(source_facts for _, source_facts in rows):
        return None
    return [{**source_facts, "images": {name: extra_stats[name] for name in videos if name in extra_stats}}
            for extra_stats, source_facts in rows]


def _group_summary(table: pa.Table, rows: list[SpilledRow], columns: list[ColumnSpec],
                   checks: Checks | None = None, trust_files: bool = True) -> tuple[dict, dict, quality.Partial | None]:
    """(statistics, NaN/inf counts, quality findings) of a written row group (a table of one chunk
    per column: the statistics read each column whole, twice; on 1-row chunks that took 1.2 s at
    20,000 rows). The findings are those of the rows their spill file's checks did not cover (a
    resumption's rows, or every row of a shard with duplicate ids, `trust_files` False)."""
    found = None
    if checks is not None and rows:
        unchecked = [index for index, row in enumerate(rows) if not (trust_files and row.checked)]
        if unchecked:
            part = table if len(unchecked) == len(rows) else table.take(pa.array(unchecked))
            found = quality.group_partial(part, columns, checks.fps, checks.thresholds,
                                          _facts(columns, [(rows[i].extra_stats, rows[i].facts) for i in unchecked]))
    return (group_stats(table, rows, columns) if rows else {}), non_finite_counts(table, columns), found


def _fold(summary: tuple[dict, dict, quality.Partial | None], result: ShardResult) -> None:
    """A row group's statistics into the shard's, in row-group order."""
    stats, non_finite, found = summary
    if found is not None and result.quality is not None:
        result.quality.merge(found)
    for name, column_stats in stats.items():
        result.stats[name] = result.stats[name].merge(column_stats) if name in result.stats else column_stats
    for name, count in non_finite.items():
        result.non_finite[name] = result.non_finite.get(name, 0) + count


def stage_fingerprints(fingerprints: Fingerprints, plan_folder: staged_plan.PlanFolder) -> None:
    """The plan's fingerprints to the plan folder, for the publish step: the context, then the
    units piece by piece (computed as they are written)."""
    staged_plan.write_pieces(plan_folder, FINGERPRINTS, itertools.chain([fingerprints.context], fingerprints.pieces()))


def staged_fingerprints(plan_folder: staged_plan.PlanFolder) -> dict:
    pieces = staged_plan.read_pieces(plan_folder, FINGERPRINTS)
    context, units = next(pieces), {}
    for piece in pieces:
        units.update(piece)
    return {"context": context, "units": units}


def _failed(key: str, unit: dict, records: list[dict]) -> bool:
    """Whether a unit lost a sequence (its fingerprint is then not kept: the next run retries it)."""
    prefix = unit.get("prefix")
    for record in records:
        sequence = record.get("sequence_id")
        if sequence is not None and (sequence == key or (prefix and sequence.startswith(prefix))):
            return True
        source = record.get("source_file") or ""
        if sequence is None and (source == key or source.endswith("/" + key)):  # a whole unit (planned as one ref) failed
            return True
    return False


def _sum_counts(counts) -> dict[str, int]:
    total: dict[str, int] = {}
    for count in counts:
        for name, value in count.items():
            total[name] = total.get(name, 0) + value
    return dict(sorted(total.items()))


def _merge_notes(per_shard) -> dict[str, dict]:
    merged: dict[str, dict] = {}
    for notes in per_shard:
        for column, by_sequence in notes.items():
            merged.setdefault(column, {}).update(by_sequence)
    return merged


def _check_publishable(output: str, converted: int, records: list[dict], limit: tuple[str, float]) -> None:
    """Publish nothing rather than an empty dataset, or one missing more sequences than allowed:
    the previous dataset at the output stays as it was."""
    skipped = sum(skipped_counts(records))  # a shard of unknown size counts as one: at least
    first = f" (first: {records[0]['error']})" if records else ""
    if converted == 0:
        raise ConversionError(f"{output}: no sequence was converted ({skipped} skipped){first}; nothing was published")
    kind, value = limit
    allowed = value if kind == "count" else value * (converted + skipped)
    if skipped > allowed + 1e-9:  # 29 % of 100 is 28.999999999999996 in floating point
        raise ConversionError(f"{output}: {skipped} of {converted + skipped} sequences were skipped, more than "
                              f"--max_skipped={describe_skip_limit(limit)}; nothing was published{first}")


def _check_arrived(output: str, planned: Planned, shards: list[ShardResult], upstream: list[dict], tallies: list,
                   missing: Callable[[], list[str]]) -> None:
    """Every planned sequence reached the publish step, converted or recorded as skipped, and none
    twice; else nothing is published. `upstream`: the error records of the steps before the writer
    (the writer's own, for duplicate ids, stand for rows that arrived); `missing()` names the lost
    sequences (only asked when some are lost: it reads the plan back)."""
    strays = [record for record in upstream if not isinstance(record, dict)]
    if strays:  # a runner that hands one output's elements to another's consumers (Beam 2.77's DaskRunner did)
        raise ConversionError(f"{output}: the publish step received {len(strays)} {type(strays[0]).__name__} element(s) among the "
                              "error records: the runner mixed the pipeline's outputs; nothing was published")
    known = [record.get("sequences", 1) for record in upstream]
    reported = len(tallies) + known.count(None)  # a unit whose count was unknown reports one or the other
    expected = planned.sequences + sum(count for _, count in tallies)
    arrived = sum(shard.arrived for shard in shards) + sum(count for count in known if count is not None)
    converted, skipped = sum(shard.rows for shard in shards), sum(count for count in known if count is not None)
    if reported == planned.counted_on_workers and arrived == expected:
        # Rows of one id twice balance the counts as well as two source episodes mapping to one id
        # do: when the writer saw duplicate ids, the planned ids must all be there too.
        if not any(shard.errors for shard in shards):
            return
        names = missing()
        if not names:
            return
        raise ConversionError(f"{output}: {len(names)} planned sequence(s) never reached the publish step (lost: {names[0]}"
                              f"{f' and {len(names) - 1} more' if len(names) > 1 else ''}) while others arrived twice; "
                              f"{converted} converted, {skipped} skipped: the runner lost work; nothing was published")
    units = planned.counted_on_workers - reported
    fault = "lost work"
    if units > 0:
        what = f"{units} of {planned.counted_on_workers} source units never reported how many sequences they hold"
    elif units < 0 or arrived > expected:
        what, fault = f"{arrived} sequences reached the publish step, {expected} were planned", "delivered work twice"
    else:
        what = f"{arrived} of {expected} planned sequences reached the publish step"
        names = missing()
        if names:
            what += f" (lost: {names[0]}{f' and {len(names) - 1} more' if len(names) > 1 else ''})"
    raise ConversionError(f"{output}: {what}; {converted} converted, {skipped} skipped: the runner {fault}; nothing was published")


class _PublishFn(beam.DoFn):
    def __init__(self, staging_url: str, output_url: str, meta: DatasetMeta, num_shards: int, sidecar_extra: dict,
                 plan_folder: staged_plan.PlanFolder | None = None, max_skipped: tuple[str, float] = ("count", 0),
                 table: tables.TableSettings | None = None, planned: Planned | None = None, mark_published: bool = False,
                 checks: Checks | None = None):
        self._checks = checks
        self._mark_published = mark_published and not lake.is_lake((table or tables.TableSettings()).format)
        self._planned = planned
        self._max_skipped = max_skipped
        self._table = table or tables.TableSettings()
        self._staging_url = staging_url
        self._output_url = output_url
        self._meta = meta
        self._num_shards = num_shards
        self._sidecar_extra = sidecar_extra
        self._plan_folder = plan_folder

    def process(self, _unused, collected: tuple[list[ShardResult], dict, quality.Partial | None], errors: list[dict],
                tallies: list = ()):
        shards, stats, found = collected
        fs, staging = storage.open_root(self._staging_url)
        _, output = storage.open_root(self._output_url)
        if self._table.format == tables.DEFAULT:  # a retried step (Dataflow retries a bundle) after it published
            published = publish.published_earlier(fs, staging, output, self._sidecar_extra)
            if published is not None:
                if self._mark_published:
                    publish.mark_done(fs, staging)
                yield {"sequences": published["num_sequences"], "timesteps": published["num_timesteps"]}
                return
        if self._planned is not None:
            _check_arrived(output, self._planned, shards, errors, list(tallies),
                           functools.partial(_lost_sequences, fs, staging, self._plan_folder,
                                             errors + [record for shard in shards for record in shard.errors]))
        schema = mixtrain.arrow_schema(self._meta.columns)
        fs.makedirs(storage.join(staging, mixtrain.DATA_DIR), exist_ok=True)
        written = {shard.index for shard in shards}
        for index in range(self._num_shards):
            if index not in written:  # fewer sequences than shards: keep part-00000..N-1 complete
                with fs.open(storage.join(staging, mixtrain.shard_path(index)), "wb") as handle:
                    mixtrain.write_shard(schema.empty_table(), handle)
        fs.pipe_file(storage.join(staging, mixtrain.STATS_FILE), mixtrain.dumps(stats).encode())
        if self._checks is not None:
            header, findings = quality.finish(found or quality.Partial(), self._meta.columns, self._checks.thresholds)
            fs.pipe_file(storage.join(staging, mixtrain.QUALITY_FILE), quality.encode(header, findings))
        records = sorted(errors + [record for shard in shards for record in shard.errors],
                         key=lambda r: (r.get("sequence_id") or "", r.get("source_file") or "", r["error"]))
        _check_publishable(output, sum(shard.rows for shard in shards), records, self._max_skipped)
        if records:
            lines = "".join(json.dumps(record, ensure_ascii=False, sort_keys=True) + "\n" for record in records)
            fs.pipe_file(storage.join(staging, mixtrain.ERRORS_FILE), lines.encode())
        # Units with a skipped sequence are left out: retried next time. (A step retried after its
        # first attempt removed the plan folder keeps the _fingerprints.json that attempt wrote.)
        if self._plan_folder is not None and staged_plan.exists(self._plan_folder, FINGERPRINTS):
            recorded = staged_fingerprints(self._plan_folder)
            units = {key: value for key, value in recorded["units"].items() if not _failed(key, value, records)}
            fs.pipe_file(storage.join(staging, mixtrain.FINGERPRINTS_FILE),
                         mixtrain.dumps({"context": recorded["context"], "units": units}).encode())
        sidecar = mixtrain.sidecar(
            self._meta,
            num_sequences=sum(shard.rows for shard in shards),
            num_timesteps=sum(shard.timesteps for shard in shards),
            num_shards=self._num_shards,
            num_skipped=skipped_counts(records)[0],
            skipped_units=skipped_counts(records)[1],
            non_finite=_sum_counts(shard.non_finite for shard in shards),
            video_notes=_merge_notes(shard.video_notes for shard in shards),
            quality=self._checks is not None,
            **self._sidecar_extra,
        )
        # Not published (a plan folder elsewhere stays: a template's); the journal first: a folder
        # the publication has started on is never resumed.
        # A staging folder beside an object-store output is never without a live claim: the
        # publication's heartbeat is written before the launcher's lease goes with the journal.
        beats = self._table.format in (tables.DEFAULT, "lance")
        with publish.heartbeat(fs, staging) if beats else contextlib.nullcontext():
            for scratch in (resume.RESUME_DIR, SPILL_DIR, staged_plan.PLAN_DIR):
                if fs.exists(storage.join(staging, scratch)):
                    fs.rm(storage.join(staging, scratch), recursive=True)
            tables.publish(fs, staging, output, sidecar, self._table)
        if self._mark_published:
            publish.mark_done(fs, staging)
        yield {"sequences": sidecar["num_sequences"], "timesteps": sidecar["num_timesteps"]}


def _lost_sequences(fs, staging: str, plan_folder: staged_plan.PlanFolder | None, records: list[dict]) -> list[str]:
    """The planned sequence ids (refs that know theirs, reused ids) found neither in a written
    shard nor in an error record, in plan order: what to name when the counts differ."""
    if plan_folder is None:
        return []
    planned = [ref.sequence_id for ref in staged_refs(plan_folder) if ref.sequence_id is not None]
    if staged_plan.exists(plan_folder, KEPT_IDS):
        planned += staged_plan.read_value(plan_folder, KEPT_IDS)
    seen = {record.get("sequence_id") for record in records}
    for path in fs.glob(storage.join(staging, mixtrain.DATA_DIR, "*.parquet")):
        with fs.open(path, "rb") as handle:
            seen.update(pq.read_table(handle, columns=["sequence_id"]).column(0).to_pylist())
    return [sequence_id for sequence_id in planned if sequence_id not in seen]


class WriteMixtrain(beam.PTransform):
    """Write sequences (videos already written) as a finished Mixtrain dataset.

    Args:
      staging_url: this run's staging folder (inside the output).
      output_url: the dataset root to publish to.
      meta: the DatasetMeta from plan (schema and source metadata).
      num_shards: N; row r goes to shard md5(sequence_id) mod N.
      sidecar_extra: converter_version, options and created_at for mixtrain.json.
      on_error: FAIL or SKIP (duplicate ids are then skipped, every copy, and reported).
      max_skipped: ("count", n) or ("fraction", f): under SKIP, more skipped sequences than this
        and nothing is published (nor is a dataset without sequences, ever).
      table: how the staged dataset is published (formats.mixtrain.tables; default: standalone Parquet).
      plan_folder: the plan folder (transforms/staged_plan.py) whose FINGERPRINTS file is published, filtered,
        as _fingerprints.json for the next --incremental run; None: none recorded.
      planned: what the plan promises (`Planned.of(refs, reused)`): the publish step refuses a run
        whose sequences did not all arrive, converted or skipped; None: no check.

      generation: this run's generation in the staging folder's resume journal
        (`formats.mixtrain.resume`): the converted sequences' rows and files are recorded there as
        they are spilled; None: not recorded.
      file_prefix: what the converted rows' file references start with before their
        staging-relative path (a lake run's `runs/<run>/`).
      mark_published: the publish step leaves a marker beside the staging folder for a launcher
        that waits for the run (`publish.take_done`); lake tables name their runs themselves.
      checks: the data-quality checks (`Checks`), computed where rows are spilled (the shard
        writers check only rows no spill file checked), published as DST/_quality.jsonl; None:
        not computed.

    The input is {"sequences": PCollection of converted sequences, "kept": PCollection of
    sequences reused from the previous output (spilled, never recorded for a resumption), optional,
    "resumed": PCollection of (shard, SpilledFile) taken from an interrupted run's journal,
    optional, "errors": PCollection of error records, "tallies": PCollection of (unit, sequences)
    from `ReadSequences`, optional}; the error records end in DST/_errors.jsonl.
    """

    def __init__(self, staging_url: str, output_url: str, meta: DatasetMeta, num_shards: int, sidecar_extra: dict,
                 on_error: str = FAIL, plan_folder: staged_plan.PlanFolder | None = None, max_skipped: tuple[str, float] = ("count", 0),
                 table: tables.TableSettings | None = None, planned: Planned | None = None, generation: int | None = None,
                 file_prefix: str = "", mark_published: bool = False, checks: Checks | None = None):
        super().__init__()
        self._checks = checks
        self._mark_published = mark_published
        self._generation = generation
        self._file_prefix = file_prefix
        self._planned = planned
        self._table = table
        self._max_skipped = max_skipped
        self._staging_url = staging_url
        self._output_url = output_url
        self._meta = meta
        self._num_shards = num_shards
        self._sidecar_extra = sidecar_extra
        self._on_error = on_error
        self._plan_folder = plan_folder

    def expand(self, inputs):
        sequences = inputs["sequences"]
        errors = inputs.get(ERRORS) or sequences.pipeline | "NoErrors" >> beam.Create([])
        tallies = inputs.get(TALLIES) or sequences.pipeline | "NoTallies" >> beam.Create([])
        shard_rows = self._planned.sequences // self._num_shards if self._planned else None
        spilled = [sequences | "SpillRows" >> beam.ParDo(_SpillRowsFn(self._staging_url, self._meta.columns, self._num_shards,
                                                                     shard_rows, self._generation, self._file_prefix, self._checks))]
        if inputs.get("kept") is not None:
            spilled.append(inputs["kept"] | "SpillKeptRows" >> beam.ParDo(
                _SpillRowsFn(self._staging_url, self._meta.columns, self._num_shards, shard_rows, checks=self._checks)))
        if inputs.get("resumed") is not None:
            spilled.append(inputs["resumed"])
        if len(spilled) > 1:
            spilled = [spilled | "AllSpilledRows" >> beam.Flatten()]
        shards = (
            spilled[0]
            | "GroupByShard" >> beam.GroupByKey()
            | "WriteShards" >> beam.ParDo(_WriteShardFn(self._staging_url, self._meta.columns, self._on_error, self._table,
                                                                self._checks))
        )
        # No default element: a global combine's default costs a stage of its own; an empty run's
        # default comes with the side input instead.
        collected = shards | "CollectShards" >> beam.CombineGlobally(MergeShardsFn()).without_defaults()
        return (
            sequences.pipeline
            | "PublishTrigger" >> beam.Create([None])
            | "Publish" >> beam.ParDo(
                _PublishFn(self._staging_url, self._output_url, self._meta, self._num_shards, self._sidecar_extra, self._plan_folder,
                           self._max_skipped, self._table, self._planned, self._mark_published, self._checks),
                beam.pvalue.AsSingleton(collected, default_value=MergeShardsFn().extract_output(MergeShardsFn().create_accumulator())),
                beam.pvalue.AsList(errors),
                beam.pvalue.AsList(tallies),
            )
        )
