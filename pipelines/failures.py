"""The one line a user reads when a conversion fails: our own error's message found inside Beam's
wrapping (a worker's exception reaches the launcher as text), and a full, read-only or over-quota
output named as the output rather than as whichever file was being written.
"""

from __future__ import annotations

import os
import re

from formats import errors
from formats.mixtrain import publish

__all__ = ["output_message", "user_message"]

_ERROR_LINE = re.compile(r"(?:^|\s|\.)(?:" + "|".join(n for n in errors.__all__ if n[0].isupper()) + r"): (.+)")


_OUTPUT_ERRNO = re.compile(r"\[Errno (?:" + "|".join(str(n) for n in sorted(errors.OUTPUT_ERRNOS)) + r")\] ([^:'\]\n]+)")


def output_message(error: BaseException, output: str) -> str | None:
    """A full, read-only or over-quota output, wherever in the run (and whichever worker) it
    surfaced: the output is named, not the source file being copied at that moment."""
    failure = errors.output_failure(error)
    if failure is not None:
        reason = failure.strerror
        where = str(failure.filename or "")
        real = os.path.realpath(output) if "://" not in output else output
        staged = os.path.join(os.path.dirname(real), f".{os.path.basename(real)}{publish.SIBLING_MARK}")
        if where and not (where.startswith(real) or where.startswith(staged)):  # not the output: a temp or log disk
            return f"{where}: cannot write: {reason}; nothing was published (the previous dataset, if any, is as it was)"
    else:  # from another process, only the text is left
        found = _OUTPUT_ERRNO.search(str(error))
        if found is None:
            return None
        reason = found.group(1).strip()
    return f"{output}: cannot write the output: {reason}; nothing was published (the previous dataset, if any, is as it was)"


def user_message(error: BaseException) -> str | None:
    """The one line for a user: our own error's message, found even inside Beam's wrapping."""
    if isinstance(error, errors.ConversionError):
        return re.sub(r" \[while running '.*'\]$", "", str(error).splitlines()[0])
    matches = _ERROR_LINE.findall(str(error))
    if matches:
        return re.sub(r" \[while running '.*'\]$", "", matches[-1].strip())
    return None
