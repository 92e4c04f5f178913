"""The types of mixtrain.json (a lake table's `mixtrain` property, a Lance dataset's metadata) and
of stats.json, checked before anything reads them.

Why: a sidecar is input like any other. The reader, validate, inspect and the report each index
into it (`entry["dim"]`, `resolution["width"]`, `len(entry["mean"])`), so a dimension written as a
string, a column entry that is null or a stats.json that is a list used to end in a traceback
somewhere inside them. One check here, run where a sidecar is opened, turns each into one
FormatError naming the file and the key. Only keys this converter writes are checked; unknown keys
are left alone (a later version may add some).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from formats.errors import FormatError
from formats.sequence import finite_number, is_int, quoted

__all__ = ["check_sidecar", "check_stats", "TRAJECTORY_DTYPES"]

# dtypes a trajectory (or a bytes cell) may declare: numbers numpy reads from raw little-endian bytes.
TRAJECTORY_DTYPES = {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32", "float64"}
LAYOUTS = ("lists", "bytes")


_is_int = is_int


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# Each check: (test, what the value must be). A key absent is fine unless `_REQUIRED` names it.
Check = tuple[Callable[[Any], bool], str]
_STRING: Check = (lambda v: isinstance(v, str), "a string")
_BOOL: Check = (lambda v: isinstance(v, bool), "true or false")
_OBJECT: Check = (lambda v: isinstance(v, dict), "an object")
_COUNT: Check = (lambda v: _is_int(v) and 0 <= v < 1 << 63, "a non-negative integer below 2**63")  # len(dataset) takes it
_DIM: Check = (lambda v: _is_int(v) and 0 < v < 1 << 31, "a positive integer below 2**31 (an Arrow fixed-size list's limit)")
_POSITIVE: Check = (lambda v: finite_number(v) and v > 0, "a positive number")  # readers take float(fps)
_STRINGS: Check = (lambda v: isinstance(v, list) and all(isinstance(item, str) for item in v), "a list of strings")
_INTS: Check = (lambda v: isinstance(v, list) and all(_is_int(item) for item in v), "a list of integers")
_SIZE: Check = (lambda v: isinstance(v, dict) and all(_is_int(v.get(k)) and 0 < v[k] < 1 << 31 for k in ("width", "height")),
                "an object with positive integer width and height below 2**31")
_UNITS: Check = (lambda v: isinstance(v, (str, dict)) or (isinstance(v, list) and all(isinstance(item, (str, type(None))) for item in v)),
                 "a string, a list of strings or an object")

TOP_LEVEL: dict[str, Check] = {
    "mixtrain": _STRING, "column_types": _OBJECT, "source": _OBJECT, "converter": _OBJECT, "created_at": _STRING,
    "num_sequences": _COUNT, "num_timesteps": _COUNT, "num_shards": _COUNT, "num_skipped": _COUNT, "num_skipped_units": _COUNT,
    "shards": _STRINGS, "stats": _STRING, "errors": _STRING, "quality": _STRING, "non_finite_values": _OBJECT,
    "incremental": _OBJECT, "table": _OBJECT,
}
NESTED: dict[str, dict[str, Check]] = {
    "source": {"format": _STRING, "uri": _STRING},
    "converter": {"name": _STRING, "version": _STRING, "options": _OBJECT},
}
COLUMN: dict[str, Check] = {
    "type": _STRING, "dim": _DIM, "dtype": _STRING, "names": _STRINGS, "units": _UNITS, "shape": _INTS,
    "fps": _POSITIVE, "resolution": _SIZE, "source_resolution": _SIZE, "codec": _STRING, "pix_fmt": _STRING,
    "written_as": _STRING, "source": _STRING, "is_depth_map": _BOOL, "lossless": _BOOL, "optional": _BOOL,
    "file_reference": _BOOL, "layout": (lambda v: v in LAYOUTS, f"one of {', '.join(LAYOUTS)}"),
    "byte_order": (lambda v: v == "little", '"little"'), "cell_shape": _INTS, "not_copied": _OBJECT,
    "stats_fields": _STRINGS,
}
_REQUIRED = {"trajectory": ("dim", "dtype"), "video": ("fps",)}


def _check(value: dict, checks: dict[str, Check], where: str, prefix: str) -> None:
    for key, (test, wanted) in checks.items():
        if key in value and not test(value[key]):
            raise FormatError(f"{where}: {prefix}{key} must be {wanted}, found {_shown(value[key])}")


_shown = quoted


def check_sidecar(sidecar: Any, where: str) -> None:
    """Raise one FormatError naming `where` and the key when mixtrain.json (or the property /
    metadata holding it) has a value of a type this converter never writes."""
    if not isinstance(sidecar, dict):
        raise FormatError(f"{where}: expected a JSON object, found {type(sidecar).__name__}")
    if "column_types" not in sidecar:
        raise FormatError(f"{where}: column_types is missing")
    _check(sidecar, TOP_LEVEL, where, "")
    for key, checks in NESTED.items():
        if key in sidecar:
            _check(sidecar[key], checks, where, f"{key}.")
    for name, count in (sidecar.get("non_finite_values") or {}).items():
        if not _COUNT[0](count):
            raise FormatError(f"{where}: non_finite_values.{name} must be {_COUNT[1]}, found {_shown(count)}")
    for name, entry in sidecar["column_types"].items():
        prefix = f"column_types.{name}"
        if not isinstance(entry, dict):
            raise FormatError(f"{where}: {prefix} must be an object, found {_shown(entry)}")
        if "type" not in entry:
            raise FormatError(f"{where}: {prefix}.type is missing")
        _check(entry, COLUMN, where, f"{prefix}.")
        for key in _REQUIRED.get(entry["type"], ()):
            if key not in entry:
                raise FormatError(f"{where}: {prefix}.{key} is missing (a {entry['type']} column needs it)")
        if entry["type"] == "trajectory" and entry["dtype"] not in TRAJECTORY_DTYPES:
            raise FormatError(f"{where}: {prefix}.dtype must be one of {', '.join(sorted(TRAJECTORY_DTYPES))}, "
                              f"found {_shown(entry['dtype'])}")
        if entry.get("layout") == "bytes" and entry.get("cell_shape") not in (None, [-1, entry.get("dim")]):
            raise FormatError(f"{where}: {prefix}.cell_shape must be [-1, dim] = [-1, {entry.get('dim')}], "
                              f"found {_shown(entry['cell_shape'])}")


def _numbers(value: Any) -> bool:
    """A stat's value: a number or null, or lists of them (images: [C, 1, 1])."""
    if isinstance(value, list):
        return all(_numbers(item) for item in value)
    return value is None or isinstance(value, float) or (_is_int(value) and finite_number(value))  # 10**400: float() overflows


def _shape(value: Any) -> tuple | None:
    """The shape of a nested list of numbers (D values, or [C, 1, 1] for images), None when ragged."""
    if not isinstance(value, list):
        return ()
    shapes = {_shape(item) for item in value}
    if len(shapes) > 1 or None in shapes:
        return None
    return (len(value), *(shapes.pop() if shapes else ()))


def check_stats(stats: Any, where: str) -> None:
    """stats.json: an object of columns, each an object of stats, each a (nested) list of numbers."""
    if not isinstance(stats, dict):
        raise FormatError(f"{where}: expected a JSON object, found {type(stats).__name__}")
    for column, entry in stats.items():
        if not isinstance(entry, dict):
            raise FormatError(f"{where}: {column} must be an object of statistics, found {_shown(entry)}")
        for key, value in entry.items():
            if not isinstance(value, list) or not _numbers(value):
                raise FormatError(f"{where}: {column}.{key} must be a list of numbers, found {_shown(value)}")
            if _shape(value) is None:
                raise FormatError(f"{where}: {column}.{key} is a ragged list (its rows differ in length), found {_shown(value)}")
        if "mean" in entry and np.ravel(np.asarray(entry["mean"], dtype=object)).size == 0:
            raise FormatError(f"{where}: {column}.mean must hold a value per dimension, found []")
