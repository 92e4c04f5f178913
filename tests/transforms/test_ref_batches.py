"""How planned refs are cut into the batches the workers load (transforms/read.py ref_batches)."""

from __future__ import annotations

import dataclasses

from formats.sources import SourceRef
from transforms import read
from transforms.read import ref_batches, stage_refs


@dataclasses.dataclass(frozen=True)
class Ref(SourceRef):
    sequence_id: str
    group: str | None = None

    @property
    def read_group(self) -> str | None:
        return self.group


def _shape(batches) -> list[list[str]]:
    return [[ref.sequence_id for ref in batch] for batch in batches]


def test_consecutive_refs_of_one_group_form_a_batch_and_ungrouped_refs_are_alone():
    refs = [Ref(f"e{i}", group) for i, group in enumerate(["a"] * 20 + [None, None] + ["b"] * 10 + ["a"] * 3 + [None])]
    batches = ref_batches(refs)
    # 36 refs: pieces of at most ceil(36 / 16) = 3 refs, groups cut evenly, plan order kept.
    assert [len(batch) for batch in batches] == [3, 3, 3, 3, 3, 3, 2, 1, 1, 3, 3, 2, 2, 3, 1]
    assert [ref for batch in batches for ref in batch] == refs
    assert all(len({ref.read_group for ref in batch}) == 1 for batch in batches)
    assert _shape(batches)[7:9] == [["e20"], ["e21"]]


def test_a_large_dataset_keeps_whole_groups_up_to_the_batch_limit():
    refs = [Ref(f"e{i}", f"file{i // 500}") for i in range(50_000)] + [Ref("x", "big")] * 5000
    sizes = [len(batch) for batch in ref_batches(refs)]
    assert sizes == [500] * 100 + [1667, 1667, 1666]  # the big group: 3 even pieces of at most MAX_BATCH_REFS
    assert read.MAX_BATCH_REFS == 2000


def test_refs_without_groups_stay_one_per_batch():
    refs = [Ref(f"e{i}") for i in range(5)]
    assert _shape(ref_batches(refs)) == [["e0"], ["e1"], ["e2"], ["e3"], ["e4"]]


def test_plan_files_hold_whole_batches(tmp_path, monkeypatch):
    monkeypatch.setattr(read, "REFS_PER_FILE", 4)
    refs = [Ref(f"e{i}", "g" if i < 30 else None) for i in range(33)]  # pieces of 3 (33 / 16), then ones
    from transforms import staged_plan

    plan_folder = staged_plan.PlanFolder.create(str(tmp_path))
    assert stage_refs(refs, plan_folder) == 6
    files = [list(staged_plan.read_pieces(plan_folder, read.refs_file(number))) for number in range(6)]
    assert [[len(batch) for batch in batches] for batches in files] == [[3, 3]] * 5 + [[1, 1, 1]]


def test_batches_cross_the_shuffle_packed_and_a_missing_plan_file_is_one_line(tmp_path, monkeypatch):
    """Each batch leaves its plan file as one bytes value (Beam's coders copy bytes, where they
    pickled every ref of a list on its own), unpacked once by the loading worker."""
    import pytest

    from formats.errors import ConversionError
    from transforms import staged_plan

    monkeypatch.setattr(read, "REFS_PER_FILE", 4)
    refs = [Ref(f"e{i}", "g" if i < 30 else None) for i in range(33)]
    plan_folder = staged_plan.PlanFolder.create(str(tmp_path))
    files = stage_refs(refs, plan_folder)
    batches = read._ReadRefBatchesFn(plan_folder)
    packed = [value for number in range(files) for value in batches.process(number)]
    assert all(isinstance(value, bytes) for value in packed) and len(packed) == 13
    assert [ref for value in packed for ref in staged_plan.unpack(value)] == refs
    assert [len(staged_plan.unpack(value)) for value in packed] == [3] * 10 + [1, 1, 1]
    (tmp_path / read.refs_file(5)).unlink()
    with pytest.raises(ConversionError, match=r"refs-000005\.pkl: the run's plan file is missing"):
        list(batches.process(5))


@dataclasses.dataclass(frozen=True)
class StepsRef(Ref):
    steps: int | None = None

    @property
    def estimated_steps(self) -> int | None:
        return self.steps


def test_batches_dealt_to_known_workers_are_a_multiple_of_them_and_equal():
    """The re-encode workload of issue 28: 64 equal episodes in data files of 50 and 14. Cut by
    group they made 17 batches for 16 workers (one worker did two); dealt, 16 of 4."""
    refs = [StepsRef(f"e{i}", f"file{i // 50}", 300) for i in range(64)]
    batches = ref_batches(refs, workers=16)
    assert [len(batch) for batch in batches] == [4] * 16
    assert [ref for batch in batches for ref in batch] == refs
    assert _shape(batches)[12] == [["e48", "e49", "e50", "e51"]][0]  # a cut inside a read group is allowed
    assert len(ref_batches(refs)) == 17  # the rule where the workers are not known, unchanged


def test_dealt_batches_hold_equal_steps_not_equal_counts():
    lengths = [999] * 4 + [99] * 40 + [9] * 400  # 4,000 + 4,000 + 4,000 (each ref's steps + 1)
    refs = [StepsRef(f"e{i}", "g", length) for i, length in enumerate(lengths)]
    batches = ref_batches(refs, workers=3)
    assert [len(batch) for batch in batches] == [4, 40, 400]
    steps = [sum(1 + ref.steps for ref in batch) for batch in ref_batches(refs, workers=7)]
    # Each batch within one ref's cost (the largest, 1,000) of its share, 12,000 / 7.
    assert len(steps) == 7 and all(abs(value - 12_000 / 7) <= 1000 for value in steps)


def test_dealt_batches_count_refs_when_some_steps_are_unknown():
    refs = [StepsRef(f"e{i}", None, None if i == 3 else 1000 * i) for i in range(12)]
    assert [len(batch) for batch in ref_batches(refs, workers=4)] == [3, 3, 3, 3]


def test_dealt_batches_stay_under_the_batch_limit_and_a_few_refs_go_one_each():
    refs = [StepsRef(f"e{i}", f"file{i // 500}", 50) for i in range(50_000)]
    sizes = [len(batch) for batch in ref_batches(refs, workers=8)]
    assert len(sizes) == 32 and set(sizes) == {1562, 1563} and max(sizes) <= read.MAX_BATCH_REFS  # 4 per worker
    assert _shape(ref_batches(refs[:3], workers=16)) == [["e0"], ["e1"], ["e2"]]
    assert ref_batches([], workers=16) == []
    assert [len(batch) for batch in ref_batches(refs[:5000], workers=1)] == [1667, 1666, 1667]


def test_stage_refs_deals_for_the_workers_it_is_given(tmp_path):
    from transforms import staged_plan

    refs = [StepsRef(f"e{i}", "g", 10) for i in range(40)]
    plan_folder = staged_plan.PlanFolder.create(str(tmp_path))
    assert stage_refs(refs, plan_folder, workers=8) == 8  # a file each: the shuffle of the file numbers deals them
    files = [list(staged_plan.read_pieces(plan_folder, read.refs_file(number))) for number in range(8)]
    assert [[len(batch) for batch in batches] for batches in files] == [[5]] * 8
    packed = list(staged_plan.read_pieces(plan_folder, read.refs_file(7), packed=True))
    assert len(packed) == 1 and staged_plan.unpack(packed[0]) == refs[35:]


def test_dealt_batches_take_numpy_steps_and_keep_every_ref_when_one_outweighs_a_share():
    import numpy as np

    refs = [StepsRef(f"e{i}", "g", length) for i, length in enumerate([1, 1, 1, 37])]
    numpy_refs = [StepsRef(ref.sequence_id, "g", np.int64(ref.steps)) for ref in refs]
    assert [len(batch) for batch in ref_batches(numpy_refs, workers=4)] == [len(batch) for batch in ref_batches(refs, workers=4)]
    # 4,000 refs of no steps and one of a billion, 1 worker: 3 batches asked, the heavy ref's own
    # share left one empty; no ref lost or moved.
    refs = [StepsRef(f"e{i}", "g", 0) for i in range(4000)] + [StepsRef("heavy", "g", 10**9)]
    batches = ref_batches(refs, workers=1)
    assert [len(batch) for batch in batches] == [4000, 1] and [ref for batch in batches for ref in batch] == refs


def test_the_batches_are_dealt_for_the_local_runners_partitions_only():
    """--direct_num_workers is the local runner's partition count (0: Beam's one per CPU); other
    runners keep the batches cut by read group (None)."""
    import os

    from apache_beam.options.pipeline_options import PipelineOptions

    from pipelines.conversion import local_partitions

    assert local_partitions(PipelineOptions([])) == 1
    assert local_partitions(PipelineOptions(["--direct_num_workers=3", "--direct_running_mode=multi_processing"])) == 3
    assert local_partitions(PipelineOptions(["--direct_num_workers=0"])) == os.cpu_count()
    assert local_partitions(PipelineOptions(["--runner=DirectRunner", "--direct_num_workers=5"])) == 5
    assert local_partitions(PipelineOptions(["--runner=DataflowRunner", "--direct_num_workers=5"])) is None
    assert local_partitions(PipelineOptions(["--runner=DaskRunner"])) is None
