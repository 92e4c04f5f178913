"""The product's top-level packages imported from where it is installed, ahead of the working folder."""

from __future__ import annotations

import importlib
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("formats", "transforms", "pipelines")


def pin() -> None:
    """Import `formats`, `transforms` and `pipelines` from ROOT (a no-op once they are): a user's
    `formats.py` in the working folder no longer shadows them, and imports of their modules
    later resolve through the packages themselves, not through `sys.path`. Raises ImportError when
    a module of the same name from elsewhere was imported first (it cannot be replaced safely)."""
    sys.path.insert(0, ROOT)
    try:
        for name in PACKAGES:
            module = importlib.import_module(name)
            location = os.path.dirname(os.path.dirname(os.path.abspath(getattr(module, "__file__", "") or "")))
            if location != ROOT:
                raise ImportError(f"{getattr(module, '__file__', name)} was imported as {name!r} before mixtrain-convert's own "
                                  f"{name!r} package ({ROOT}); rename that file, or import mixtrain_convert first")
    finally:
        sys.path.remove(ROOT)
