"""The one line a user reads when a conversion fails: our own error's message found inside Beam's
wrapping (a worker's exception reaches the launcher as text), and a full, read-only or over-quota
output named as the output rather than as whichever file was being written.
"""

from __future__ import annotations

import logging
import os
import re
from typing import TextIO

from formats import errors
from formats.text import for_terminal

__all__ = ["RunnerLost", "output_message", "user_message", "report"]

_LOG = logging.getLogger("mixtrain-convert")


class RunnerLost(errors.ConversionError):
    """A part of the runner that the run needed ended before the work was done (a local worker
    process, a cluster's scheduler): there is no file or sequence to name, so the output is named."""


_ERROR_LINE = re.compile(r"(?:^|\s|\.)(?:" + "|".join(n for n in errors.__all__ if n[0].isupper()) + r"): (.+)")


_OUTPUT_ERRNO = re.compile(r"\[Errno (?:" + "|".join(str(n) for n in sorted(errors.OUTPUT_ERRNOS)) + r")\] ([^:'\]\n]+)")


def output_message(error: BaseException, output: str) -> str | None:
    """A full, read-only or over-quota output, wherever in the run (and whichever worker) it
    surfaced: the output is named, not the source file being copied at that moment."""
    from formats.mixtrain import publish  # here: the launcher imports this module before its heavy imports

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


def report(error: BaseException, console: TextIO, *, output: str, log_path: str | None, kept_hint: str = "") -> int:
    """Say a failed conversion on `console` as one `error:` line (a command-line error's hint, or
    the log's path, on one more) and return its exit status: 2 for the command line, else 1."""
    from pipelines.cli import EXIT_FAILED, EXIT_USAGE, UsageError
    from pipelines.session import remember_failed_log

    if isinstance(error, UsageError):
        print(f"error: {for_terminal(error)}", file=console, flush=True)
        if error.hint:
            print(error.hint, file=console, flush=True)
        return EXIT_USAGE
    message = output_message(error, output) or user_message(error)
    if isinstance(error, RunnerLost):  # no file or sequence to name: the run's output is named
        message = f"{output}: {message}"
    if message is None:  # not bad input: a fault of ours or of the platform
        first = (str(error).strip().splitlines() or [""])[0]
        message = f"{output}: conversion failed: {type(error).__name__}: {first}"
    _LOG.error("conversion failed: %s", message, exc_info=error)  # the traceback, for whoever reads the log
    print(f"error: {for_terminal(message)}", file=console, flush=True)
    hint = [f"Beam's and the workers' log of this run: {log_path}"] if log_path else []
    remember_failed_log(log_path)
    hint += [kept_hint] if kept_hint else []
    if hint:
        print(for_terminal(f"({'; '.join(hint)})"), file=console, flush=True)
    return EXIT_FAILED

