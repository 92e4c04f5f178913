"""Plan files (transforms/staged_plan.py): what the launcher writes, the workers read back whole."""

from __future__ import annotations

import dataclasses

import pytest

from formats.errors import ConversionError
from formats.sources import SourceRef
from transforms import staged_plan


def test_a_ref_of_a_class_pickle_cannot_name_is_written_by_value(tmp_path):
    @dataclasses.dataclass(frozen=True)
    class LocalRef(SourceRef):  # defined here only: plain pickle cannot name it, cloudpickle writes the class itself
        sequence_id: str

    plan = staged_plan.PlanFolder.create(str(tmp_path))
    staged_plan.write_value(plan, "refs.pkl", [[LocalRef("a"), LocalRef("b")]])
    back = staged_plan.read_value(plan, "refs.pkl")
    assert [[ref.sequence_id for ref in batch] for batch in back] == [["a", "b"]]
    assert type(back[0][0]).__qualname__.endswith("LocalRef")


def test_pieces_come_back_in_order(tmp_path):
    plan = staged_plan.PlanFolder.create(str(tmp_path))
    staged_plan.write_pieces(plan, "values.pkl", ["context", {"a": 1}, {"b": 2}, {"text": "__main__"}])
    assert list(staged_plan.read_pieces(plan, "values.pkl")) == ["context", {"a": 1}, {"b": 2}, {"text": "__main__"}]
    assert staged_plan.exists(plan, "values.pkl") and not staged_plan.exists(plan, "other.pkl")


class _Boom:
    def __reduce__(self):  # unpickling this runs code: what a planted plan file would do
        return (exec, ("raise SystemExit('planted code ran')",))


@pytest.mark.parametrize("tamper", ["planted", "flipped", "renamed", "other_run", "cut", "cut_between_pieces", "empty"])
def test_a_plan_file_this_run_did_not_write_is_refused_before_unpickling(tmp_path, tamper):
    """The plan folder lives where others may write (the output's bucket); unpickling runs code."""
    import pickle
    import shutil

    plan = staged_plan.PlanFolder.create(str(tmp_path))
    staged_plan.write_value(plan, "refs-000000.pkl", ["a"])
    staged_plan.write_value(plan, "refs-000001.pkl", ["b"])
    target = tmp_path / "refs-000000.pkl"
    if tamper == "planted":  # a pickle with a made-up header
        data = pickle.dumps(_Boom())
        target.write_bytes(staged_plan._HEADER.pack(b"\0" * 32, len(data)) + data)
    elif tamper == "flipped":
        data = bytearray(target.read_bytes())
        data[-3] ^= 1
        target.write_bytes(bytes(data))
    elif tamper == "renamed":  # another file of the same run in its place: a batch read twice
        shutil.copy(tmp_path / "refs-000001.pkl", target)
    elif tamper == "other_run":
        staged_plan.write_value(staged_plan.PlanFolder.create(str(tmp_path)), "refs-000000.pkl", ["a"])
    elif tamper == "cut":
        target.write_bytes(target.read_bytes()[:-1])
    elif tamper == "cut_between_pieces":  # the trailer gone: pieces read so far are not taken as the whole file
        target.write_bytes(target.read_bytes()[:-staged_plan._HEADER.size])
    else:
        target.write_bytes(b"")
    with pytest.raises(ConversionError, match=r"refs-000000.pkl: a plan file"):
        staged_plan.read_value(plan, "refs-000000.pkl")
    assert staged_plan.read_value(plan, "refs-000001.pkl") == ["b"]
    assert "key=" not in repr(plan)  # the key is not printed


@pytest.mark.parametrize("packed", [False, True])
def test_a_plan_file_cut_between_pieces_hands_out_no_piece(tmp_path, packed):
    """A worker loads a batch as soon as it has it: a file whose last pieces and trailer are gone
    is refused before its first piece comes out, packed or not."""
    plan = staged_plan.PlanFolder.create(str(tmp_path))
    staged_plan.write_pieces(plan, "refs-000000.pkl", [["a"], ["b"], ["c"]])
    target = tmp_path / "refs-000000.pkl"
    whole = target.read_bytes()
    assert [staged_plan.unpack(piece) for piece in staged_plan.read_pieces(plan, "refs-000000.pkl", packed=True)] == [["a"], ["b"], ["c"]]
    offset = 0
    for _ in range(2):  # the first two pieces kept whole, the third and the trailer gone
        offset += staged_plan._HEADER.size + staged_plan._HEADER.unpack_from(whole, offset)[1]
    target.write_bytes(whole[:offset])
    pieces = staged_plan.read_pieces(plan, "refs-000000.pkl", packed=packed)
    with pytest.raises(ConversionError, match=r"refs-000000.pkl: a plan file"):
        next(pieces)
