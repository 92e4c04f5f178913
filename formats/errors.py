"""Error family for bad input.

Codecs raise these with the precise facts they know; `load` functions add the file and the
sequence on the way out, so every message a user sees names both. The command line prints
`str(error)` as its one line, so messages must stand alone.
"""

from __future__ import annotations

import errno

__all__ = ["ConversionError", "FormatError", "VideoError", "ColumnNameError", "OutputError", "MissingPackageError", "describe_skip_limit",
           "error_record", "output_failure", "skipped_counts"]


class ConversionError(ValueError):
    """Base class: bad input or an impossible conversion, with a message fit for a user."""


class FormatError(ConversionError):
    """Source metadata or data does not follow its format."""


class VideoError(ConversionError):
    """A video file cannot be read, cut or verified."""


class ColumnNameError(ConversionError):
    """Two source features map to the same Mixtrain column."""


class MissingPackageError(FormatError, ImportError):
    """A URL whose filesystem needs a package that is not installed (s3:// without s3fs). An
    ImportError too, so callers that catch fsspec's own ImportError keep working."""


class OutputError(ConversionError):
    """The output cannot be written (disk full, read-only, quota): a fault of the destination,
    never of a sequence, so never skipped under --on_error=skip."""


# errno values only a write can cause: seen in a failure, the output is at fault, not the source.
OUTPUT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG}


def output_failure(error: BaseException) -> OSError | None:
    """The OSError behind `error` (its causes and contexts) that says the output cannot be written."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in OUTPUT_ERRNOS:
            return error
        error = error.__cause__ or error.__context__
    return None


def in_context(error: ConversionError, *, file: str | None = None, sequence: str | None = None) -> ConversionError:
    """Return an error of the same class whose message is prefixed with file and sequence.

    Idempotent for a context already present, so nested loaders can each add what they know.
    """
    message = str(error)
    parts = []
    if file and file not in message:
        parts.append(file)
    if sequence and sequence not in message:
        parts.append(sequence)
    if not parts:
        error.file = getattr(error, "file", None) or file
        error.sequence = getattr(error, "sequence", None) or sequence
        return error
    new = type(error)(f"{': '.join(parts)}: {message}")
    new.__cause__ = error.__cause__ or error
    new.file = getattr(error, "file", None) or file
    new.sequence = getattr(error, "sequence", None) or sequence
    return new


def error_record(error: ConversionError, *, sequence: str | None, stage: str, sequences: int | None = 1) -> dict:
    """What `--on_error=skip` writes to _errors.jsonl for one bad sequence (or source unit).

    `sequences`: how many sequences the record stands for. A source unit that could not be read
    at all (an RLDS shard whose records cannot be indexed) holds as many as its metadata says
    (shardLengths), or an unknown number (None); the record then carries `"sequences"`.
    """
    record = {
        "sequence_id": sequence,
        "source_file": getattr(error, "file", None),
        "stage": stage,
        "error": str(error).splitlines()[0],
    }
    if sequences != 1:
        record["sequences"] = sequences
    return record


def describe_skip_limit(limit: tuple[str, float]) -> str:
    """A --max_skipped limit ("count", n) / ("fraction", f) as the user writes it: `5`, `10%`."""
    kind, value = limit
    return f"{value:g}" if kind == "count" else f"{value * 100:g}%"


def skipped_counts(records: list[dict]) -> tuple[int, int]:
    """(sequences skipped, source units skipped whose sequences could not be counted) over error
    records: a record counts 1, or the `sequences` of a unit record, or nothing known (None)."""
    counted = sum(record.get("sequences", 1) for record in records if record.get("sequences", 1) is not None)
    return counted, sum(1 for record in records if record.get("sequences", 1) is None)
