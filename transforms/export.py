"""An export of a Mixtrain dataset to another layout as Beam steps: each shard's rows keyed by the
output group they go to, each group written by one worker, then the dataset-wide files once.

What a group is and how it is written is the writer's (formats/exports/): this module only
moves rows to it, so it names no format.
"""

from __future__ import annotations

from typing import Any, Protocol

import apache_beam as beam
import pyarrow as pa
import pyarrow.compute as pc

from formats import storage
from formats.arrow_types import from_ipc, to_ipc
from formats.errors import FormatError
from formats.exports import journal
from formats.mixtrain import publish
from formats.read.reader import open_dataset
from transforms import staged_plan

WRITER_FILE = "writer"


class Writer(Protocol):
    columns: list[str]
    group_of: dict[str, int]

    def write_group(self, group: int, rows: pa.Table, dataset, out_fs, out_root: str) -> tuple[pa.Table, list[str]]: ...

    def write_meta(self, records: list[pa.Table], out_fs, out_root: str) -> Any: ...


class _StagedWriter:
    """The writer as a plan file (transforms/staged_plan.py) its steps load, not pickled into each
    of them: it holds an entry per episode, about 0.56 MB a step in the job graph at 100,000
    episodes, which past about 500,000 passed Dataflow's 10 MB limit on a job request."""

    def __init__(self, plan_folder: staged_plan.PlanFolder) -> None:
        self._plan_folder = plan_folder

    def load(self) -> Writer:
        return staged_plan.read_value(self._plan_folder, WRITER_FILE)


class _ReadRowsFn(beam.DoFn):
    """A shard's rows (the writer's columns only), one table per output group still to write."""

    def __init__(self, url: str, writer: _StagedWriter, recorded: frozenset[int]) -> None:
        self._url, self._staged, self._recorded = url, writer, recorded

    def setup(self) -> None:
        self._dataset = open_dataset(self._url)
        self._writer = self._staged.load()

    def process(self, shard: str):
        table = self._dataset.read_shard(shard, self._writer.columns)
        groups = pa.array([self._writer.group_of.get(sequence_id, -1) for sequence_id in table.column("sequence_id").to_pylist()],
                          pa.int64())
        for group in sorted(set(groups.to_pylist()) - {-1} - self._recorded):
            # Bytes, not a pa.Table: Beam's state cache sizes a Python object by walking it (1.8 s of a
            # 3,200-episode export for one table), bytes by their length.
            yield group, to_ipc(table.filter(pc.equal(groups, group)))


class _WriteGroupFn(beam.DoFn):
    """A group written, then recorded in the staging folder's journal (when `identity` is given)
    for a resumption to take."""

    def __init__(self, url: str, writer: _StagedWriter, out_url: str, identity: str | None) -> None:
        self._url, self._staged, self._out_url, self._identity = url, writer, out_url, identity

    def setup(self) -> None:
        self._dataset = open_dataset(self._url)
        self._out_fs, self._out_root = storage.open_root(self._out_url)
        self._writer = self._staged.load()

    def process(self, item):
        group, tables = item
        rows = pa.concat_tables([from_ipc(blob) for blob in tables])
        records, files = self._writer.write_group(group, rows, self._dataset, self._out_fs, self._out_root)
        if self._identity is not None:
            journal.record_group(self._out_fs, self._out_root, self._identity, group, records, files)
            publish.stop_point("export", "group-recorded")
        yield to_ipc(records)  # the group's episode records, as Arrow IPC bytes


class _TakeRecordedFn(beam.DoFn):
    """A group an interrupted export wrote: its files' digests checked, its records taken."""

    def __init__(self, out_url: str, identity: str, groups: int) -> None:
        self._out_url, self._identity, self._groups = out_url, identity, groups

    def process(self, group: int):
        out_fs, out_root = storage.open_root(self._out_url)
        entry = journal.recorded_group(out_fs, out_root, self._identity, self._groups, group)
        if entry is None:
            raise FormatError(f"{storage.join(out_root, journal.GROUPS_DIR)}: the record of group {group} changed while this export "
                              "ran; run the same command again")
        journal.check_group(out_fs, out_root, entry)
        yield journal.records_bytes(entry)


class _WriteMetaFn(beam.DoFn):
    def __init__(self, writer: _StagedWriter, out_url: str) -> None:
        self._staged, self._out_url = writer, out_url

    def process(self, groups: list[bytes]):
        out_fs, out_root = storage.open_root(self._out_url)
        yield self._staged.load().write_meta([from_ipc(blob) for blob in groups], out_fs, out_root)


def export(pipeline: beam.Pipeline, url: str, shards: list[str], writer: Writer, out_url: str, plan_folder: staged_plan.PlanFolder,
           *, identity: str | None = None, groups: int = 0, recorded: frozenset[int] = frozenset()) -> beam.PCollection:
    """The export's steps; the result holds what `write_meta` returned, once. The writer is written
    to `plan_folder` now, for the steps to load (`_StagedWriter`). With `identity`, each group
    written is recorded in `out_url`'s journal (formats/exports/journal.py), and the `recorded`
    groups of an interrupted export are taken from it (their files checked), not written."""
    staged_plan.write_value(plan_folder, WRITER_FILE, writer)
    writer = _StagedWriter(plan_folder)
    written = (pipeline
               | "Shards" >> beam.Create(shards)
               | "ReadRows" >> beam.ParDo(_ReadRowsFn(url, writer, recorded))
               | "ByGroup" >> beam.GroupByKey()
               | "WriteGroups" >> beam.ParDo(_WriteGroupFn(url, writer, out_url, identity)))
    if recorded:
        taken = (pipeline
                 | "Recorded" >> beam.Create(sorted(recorded))
                 | "TakeRecorded" >> beam.ParDo(_TakeRecordedFn(out_url, identity, groups)))
        written = (written, taken) | "Episodes" >> beam.Flatten()
    return (written
            | "AllEpisodes" >> beam.combiners.ToList()
            | "WriteMeta" >> beam.ParDo(_WriteMetaFn(writer, out_url)))
