"""`--on_error`: fail at the first bad sequence, or skip it into an errors output.

Every transform that handles a sequence catches the project's ConversionError (bad input, never
a programming error) and either re-raises (FAIL) or emits a record tagged ERRORS (SKIP); the
writer collects the records into DST/_errors.jsonl.
"""

from __future__ import annotations

import apache_beam as beam

from formats.errors import ConversionError, OutputError, error_record, output_failure
from transforms.progress import report

__all__ = ["ERRORS", "FAIL", "SKIP", "MODES", "skip_or_raise"]

ERRORS = "errors"
FAIL, SKIP = "fail", "skip"
MODES = (FAIL, SKIP)


def skip_or_raise(error: ConversionError, on_error: str, sequence: str | None, stage: str, sequences: int | None = 1):
    """Under SKIP, the tagged error record replacing the bad element (`sequences` of them: see
    error_record); under FAIL, re-raise. A full or read-only output stops the run whatever the
    mode: skipping every sequence would not help."""
    failure = output_failure(error)
    if failure is not None:
        raise OutputError(f"cannot write the output: {failure.strerror}") from error
    if on_error != SKIP:
        raise error
    report(skipped=sequences or 1)
    return beam.pvalue.TaggedOutput(ERRORS, error_record(error, sequence=sequence, stage=stage, sequences=sequences))
