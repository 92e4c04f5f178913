"""The product's top-level packages imported from where it is installed, ahead of the working folder."""

from __future__ import annotations

import importlib
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("formats", "transforms", "pipelines")


def pin(names: tuple[str, ...] = PACKAGES) -> None:
    """Import the product's packages `names` from ROOT (a no-op once they are): a user's
    `formats.py` in the working folder no longer shadows them, and imports of their modules
    later resolve through the packages themselves, not through `sys.path`. Only what is needed
    is pinned: the reader needs `formats` alone, so a training script's own `transforms.py`
    stays theirs. Raises ImportError when a module of the same name from elsewhere was imported
    first (it cannot be replaced safely)."""
    sys.path.insert(0, ROOT)
    try:
        for name in names:
            module = importlib.import_module(name)
            location = os.path.dirname(os.path.dirname(os.path.abspath(getattr(module, "__file__", "") or "")))
            if location != ROOT:
                raise ImportError(f"{getattr(module, '__file__', name)} was imported as {name!r} before mixtrain-convert's own "
                                  f"{name!r} package ({ROOT}); rename that file, or import mixtrain_convert first")
    finally:
        sys.path.remove(ROOT)
