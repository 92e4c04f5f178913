"""Look at a converted Mixtrain dataset.

    python -m pipelines.inspect DST                      a terminal summary
    python -m pipelines.inspect DST --html report.html   also one self-contained HTML page
    python -m pipelines.inspect DST --json               everything the summary holds, as JSON on stdout

The summary: sequences, timesteps, shards, the distribution of sequence lengths, every column
with its kind, dtype and dimension, cameras (codec, resolution, fps, bytes), per-dimension
statistics from stats.json, provenance (source, converter version, options, created_at) and the
sequences the conversion skipped, and the data-quality findings the conversion recorded
(docs/quality.md: a line per check, its worst sequences; --quality computes them from the rows for
a dataset without them). The page adds a length histogram, statistics bands, sampled
trajectories against time and first/middle/last thumbnails per camera (inline SVG and JPEG: it
opens offline). Exit status 0; 1 with one `error:` line when the dataset cannot be read; 2 on a
bad command line.
"""

from __future__ import annotations

import argparse
import json
import sys

import pyarrow as pa

from formats import storage
from formats.errors import ConversionError
from formats.mixtrain import resume
from formats.read import reader, report
from formats.text import for_terminal
from pipelines import command_name, exit_without_teardown, validate

__all__ = ["main", "entry"]


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=command_name("inspect"), description="Summarise a Mixtrain dataset; optionally write an HTML report.",
                                     allow_abbrev=False)
    parser.add_argument("dataset", help="Mixtrain dataset root (path or fsspec URL such as gs://bucket/ds)")
    parser.add_argument("--html", metavar="PATH", default=None, help="also write a self-contained HTML report to PATH (a local path or fsspec URL)")
    parser.add_argument("--samples", type=_positive, default=4, help="sequences shown as camera thumbnails in the report (default 4)")
    parser.add_argument("--trajectory_samples", type=_positive, default=3, help="sequences plotted against time in the report (default 3)")
    parser.add_argument("--quality", action="store_true", help="compute the data-quality findings from the rows when the conversion "
                                                                "recorded none (reads every per-step column; docs/quality.md)")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object instead of text (quality findings "
                                                            "included), for scripts")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exit_:
        return 2 if exit_.code else 0
    try:
        validate.reach(args.dataset)  # an unreachable store: one line within seconds
        stopped = _interrupted_runs(args.dataset)
        try:
            dataset = reader.open_dataset(args.dataset)
        except ConversionError:
            sys.stdout.write(stopped)  # a first run stopped: no dataset yet, its staging all there is
            raise
        summary = report.summarize(dataset, compute_quality=args.quality)
        if args.json:
            sys.stdout.write(json.dumps(summary, ensure_ascii=True, sort_keys=True, default=str) + "\n")  # escaped: no control reaches a terminal
        else:
            sys.stdout.write(report.render_text(summary) + stopped)
        if args.html:
            page = report.render_html(dataset, summary, samples=args.samples, trajectory_samples=args.trajectory_samples)
            fs, path = storage.open_root(args.html)
            try:
                fs.pipe_file(path, page.encode("utf-8"))
            except OSError as error:
                raise ConversionError(f"{args.html}: cannot write the report: {error.strerror or error}") from error
            print(f"report: {storage.local_path(fs, path) or storage.url_for(fs, path)} ({len(page.encode()) / 1e6:.2f} MB)")
    except (ConversionError, OSError, KeyError, pa.ArrowException) as error:
        message = str(error) if not isinstance(error, KeyError) else error.args[0]
        if isinstance(error, OSError) and getattr(error, "filename", None) and str(error.filename) not in message:
            message = f"{error.filename}: {message}"
        print(f"error: {for_terminal(message)}", file=sys.stderr)
        return 1
    return 0


def _interrupted_runs(url: str) -> str:
    """Lines naming each interrupted run's staging for this output, with its size (hidden from
    readers of the dataset; the same conversion command resumes it, --fresh discards it)."""
    try:
        fs, root = storage.open_root(url)
        journals = resume.interrupted(fs, root)
    except (OSError, ValueError, ConversionError):
        return ""
    return "".join(f"interrupted: {for_terminal(resume.describe(journal, fs))} (not published; the same conversion command "
                   "resumes it, --fresh discards it)\n" for journal in journals)


def entry() -> None:
    """The process entry (`exit_without_teardown`: see why there)."""
    exit_without_teardown(main())


if __name__ == "__main__":
    entry()
