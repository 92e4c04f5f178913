"""An export of a Mixtrain dataset to another layout as Beam steps: each shard's rows keyed by the
output group they go to, each group written by one worker, then the dataset-wide files once.

What a group is and how it is written is the writer's (formats/exports/): this module only
moves rows to it, so it names no format.
"""

from __future__ import annotations

import pickle
from typing import Any, Protocol

import apache_beam as beam
import pyarrow as pa
import pyarrow.compute as pc

from formats import storage
from formats.read.reader import open_dataset


class Writer(Protocol):
    columns: list[str]
    group_of: dict[str, int]

    def write_group(self, group: int, rows: pa.Table, dataset, out_fs, out_root: str) -> list[dict]: ...

    def write_meta(self, records: list[dict], out_fs, out_root: str) -> Any: ...


class _ReadRowsFn(beam.DoFn):
    """A shard's rows (the writer's columns only), one table per output group."""

    def __init__(self, url: str, writer: Writer) -> None:
        self._url, self._writer = url, writer

    def setup(self) -> None:
        self._dataset = open_dataset(self._url)

    def process(self, shard: str):
        table = self._dataset.read_shard(shard, self._writer.columns)
        groups = pa.array([self._writer.group_of.get(sequence_id, -1) for sequence_id in table.column("sequence_id").to_pylist()],
                          pa.int64())
        for group in sorted(set(groups.to_pylist()) - {-1}):
            yield group, _to_bytes(table.filter(pc.equal(groups, group)))


def _to_bytes(table: pa.Table) -> bytes:
    """Rows between steps as Arrow IPC bytes: Beam's state cache sizes a Python object by walking
    it (1.8 s of a 3,200-episode export for one pa.Table), bytes by their length."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _from_bytes(blob: bytes) -> pa.Table:
    return pa.ipc.open_stream(blob).read_all()


class _WriteGroupFn(beam.DoFn):
    def __init__(self, url: str, writer: Writer, out_url: str) -> None:
        self._url, self._writer, self._out_url = url, writer, out_url

    def setup(self) -> None:
        self._dataset = open_dataset(self._url)
        self._out_fs, self._out_root = storage.open_root(self._out_url)

    def process(self, item):
        group, tables = item
        rows = pa.concat_tables([_from_bytes(blob) for blob in tables])
        # The group's episode records as one pickled element, for the same reason as _to_bytes.
        yield pickle.dumps(self._writer.write_group(group, rows, self._dataset, self._out_fs, self._out_root))


class _WriteMetaFn(beam.DoFn):
    def __init__(self, writer: Writer, out_url: str) -> None:
        self._writer, self._out_url = writer, out_url

    def process(self, groups: list[bytes]):
        out_fs, out_root = storage.open_root(self._out_url)
        yield self._writer.write_meta([record for blob in groups for record in pickle.loads(blob)], out_fs, out_root)


def export(pipeline: beam.Pipeline, url: str, shards: list[str], writer: Writer, out_url: str) -> beam.PCollection:
    """The export's steps; the result holds what `write_meta` returned, once."""
    return (pipeline
            | "Shards" >> beam.Create(shards)
            | "ReadRows" >> beam.ParDo(_ReadRowsFn(url, writer))
            | "ByGroup" >> beam.GroupByKey()
            | "WriteGroups" >> beam.ParDo(_WriteGroupFn(url, writer, out_url))
            | "AllEpisodes" >> beam.combiners.ToList()
            | "WriteMeta" >> beam.ParDo(_WriteMetaFn(writer, out_url)))
