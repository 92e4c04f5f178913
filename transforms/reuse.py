"""ReusePrevious: an incremental run's unchanged sequences, taken from the published dataset.

Each previous shard (or, for a Lance dataset, each fragment of its latest version) is read once on
a worker; the rows of sequences to keep become Sequences
again (`mixtrain.table_to_sequences`), and their video and other files are linked (a hard link
on a local disk: no bytes copied) or copied server-side (object stores) into this run's staging
output, so the new version is complete on its own and the old one can be collected.
"""

from __future__ import annotations

import os

import apache_beam as beam
import pyarrow.parquet as pq
from apache_beam.metrics import Metrics

from formats import mixtrain, storage
from formats.mixtrain.tables import lance
from formats.sequence import ColumnSpec, written_files
from transforms import staged_plan

__all__ = ["ReusePrevious", "KEPT_IDS"]

KEPT_IDS = "reused-ids.pkl"  # in the plan folder: the ids of the sequences to keep


class _ReuseShardFn(beam.DoFn):
    def __init__(self, previous_url: str, staging_url: str, columns: list[ColumnSpec], plan_folder: staged_plan.PlanFolder, link_files: bool = True):
        self._link_files = link_files
        self._previous_url = previous_url
        self._staging_url = staging_url
        self._columns = columns
        self._plan_folder = plan_folder
        self._reused = Metrics.counter("mixtrain", "sequences_reused")

    def setup(self):
        self._fs, self._previous = storage.open_root(self._previous_url)
        self._out_fs, self._staging = storage.open_root(self._staging_url)
        self._keep = frozenset(staged_plan.read_value(self._plan_folder, KEPT_IDS))
        # Files that were lossless encodes, not packet copies, stay named as such in the new mixtrain.json.
        self._lance = lance.is_dataset(self._fs, self._previous)
        types = (lance.read_sidecar if self._lance else mixtrain.read_sidecar)(self._fs, self._previous).get("column_types") or {}
        self._notes = {column: entry["not_copied"] for column, entry in types.items() if isinstance(entry, dict) and entry.get("not_copied")}

    def process(self, shard: str):
        if shard.startswith(lance.FRAGMENT_PART):  # a Lance version's fragment; blob videos written to staging
            table = lance.reused_rows(self._fs, self._previous, shard, self._keep, self._out_fs, self._staging)
        else:
            with self._fs.open(storage.join(self._previous, shard), "rb") as handle:
                storage.check_parquet_footer(handle, storage.join(self._previous, shard))
                table = pq.read_table(handle)
        ids = table.column("sequence_id").to_pylist()
        rows = [i for i, sequence_id in enumerate(ids) if sequence_id in self._keep]
        if not rows:
            return
        for sequence in mixtrain.table_to_sequences(table.take(rows), self._columns):
            for relative in written_files(sequence) if self._link_files else ():
                self._link(relative)
            for column, by_sequence in self._notes.items():
                if sequence.sequence_id in by_sequence:
                    sequence.video_notes[column] = by_sequence[sequence.sequence_id]
            self._reused.inc()
            yield sequence

    def _link(self, relative: str) -> None:
        source, target = storage.join(self._previous, relative), storage.join(self._staging, relative)
        if self._lance and self._out_fs.exists(target):  # already staged: a video taken out of a Lance blob
            return
        self._out_fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
        if storage.local_path(self._out_fs, target) is not None and storage.local_path(self._fs, source) is not None:
            try:
                os.link(source, target)
                return
            except OSError:  # another file system: copy
                pass
        if self._fs is self._out_fs:
            self._fs.copy(source, target)
        else:
            self._out_fs.pipe_file(target, self._fs.cat_file(source))


class ReusePrevious(beam.PTransform):
    """Sequences (the ids in the plan folder's KEPT_IDS) from the published dataset at `previous_url`, their files linked
    into `staging_url`.

    Args:
      previous_url: the folder holding the previous version's data/ and files/.
      staging_url: this run's staging folder.
      columns: the output columns (the previous version's schema: it is part of the fingerprint).
      shards: the previous version's shard paths (relative), read one per worker call.
      plan_folder: the plan folder (transforms/staged_plan.py) holding the ids of the sequences to reuse
        as its KEPT_IDS file (written by the launcher: per-sequence data stays out of the graph).
      link_files: link their files into the staging folder (False for lake tables: the rows keep
        their paths, relative to the table location, to files no run rewrites).
    """

    def __init__(self, previous_url: str, staging_url: str, columns: list[ColumnSpec], shards: list[str], plan_folder: staged_plan.PlanFolder,
                 link_files: bool = True):
        super().__init__()
        self._fn = _ReuseShardFn(previous_url, staging_url, columns, plan_folder, link_files)
        self._shards = shards

    def expand(self, pbegin):
        return (
            pbegin
            | "PreviousShards" >> beam.Create(self._shards, reshuffle=False)
            | "SpreadShards" >> beam.Reshuffle()
            | "ReuseRows" >> beam.ParDo(self._fn)
        )
