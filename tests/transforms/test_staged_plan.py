"""Plan files (transforms/staged_plan.py): what the launcher writes, the workers read back whole."""

from __future__ import annotations

import dataclasses

from formats.source import SourceRef
from transforms import staged_plan


def test_a_ref_of_a_class_pickle_cannot_name_is_written_by_value(tmp_path):
    @dataclasses.dataclass(frozen=True)
    class LocalRef(SourceRef):  # defined here only: plain pickle cannot name it, cloudpickle writes the class itself
        sequence_id: str

    staged_plan.write_value(str(tmp_path), "refs.pkl", [[LocalRef("a"), LocalRef("b")]])
    back = staged_plan.read_value(str(tmp_path), "refs.pkl")
    assert [[ref.sequence_id for ref in batch] for batch in back] == [["a", "b"]]
    assert type(back[0][0]).__qualname__.endswith("LocalRef")


def test_pieces_come_back_in_order(tmp_path):
    staged_plan.write_pieces(str(tmp_path), "values.pkl", ["context", {"a": 1}, {"b": 2}, {"text": "__main__"}])
    assert list(staged_plan.read_pieces(str(tmp_path), "values.pkl")) == ["context", {"a": 1}, {"b": 2}, {"text": "__main__"}]
    assert staged_plan.exists(str(tmp_path), "values.pkl") and not staged_plan.exists(str(tmp_path), "other.pkl")
