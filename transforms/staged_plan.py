"""The plan's per-unit data as files the workers read, never as state in the job graph.

A job graph carries every DoFn pickled and every `beam.Create` value inline, so refs or
fingerprints put there make the graph grow with the dataset (46.5 MB at 400,000 episodes, issue 20).
The launcher writes them instead under the run's staging folder (`_plan/`, removed before the
dataset is published and with the staging when a run fails) and the graph holds only the folder's
URL and a file count.

Values are pickled by Python's own pickle when that names no class of `__main__`, else by the
cloudpickle Beam pickles a DoFn with (`apache_beam.internal.pickler`): a ref of a source class
registered only on the launcher (a plugin, a test's source, a script) reaches the workers as a
DoFn holding it would. Not through `pickler.dumps` itself, whose bz2 at level 9 took 35 ms per
1,000 refs (35 s at a million episodes); cloudpickle alone 5 ms, pickle 1.5 ms. A large value
is written as a stream of pickled pieces, so that no pickler's memo holds all of it at once.

Unpickling runs code, and the plan folder lives where others may write (the output's bucket): each
piece is signed with a key made for the run (`PlanFolder.create`), which travels in the job graph
(32 bytes) and never in the folder, bound to the file's name and the piece's position. A piece whose
signature does not match is refused before it is unpickled.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import pickle
import secrets
import struct
from collections.abc import Iterable, Iterator
from typing import Any

from apache_beam.internal.cloudpickle import cloudpickle

from formats import storage
from formats.errors import ConversionError

__all__ = ["PLAN_DIR", "PlanFolder", "write_value", "read_value", "write_pieces", "read_pieces", "exists", "unpack"]

PLAN_DIR = "_plan"  # inside the run's staging folder




@dataclasses.dataclass(frozen=True)
class PlanFolder:
    """Where a run's plan files are, and the key that signs them (made by `create`, once per run)."""

    url: str
    key: bytes = dataclasses.field(repr=False)

    @classmethod
    def create(cls, url: str) -> PlanFolder:
        return cls(url, secrets.token_bytes(32))


_HEADER = struct.Struct(">32sQ")  # signature, length of the pickled piece
_END, _END_LENGTH = b"end", 2 ** 64 - 1  # the signed trailer: how many pieces the file holds


def _path(plan: PlanFolder, name: str) -> tuple[Any, str]:
    fs, folder = storage.open_root(plan.url)
    return fs, storage.join(folder, name)


def _signature(plan: PlanFolder, name: str, position: int, data: bytes) -> bytes:
    return hmac.new(plan.key, f"{name}\0{position}\0".encode() + data, hashlib.sha256).digest()


def exists(plan: PlanFolder, name: str) -> bool:
    fs, target = _path(plan, name)
    return fs.exists(target)


def _dumps(value: Any) -> bytes:
    try:
        data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError):  # a class pickle cannot name (a local one)
        data = b"__main__"
    if b"__main__" in data:  # a class only this process has (or the text in a value: cloudpickle is right for both)
        data = cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    return data


def write_pieces(plan: PlanFolder, name: str, pieces: Iterable[Any]) -> None:
    """One file of signed pickled pieces, one after another (read back by `read_pieces`)."""
    fs, target = _path(plan, name)
    fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
    with fs.open(target, "wb") as handle:
        position = 0
        for position, piece in enumerate(pieces, start=1):
            data = _dumps(piece)
            handle.write(_HEADER.pack(_signature(plan, name, position - 1, data), len(data)))
            handle.write(data)
        handle.write(_HEADER.pack(_signature(plan, name, position, _END), _END_LENGTH))  # a file cut between pieces is refused


def read_pieces(plan: PlanFolder, name: str, *, packed: bool = False) -> Iterator[Any]:
    """The pieces `write_pieces` wrote; `packed`: as the pickled bytes they were written as (what
    `unpack` takes), not unpickled here. The whole file is checked (every piece's signature and the
    trailer) before the first piece is handed out: a file cut short between pieces must not have
    had its first pieces used (a worker loads a batch as soon as it has it)."""
    fs, source = _path(plan, name)
    data = memoryview(fs.cat_file(source))
    offset, position, pieces = 0, 0, []
    while True:
        if len(data) - offset < _HEADER.size:
            raise ConversionError(f"{source}: a plan file cut short; refusing to read it (rerun the conversion)")
        signature, length = _HEADER.unpack_from(data, offset)
        if length == _END_LENGTH:
            if not hmac.compare_digest(signature, _signature(plan, name, position, _END)) or offset + _HEADER.size != len(data):
                raise ConversionError(f"{source}: a plan file this run did not write (its signature does not match); refusing to "
                                      "read it")
            break
        piece = bytes(data[offset + _HEADER.size:offset + _HEADER.size + length])
        if len(piece) != length or not hmac.compare_digest(signature, _signature(plan, name, position, piece)):
            raise ConversionError(f"{source}: a plan file this run did not write (its signature does not match); refusing to "
                                  "read it")
        pieces.append(piece)
        offset, position = offset + _HEADER.size + length, position + 1
    del data
    for piece in pieces:
        yield piece if packed else pickle.loads(piece)  # noqa: S301 - signed by this run's key, checked above


def unpack(data: bytes) -> Any:
    """A batch as `read_pieces(packed=True)` handed it out, its signature checked, on a worker of
    the same job (bytes cross Beam's shuffle as they are, where a list of refs was pickled a ref at
    a time)."""
    return pickle.loads(data)  # noqa: S301 - a plan file's piece whose signature was checked


def write_value(plan: PlanFolder, name: str, value: Any) -> None:
    write_pieces(plan, name, [value])


def read_value(plan: PlanFolder, name: str) -> Any:
    (value,) = read_pieces(plan, name)  # the whole file, trailer included, is checked
    return value
