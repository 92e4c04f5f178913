"""Refs pickle as (class, field values) where that rebuilds them exactly (formats.sources.SourceRef.__reduce_ex__),
and by Python's default everywhere else."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest

from formats import samples, sources, storage
from formats.sources import SourceRef
from pipelines import cli
from pipelines.plan import source_options


@pytest.mark.parametrize("source", ["lerobot_v3", "lerobot_v2", "ortf", "rlds", "l5kit"])
def test_every_built_in_ref_takes_the_short_form_and_comes_back_equal(tmp_path, source):
    samples.get(source).small(str(tmp_path / "src"))
    fs, root = storage.open_root(str(tmp_path / "src"))
    args = cli.parse([f"--input={tmp_path / 'src'}", f"--output={tmp_path / 'out'}", *samples.get(source).convert_args])[0]
    _, refs = sources.get(source).plan(fs, root, source_options(sources.get(source), args))
    assert refs
    for ref in refs:
        assert ref.__reduce_ex__(pickle.HIGHEST_PROTOCOL)[0] is type(ref)
        back = pickle.loads(pickle.dumps(ref, protocol=pickle.HIGHEST_PROTOCOL))
        assert back == ref and type(back) is type(ref) and repr(back) == repr(ref)
        assert copy.deepcopy(ref) == ref and copy.copy(ref) == ref


@dataclasses.dataclass(frozen=True)
class KeywordOnly(SourceRef):
    sequence_id: str
    length: int = dataclasses.field(default=0, kw_only=True)


@dataclasses.dataclass(frozen=True)
class WithInitVar(SourceRef):
    sequence_id: str
    scale: dataclasses.InitVar[int]
    length: int = 0

    def __post_init__(self, scale):
        object.__setattr__(self, "length", self.length * scale)


@dataclasses.dataclass(frozen=True)
class NotInInit(SourceRef):
    sequence_id: str
    derived: str = dataclasses.field(init=False, default="")

    def __post_init__(self):
        object.__setattr__(self, "derived", self.sequence_id.upper())


@dataclasses.dataclass(frozen=True, slots=True)
class Slotted(SourceRef):
    sequence_id: str
    length: int


class OwnInit(Slotted):
    __slots__ = ()

    def __init__(self, name: str):
        super().__init__(f"episode_{name}", len(name))


@dataclasses.dataclass(frozen=True)
class OwnReduce(SourceRef):
    sequence_id: str
    length: int

    def __reduce__(self):
        return (OwnReduce, (self.sequence_id.lower(), self.length))


@dataclasses.dataclass(frozen=True)
class Doubling(SourceRef):
    sequence_id: str
    length: int

    def __post_init__(self):
        object.__setattr__(self, "length", self.length * 2)


@dataclasses.dataclass(frozen=True)
class HandInit(SourceRef):
    sequence_id: str
    length: int

    def __init__(self, sequence_id: str, length: int):
        object.__setattr__(self, "sequence_id", f"ep_{sequence_id}")
        object.__setattr__(self, "length", length)


class HandInitBelow(Slotted):
    __slots__ = ()

    def __init__(self, sequence_id: str, length: int):
        super().__init__(f"ep_{sequence_id}", length)


class ReduceMixin:
    __slots__ = ()

    def __reduce__(self):
        return (type(self), (self.sequence_id.lower(), self.length))


@dataclasses.dataclass(frozen=True)
class MixinReduce(SourceRef, ReduceMixin):
    sequence_id: str
    length: int


@dataclasses.dataclass(frozen=True)
class OwnState(SourceRef):
    sequence_id: str
    length: int

    def __getstate__(self):
        return {"sequence_id": self.sequence_id, "length": self.length + 1}


@pytest.mark.parametrize("ref", [KeywordOnly("a", length=5), WithInitVar("a", 3, length=5), NotInInit("a"), OwnInit("abc"),
                                 OwnReduce("ABC", 2), Doubling("a", 3), HandInit("1", 2), HandInitBelow("1", 2),
                                 MixinReduce("ABC", 2), OwnState("a", 1)], ids=lambda ref: type(ref).__name__)
def test_a_ref_the_short_form_would_rebuild_wrongly_keeps_its_own_pickling(ref):
    back = pickle.loads(pickle.dumps(ref, protocol=pickle.HIGHEST_PROTOCOL))
    assert type(back) is type(ref)
    if isinstance(ref, (OwnReduce, MixinReduce)):  # its own reduce decides
        assert back == type(ref)("abc", 2)
    elif isinstance(ref, OwnState):  # its own state decides
        assert back.length == 2
    else:
        assert dataclasses.astuple(back) == dataclasses.astuple(ref) and back == ref
        assert copy.copy(ref) == ref and copy.deepcopy(ref) == ref


def test_a_plain_slotted_ref_takes_the_short_form():
    ref = Slotted("episode_000001", 7)
    assert ref.__reduce_ex__(pickle.HIGHEST_PROTOCOL) == (Slotted, ("episode_000001", 7))
    assert pickle.loads(pickle.dumps(ref)) == ref
