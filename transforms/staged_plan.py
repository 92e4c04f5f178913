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
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterable, Iterator
from typing import Any

from apache_beam.internal.cloudpickle import cloudpickle

from formats import storage

__all__ = ["PLAN_DIR", "write_value", "read_value", "write_pieces", "read_pieces", "exists"]

PLAN_DIR = "_plan"  # inside the run's staging folder


def _path(plan_url: str, name: str) -> tuple[Any, str]:
    fs, folder = storage.open_root(plan_url)
    return fs, storage.join(folder, name)


def exists(plan_url: str, name: str) -> bool:
    fs, target = _path(plan_url, name)
    return fs.exists(target)


def _dumps(value: Any) -> bytes:
    try:
        data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError):  # a class pickle cannot name (a local one)
        data = b"__main__"
    if b"__main__" in data:  # a class only this process has (or the text in a value: cloudpickle is right for both)
        data = cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    return data


def write_pieces(plan_url: str, name: str, pieces: Iterable[Any]) -> None:
    """One file of pickled pieces, one after another (read back by `read_pieces`)."""
    fs, target = _path(plan_url, name)
    fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
    with fs.open(target, "wb") as handle:
        for piece in pieces:
            handle.write(_dumps(piece))


def read_pieces(plan_url: str, name: str) -> Iterator[Any]:
    fs, source = _path(plan_url, name)
    data = fs.cat_file(source)
    stream = io.BytesIO(data)
    while stream.tell() < len(data):
        yield pickle.load(stream)


def write_value(plan_url: str, name: str, value: Any) -> None:
    write_pieces(plan_url, name, [value])


def read_value(plan_url: str, name: str) -> Any:
    return next(read_pieces(plan_url, name))
