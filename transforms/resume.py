"""ResumeSpilled: the rows an interrupted run recorded (`formats.mixtrain.resume`), checked and
handed to the shard writers as if this run had spilled them.

The launcher decides what is taken (`resume.plan`: fingerprints and sizes); the plan files carry
it to the workers (`stage_resumed`), which check each taken file's SHA-256 against the journal
before its rows are used: a file changed since it was recorded (a bit flipped, a file replaced
with one of the same size) fails the run in one line, and its journal entry is removed so that
the next run converts those sequences again.
"""

from __future__ import annotations

import dataclasses

import apache_beam as beam

from formats import mixtrain, storage
from formats.errors import ConversionError
from formats.mixtrain import resume
from transforms import staged_plan
from transforms.write import SpilledFile

__all__ = ["ResumeSpilled", "stage_resumed", "ENTRIES_PER_FILE"]

ENTRIES_PER_FILE = 8  # journal entries a plan file carries: the checks spread over the workers
_NAME = "resumed-{:06d}.pkl"


def stage_resumed(resumption: resume.Resumption, plan_folder: staged_plan.PlanFolder) -> int:
    """The taken entries to plan files, ENTRIES_PER_FILE each; returns how many files."""
    items = [(entry, positions) for entry, positions in resumption.spilled]
    files = 0
    for start in range(0, len(items), ENTRIES_PER_FILE):
        staged_plan.write_value(plan_folder, _NAME.format(files), items[start:start + ENTRIES_PER_FILE])
        files += 1
    return files


class _CheckSpilledFn(beam.DoFn):
    """A plan file's number -> (shard, SpilledFile) for each taken row's shard, after every file
    those rows stand on is checked against the digest recorded for it."""

    def __init__(self, staging_url: str, plan_folder: staged_plan.PlanFolder, num_shards: int):
        self._staging_url = staging_url
        self._plan_folder = plan_folder
        self._num_shards = num_shards

    def setup(self):
        self._fs, self._root = storage.open_root(self._staging_url)

    def process(self, number: int):
        for entry, positions in staged_plan.read_value(self._plan_folder, _NAME.format(number)):
            spill, _, sha = entry["spill"]
            self._check(spill, sha, entry)
            rows = entry["rows"]
            for position in positions:
                for relative, _, file_sha in rows[position]["files"]:
                    self._check(relative, file_sha, entry)
            # The shard each row goes to now (the shard count may differ from the interrupted run's).
            by_shard: dict[int, list[int]] = {}
            for position in positions:
                by_shard.setdefault(mixtrain.shard_of(rows[position]["id"], self._num_shards), []).append(position)
            record = SpilledFile(storage.join(self._root, spill), tuple(row["id"] for row in rows),
                                 tuple(row["nbytes"] for row in rows), tuple(resume.decode_stats(row["stats"]) for row in rows),
                                 tuple(row["notes"] for row in rows), tuple(entry["batch_ends"]),
                                 facts=tuple(row.get("facts") or {} for row in rows))
            for shard, taken in sorted(by_shard.items()):
                yield shard, dataclasses.replace(record, positions=tuple(taken))

    def _check(self, relative: str, sha: str, entry: dict) -> None:
        path = storage.join(self._root, relative)
        try:
            _, found = resume.digest(self._fs, path)
            what = "its SHA-256 differs"
        except FileNotFoundError:
            found, what = None, "it is missing"
        if found != sha:
            resume.forget(self._fs, self._root, entry)
            raise ConversionError(f"{path}: changed since the interrupted run recorded it ({what}); its sequences "
                                  f"({entry['rows'][0]['id']} and others) will be converted again: rerun the same command")


def _numbers(count: int):
    return range(count)


class ResumeSpilled(beam.PTransform):
    """(shard, SpilledFile) records for the rows a run takes from an interrupted run's journal.

    Args:
      staging_url: the staging folder (the interrupted run's, adopted by this one).
      plan_folder: where `stage_resumed` wrote the taken entries.
      files: how many files it wrote.
      num_shards: this run's shard count.
    """

    def __init__(self, staging_url: str, plan_folder: staged_plan.PlanFolder, files: int, num_shards: int):
        super().__init__()
        self._staging_url = staging_url
        self._plan_folder = plan_folder
        self._files = files
        self._num_shards = num_shards

    def expand(self, pbegin):
        return (pbegin
                | "CountResumedFiles" >> beam.Create([self._files], reshuffle=False)
                | "ResumedFiles" >> beam.FlatMap(_numbers)
                | "SpreadResumedFiles" >> beam.Reshuffle()
                | "CheckResumedRows" >> beam.ParDo(_CheckSpilledFn(self._staging_url, self._plan_folder, self._num_shards)))

