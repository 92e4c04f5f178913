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
    files = [staged_plan.read_value(plan_folder, read.refs_file(number)) for number in range(6)]
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
