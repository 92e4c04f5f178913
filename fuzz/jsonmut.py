"""Structure-aware mutation of JSON documents driven by atheris.FuzzedDataProvider.

A real document (from a fixture or a sample writer) is changed in a few places the fuzzer picks:
a value replaced by one of another type, a key removed or added, a huge or non-finite number,
deep nesting, control and bidi characters in strings and keys. The result is JSON text a
writer could have produced (or, for the "raw text" hostiles, a parser must refuse): what a
byte-level mutator reaches only by luck.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import atheris

# Text substituted for a placeholder after json.dumps: values json.dumps cannot write itself.
_RAW = {
    "deep_list": "[" * 100_000 + "]" * 100_000,  # past any recursion limit
    "deep_object": '{"a":' * 2_000 + "0" + "}" * 2_000,
    "long_int": "9" * 5_000,  # past Python's int digit limit (4300): ValueError, not JSONDecodeError
    "huge_float": "1e999",  # inf once parsed
    "nan": "NaN",
    "neg_zero": "-0.0",
}

HOSTILE: list[Any] = [
    None, True, False, 0, -1, 1, 2**31, 2**32 + 1, 2**53 + 1, 2**63, -(2**63) - 1, 2**64, 10**30, 1e308, -1e308, 0.5,
    10**400, -(10**400),  # integers past a float's range: float() and math.isfinite raise OverflowError
    float("nan"), float("inf"), -float("inf"), "", " ", "0", "1e9", "true", "null", "\x00", "\x1b[2J\x07",
    "\u202e\u2028\u2066", "../../../etc/passwd", "/abs/path", "a/../../b", "{chunk_index}", "{nope}", "%s%n",
    "a" * 5_000, "\ud800", [], {}, [None], [[]], [1, "a", None], {"": None}, {"type": None}, [-1], [0], [2**40],
]


def _hostile(fdp: atheris.FuzzedDataProvider) -> Any:
    pick = fdp.ConsumeIntInRange(0, len(HOSTILE) + len(_RAW) + 2)
    if pick < len(HOSTILE):
        return copy.deepcopy(HOSTILE[pick])
    pick -= len(HOSTILE)
    if pick < len(_RAW):
        return _Raw(list(_RAW)[pick])
    if pick == len(_RAW):
        return fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 40))
    if pick == len(_RAW) + 1:
        return fdp.ConsumeInt(8)
    return fdp.ConsumeRegularFloat()


class _Raw:
    """A placeholder replaced by raw text from _RAW after dumping."""

    def __init__(self, name: str) -> None:
        self.name = name


def _similar(value: Any, fdp: atheris.FuzzedDataProvider) -> Any:
    """A value of another type that still means something close (a number as a string...)."""
    choice = fdp.ConsumeIntInRange(0, 4)
    if choice == 0:
        return str(value)
    if choice == 1:
        return [value]
    if choice == 2:
        return {"value": value}
    if choice == 3 and isinstance(value, (int, float)) and not isinstance(value, bool):
        return -value if fdp.ConsumeBool() else value * (2**fdp.ConsumeIntInRange(1, 70))
    return None


def _mutate_node(node: Any, fdp: atheris.FuzzedDataProvider, depth: int) -> Any:
    if isinstance(node, dict) and node and fdp.ConsumeIntInRange(0, 3):
        keys = list(node)
        key = keys[fdp.ConsumeIntInRange(0, len(keys) - 1)]
        op = fdp.ConsumeIntInRange(0, 5)
        if op == 0:
            del node[key]
        elif op == 1:
            node[key] = _hostile(fdp)
        elif op == 2:
            node[key] = _similar(node[key], fdp)
        elif op == 3:
            node[fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 12))] = _hostile(fdp)
        else:
            node[key] = _mutate_node(node[key], fdp, depth + 1)
        return node
    if isinstance(node, list) and node and fdp.ConsumeIntInRange(0, 3):
        index = fdp.ConsumeIntInRange(0, len(node) - 1)
        op = fdp.ConsumeIntInRange(0, 5)
        if op == 0:
            del node[index]
        elif op == 1:
            node[index] = _hostile(fdp)
        elif op == 2:
            node.append(copy.deepcopy(node[index]))
        elif op == 3:
            node.insert(index, _hostile(fdp))
        else:
            node[index] = _mutate_node(node[index], fdp, depth + 1)
        return node
    return _hostile(fdp) if fdp.ConsumeBool() else _similar(node, fdp)


def mutate(document: Any, fdp: atheris.FuzzedDataProvider, max_edits: int = 4) -> Any:
    """A deep copy of `document` with 1..max_edits structural edits (placeholders may remain: see dumps)."""
    document = copy.deepcopy(document)
    for _ in range(fdp.ConsumeIntInRange(1, max_edits)):
        document = _mutate_node(document, fdp, 0)
    return document


def dumps(document: Any) -> bytes:
    """JSON text of a mutated document, raw-text placeholders expanded."""
    raws: list[str] = []

    def default(value: Any) -> str:
        if isinstance(value, _Raw):
            raws.append(value.name)
            return f"\x00RAW{len(raws) - 1}\x00"
        raise TypeError(type(value).__name__)

    text = json.dumps(document, default=default)
    for number, name in enumerate(raws):
        text = text.replace(json.dumps(f"\x00RAW{number}\x00"), _RAW[name], 1)
    return text.encode("utf-8", "surrogatepass")


def to_python(document: Any) -> Any:
    """A mutated document as plain Python values (placeholders become strings): for Parquet rows."""
    if isinstance(document, _Raw):
        return _RAW[document.name][:64]
    if isinstance(document, dict):
        return {str(k): to_python(v) for k, v in document.items()}
    if isinstance(document, list):
        return [to_python(v) for v in document]
    return document
