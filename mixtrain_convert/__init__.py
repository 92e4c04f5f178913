"""mixtrain-convert's public import name, which a file of the user's cannot shadow.

    from mixtrain_convert import open_dataset
    ds = open_dataset("~/data/my_mixtrain")

The product's own packages have short names (`formats`, `transforms`, `pipelines`); a training
repository's `formats.py` or `transforms.py` in the working folder would be found first by
`python` (the working folder leads `sys.path`). Importing this package imports `formats` (all the
reader needs) from where mixtrain-convert is installed (`_packages.pin`), and `convert` the other
two, so that the imports below, and every later one inside them, are ours; a `transforms.py` of
the user's stays theirs until `convert` is called. Names are loaded on first use.

Exported: `open_dataset`, `Dataset`, `Filter`, `torch_windows`, `torch_sequences` (the reader,
formats.read.reader), `convert(argv) -> exit status` (the command line, in this process),
`__version__`.
"""

from __future__ import annotations

import importlib
from typing import Any

from mixtrain_convert import _packages

_packages.pin(("formats",))

__all__ = ["open_dataset", "Dataset", "Filter", "torch_windows", "torch_sequences", "convert", "__version__"]

_READER = ("open_dataset", "Dataset", "Filter", "torch_windows", "torch_sequences")


def convert(argv: list[str]) -> int:
    """Run the conversion `python -m pipelines.convert ARGV` would, in this process; its exit status."""
    _packages.pin()
    from pipelines import convert as command

    return command.run(list(argv))


def __getattr__(name: str) -> Any:
    if name in _READER:
        return getattr(importlib.import_module("formats.read.reader"), name)
    if name == "__version__":
        return importlib.import_module("formats").__version__
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
