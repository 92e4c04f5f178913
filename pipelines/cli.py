"""The convert command line: every option of the product, parsed strictly, without importing Beam.

`--help` must answer in well under a second, and a misspelt option must be refused before a
minute of conversion runs with defaults; both happen here, before the heavy imports. The same
`add_arguments` registers the options with Beam (`ConvertOptions`), so the job's options on
Dataflow and a Flex Template's parameters are these and only these.
"""

from __future__ import annotations

import argparse
import difflib
import math
from typing import Any

from pipelines import command_name

__all__ = ["UsageError", "add_arguments", "build_parser", "check_unknown", "parse", "DEFAULTS", "SOURCE_OPTIONS"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_SKIPPED = 0, 1, 2, 3
DEFAULT_SHARD_MB = 256.0
DEFAULT_MAX_SKIPPED = "10%"
DEFAULT_PROGRESS_SECONDS = 10.0
# Known here without importing the format modules (pyarrow, PyAV): tests check they match them.
SOURCE_IDS = ("l5kit", "lerobot_v2", "lerobot_v3", "ortf", "rlds")
VIDEO_CODECS = ("av1", "h264", "hevc", "ffv1")
VIDEO_MODES = ("copy", "reencode")
ERROR_MODES = ("fail", "skip")
ARRAY_LAYOUTS = ("lists", "bytes")  # formats/mixtrain/array_layout.py LAYOUTS
VERIFY_MODES = ("samples", "full", "off")  # --verify_copies: formats/video/stream_copy.py VERIFY_MODES (true, full, false)
LANCE_VIDEOS = ("blob", "reference")  # formats/mixtrain/tables/lance.py VIDEO_STORAGE
PROGRESS_MODES = ("auto", "bar", "lines", "off")
# Table formats of --table_format (formats/tables registers their publishers; checked by a test).
TABLE_FORMATS = ("parquet", "iceberg", "delta", "ducklake", "lance")
# Table formats that cannot carry the Mixtrain metadata faithfully, and why (docs/lake.md).
REFUSED_TABLE_FORMATS = {
    "ducklake": "DuckLake tables have no custom table property (only a COMMENT), so the `mixtrain` metadata "
                "cannot be stored as the spec requires; use --table_format=iceberg or delta",
}
# Options that only one source reads: given for another source they would change nothing.
SOURCE_OPTIONS = {"split": "rlds", "fps": "rlds", "bgr_cameras": "rlds"}
# Options that only matter when some camera is encoded (re-encode mode or image cameras).
ENCODING_OPTIONS = ("video_codec", "video_crf", "video_gop", "video_preset", "video_pix_fmt", "video_min_psnr")

# --quality_<name>: formats/mixtrain/quality.py Thresholds (defaults there; a test checks the names match)
QUALITY_THRESHOLDS = (
    ("jump_sigma", float, 0, True, "N", "jump: a step change more than N standard deviations from the sequence's mean change (default 6)"),
    ("frozen_share", float, 0, True, "F", "frozen: a dimension unchanged over at least this share of a sequence's steps (default 0.9)"),
    ("frozen_min_steps", int, 2, False, "N", "frozen: only in sequences of at least N steps (default 20)"),
    ("clip_steps", int, 1, False, "N", "clipped: N consecutive steps at the dataset's min or max of a dimension that moves (default 10)"),
    ("gap_factor", float, 1, True, "F", "time_gap: a timestamp step longer than F frame periods (default 1.5)"),
    ("drift", float, 0, True, "F", "rate_drift: a sequence's mean step off the declared period by more than this share (default 0.02)"),
    ("first_time", float, 0, False, "SECONDS", "clock_start: the source clock's first value further than this from 0 (default 1)"),
    ("min_length", int, 0, False, "N", "short: sequences of fewer than N steps, a policy's window (default 2)"),
    ("idle_steps", int, 1, False, "N", "idle: N or more steps without an action change at a sequence's start or end (default 10)"),
    ("min_task_sequences", int, 1, False, "N", "rare_task: tasks with fewer than N sequences (default 2)"),
)

EPILOG = """\
Beam options:
  Every Apache Beam pipeline option is passed to Beam, for example --runner=DataflowRunner
  --project=P --region=R --temp_location=gs://B/tmp --setup_file=./setup.py (docs/dataflow.md),
  for local runs --direct_num_workers=2 --direct_running_mode=multi_processing, and on a Dask
  cluster --runner=DaskRunner --dask_client_address=tcp://HOST:8786 (docs/dask.md).
  `python -m pipelines.convert --help_beam` lists them all (slower: it imports Beam).

exit status:
  0 converted; 1 bad input or failed conversion (one error: line naming the file and the
  sequence, the output left as it was); 2 bad command line; 3 converted with --on_error=skip
  but some sequences were skipped (DST/_errors.jsonl); 130 / 143 interrupted (Ctrl-C / SIGTERM),
  the output left as it was.
"""


class UsageError(Exception):
    """A bad command line: exit status 2, one `error:` line and at most one hint line."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


def boolean(text: str) -> bool:
    """`--flag`, `--flag=true` and `--flag=false` all work: Flex Templates pass booleans as values."""
    value = text.strip().lower()
    if value not in ("true", "false", "1", "0", "yes", "no"):
        raise argparse.ArgumentTypeError(f"expected true or false, found {text!r}")
    return value in ("true", "1", "yes")


def verify_mode(text: str) -> str:
    """--verify_copies: true (the default check: VERIFY_MODES[0]), full, or false."""
    if text.strip().lower() in VERIFY_MODES:  # full; the others as argparse passes the default
        return text.strip().lower()
    try:
        return VERIFY_MODES[0] if boolean(text) else VERIFY_MODES[2]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected true, full or false, found {text!r}") from None


def _number(kind, low: float, *, above: bool = False):
    """An argparse type: a finite number >= low (> low with `above`)."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, found {text!r}") from None
        if not math.isfinite(value) or value < low or (above and value == low):
            raise argparse.ArgumentTypeError(f"expected a number {'>' if above else '>='} {low:g}, found {text!r}")
        return value
    return parse


def skip_limit(text: str) -> tuple[str, float]:
    """`--max_skipped`: a count (`5`) or a percentage of the sequences (`10%`), as (kind, value)."""
    value = text.strip()
    try:
        if value.endswith("%"):
            percent = float(value[:-1])
            if math.isfinite(percent) and 0 <= percent <= 100:
                return ("fraction", percent / 100)
        elif int(value) >= 0:
            return ("count", int(value))
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"expected a count like 5 or a percentage like 10%, found {text!r}")


def source_id(text: str) -> str:
    """`--source`: a built-in format id (checked without importing any format, so `--help` stays
    fast) or the id of a source a plugin registered (formats.sources, imported only then)."""
    if text in ("auto", *SOURCE_IDS):
        return text
    from formats import sources  # a plugin's source: the registry knows it

    if text in sources.SOURCES:
        return text
    names = ("auto", *sorted(sources.SOURCES))
    match = difflib.get_close_matches(text, names, n=1, cutoff=0.6)
    raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from {', '.join(map(repr, names))})"
                                     + (f"; did you mean {match[0]!r}?" if match else ""))


def _flag(parser, name: str, help: str) -> None:
    parser.add_argument(name, type=boolean, nargs="?", const=True, default=False, metavar="BOOL", help=help)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register every option of the product (used by our parser and by Beam's)."""
    group = parser.add_argument_group("conversion")
    group.add_argument("--input", metavar="SRC",
                       help="source dataset root: a path or an fsspec URL (gs://, s3://, file://, memory://; docs/storage.md); required")
    group.add_argument("--output", metavar="DST", help="Mixtrain dataset root to write; required; must be empty, or a Mixtrain "
                                                       "dataset with --overwrite or --incremental")
    group.add_argument("--source", default="auto", type=source_id, metavar="{auto," + ",".join(SOURCE_IDS) + "}",
                       help="source format (default auto: detected from the files; a plugin's registered source id is accepted too)")
    group.add_argument("--on_error", default="fail", choices=ERROR_MODES,
                       help="fail (default): the first bad sequence stops the run, output untouched; "
                            "skip: bad sequences go to DST/_errors.jsonl, the rest is published (exit 3)")
    group.add_argument("--max_skipped", default=skip_limit(DEFAULT_MAX_SKIPPED), type=skip_limit, metavar="N|P%",
                       help=f"with --on_error=skip: publish nothing if more sequences than this (a count, or a percentage of "
                            f"the sequences) were skipped (default {DEFAULT_MAX_SKIPPED.replace('%', '%%')})")
    group.add_argument("--limit", default=0, type=_number(int, 0), metavar="N",
                       help="convert only the first N units of the source, to try a conversion first: N episodes (LeRobot, "
                            "ORTF), N scenes (L5Kit), N shards (RLDS); mixtrain.json records it (default 0: all)")
    _flag(group, "--overwrite", "replace an existing Mixtrain dataset at --output")
    _flag(group, "--incremental", "nightly re-conversion: reuse unchanged sequences of the dataset at --output, convert new "
                                  "and changed ones, drop deleted ones, publish a complete new version")
    _flag(group, "--fresh", "discard what an interrupted run for this --output completed instead of resuming it (by default "
                            "the same command run again resumes: docs/reliability.md)")

    group = parser.add_argument_group("video")
    group.add_argument("--video", default="copy", choices=VIDEO_MODES,
                       help="copy (default): each episode's segment is cut out of the source file, pixels identical; "
                            "reencode: decoded and encoded with the options below (image cameras are always encoded)")
    group.add_argument("--video_codec", default=None, choices=VIDEO_CODECS,
                       help="codec of encoded video (default h264); ffv1 is lossless, each camera kept in its own pixel format "
                            "(RGB images decode to their exact values)")
    group.add_argument("--video_crf", default=None, type=_number(int, 0), metavar="N",
                       help="quality, lower is better (default per codec: h264 16, hevc 16, av1 20)")
    group.add_argument("--video_gop", default=None, type=_number(int, 1), metavar="N", help="a keyframe every N frames (default 10)")
    group.add_argument("--video_preset", default=None, metavar="P", help="encoder speed preset (default: h264/hevc medium, av1 8)")
    group.add_argument("--video_pix_fmt", default=None, metavar="FMT", help="yuv420p (default); yuv422p or yuv444p for h264 and hevc")
    group.add_argument("--video_min_psnr", default=None, type=_number(float, 0), metavar="DB",
                       help="luma PSNR every frame of a lossy encode keeps against its source (default 35, what validate "
                            "--deep checks); a segment below it is encoded again at a lower crf, recorded in mixtrain.json; "
                            "0: no floor")
    _flag(group, "--video_stats", "per-channel image statistics of sampled frames into stats.json")
    group.add_argument("--verify_copies", type=verify_mode, nargs="?", const=VERIFY_MODES[0], default=VERIFY_MODES[0],
                       metavar="true|full|false",
                       help="copy mode: true (default) checks every copied sample's framing and decodes each file's first "
                            "picture, refusing damaged source samples; full decodes every copied video once; false trusts "
                            "the source and only copies bytes")

    group = parser.add_argument_group("output")
    group.add_argument("--num_shards", default=0, type=_number(int, 0), metavar="N",
                       help="number of Parquet shards (default 0: derived from --target_shard_mb)")
    group.add_argument("--table_format", default="parquet", choices=TABLE_FORMATS,
                       help="parquet (default): standalone shards with a mixtrain.json sidecar; iceberg: an Iceberg table "
                            "(embedded SQLite catalog under DST unless --catalog), its `mixtrain` property holding the "
                            "metadata; delta: a Delta table rooted at DST; ducklake: refused (no table property to hold "
                            "the metadata, docs/lake.md); lance: one Lance dataset at DST, videos inside it, every run a "
                            "new version (docs/lance.md)")
    group.add_argument("--catalog", default="", metavar="NAME|URI",
                       help="--table_format=iceberg: the catalog, a pyiceberg catalog name (~/.pyiceberg.yaml, PYICEBERG_CATALOG__*) "
                            "or URI (http(s):// REST, sqlite:// or postgresql:// SQL, thrift:// Hive); default: an embedded "
                            "SQLite catalog DST/catalog.db")
    group.add_argument("--table_name", default="", metavar="NS.NAME",
                       help="--table_format=iceberg: the table in the catalog (default default.dataset)")
    group.add_argument("--partition_by", default="", metavar="A,B",
                       help="--table_format=iceberg: partition the table by these scalar columns (e.g. split,task); each shard "
                            "is split into one file per partition")
    group.add_argument("--target_shard_mb", default=None, type=_number(float, 0, above=True), metavar="MB",
                       help="approximate uncompressed MB of rows per shard (default 256)")
    group.add_argument("--lance_videos", default="blob", choices=LANCE_VIDEOS,
                       help="with --table_format=lance: blob (default): each MP4's bytes verbatim in a blob column; "
                            "reference: paths to files under files/ as in the Parquet layout")
    group.add_argument("--array_layout", default="lists", choices=ARRAY_LAYOUTS,
                       help="trajectory cells: lists (default): list<fixed_size_list<dtype, D>>, readable as nested "
                            "lists by every Parquet tool; bytes: the [T, D] array's raw little-endian values in one binary "
                            "cell, dtype and D in mixtrain.json column_types (2x+ faster to numpy, docs/lance.md)")

    group = parser.add_argument_group("data quality (docs/quality.md)")
    group.add_argument("--quality", type=boolean, nargs="?", const=True, default=True, metavar="BOOL",
                       help="find data-quality defects in the conversion's own pass (NaN, stuck or clipped dimensions, jumps, "
                            "dropped frames, duplicates, idle stretches...) into DST/_quality.jsonl (default true)")
    for name, kind, low, above, metavar, what in QUALITY_THRESHOLDS:
        group.add_argument(f"--quality_{name}", default=None, type=_number(kind, low, above=above), metavar=metavar, help=what)

    group = parser.add_argument_group("progress and logs")
    group.add_argument("--progress", default="auto", choices=PROGRESS_MODES,
                       help="auto (default): a line redrawn in place on a terminal, plain lines otherwise; bar; lines; off")
    group.add_argument("--progress_interval", default=None, type=_number(float, 0, above=True), metavar="SECONDS",
                       help="seconds between plain progress lines (default 10)")
    group.add_argument("--log_file", default=None, metavar="PATH",
                       help="where Beam's and the workers' logs go (default ~/.cache/mixtrain-convert/logs/<run>.log)")
    _flag(group, "--verbose", "also print Beam's and the workers' logs on stderr")
    _flag(group, "--detach", "remote runners: return once the job is submitted, printing its id and console URL "
                             "(the job publishes the dataset itself)")

    group = parser.add_argument_group("RLDS options (--source=rlds)")
    group.add_argument("--split", default="", metavar="A,B", help="comma-separated splits to convert (default: all, with a split column)")
    group.add_argument("--fps", default=None, type=_number(float, 0, above=True), metavar="HZ",
                       help="control rate (known Open X-Embodiment datasets have a default)")
    group.add_argument("--bgr_cameras", default="", metavar="A,B",
                       help="cameras stored as BGR, swapped to RGB (column or feature names, or all)")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise UsageError(message, hint="python -m pipelines.convert --help lists every option")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=command_name("convert"), allow_abbrev=False, add_help=False,
                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
                     description="Convert a LeRobot v3.0 or v2.x, RLDS (TFRecord or ArrayRecord), ORTF or L5Kit dataset to "
                                 "Mixtrain v1.0.\n\n"
                                 "  python -m pipelines.convert --input=SRC --output=DST [options]")
    parser.add_argument("-h", "--help", action="store_true", help="show this help and exit")
    parser.add_argument("--help_beam", action="store_true", help="list Apache Beam's own pipeline options and exit")
    parser.add_argument("--version", action="store_true", help="print the converter's version and exit")
    add_arguments(parser)
    return parser


DEFAULTS = {action.dest: action.default for action in build_parser()._actions}


def _normalized(flag: str) -> str:
    """`--num-shards=3` -> `--num_shards`: the spelling our options use."""
    return "--" + flag.split("=", 1)[0].lstrip("-").replace("-", "_")


def _spelling_hint(flag: str, known: list[str]) -> str | None:
    match = difflib.get_close_matches(_normalized(flag), known, n=1, cutoff=0.6)
    return f"did you mean {match[0]}?" if match else None


def check_unknown(unknown: list[str], known: list[str]) -> None:
    """Refuse what no parser took: a misspelt option must not run with defaults."""
    flags = [arg for arg in unknown if arg.startswith("-")]
    if flags:
        raise UsageError(f"unknown option {flags[0].split('=', 1)[0]}", hint=_spelling_hint(flags[0], known)
                         or "python -m pipelines.convert --help lists every option")
    if unknown:
        raise UsageError(f"unexpected argument {unknown[0]!r} (options are written --name=value)",
                         hint="python -m pipelines.convert --input=SRC --output=DST")


def typed(options: Any, name: str) -> bool:
    """The user wrote `--name` on the command line (whatever the value): the one test of whether an
    option was given, for the checks here and for the per-dataset ones (pipelines/plan.py).
    `options`: what `parse` returned, or Beam's view of the same command line (its `_flags` are
    the arguments it was made from)."""
    names = getattr(options, "typed_options", None)
    if names is None:
        names = _typed_names(list(getattr(options, "_flags", ())))
    return name in names


def _typed_names(argv: list[str]) -> frozenset[str]:
    return frozenset(name for name in DEFAULTS
                     if any(arg == f"--{name}" or arg.startswith(f"--{name}=") for arg in argv))


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Our options, and the arguments left for Beam. Raises UsageError; `--help` is the caller's."""
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.help or args.help_beam or args.version:
        return args, rest
    known = [option for action in parser._actions for option in action.option_strings]
    for arg in rest:  # one of ours spelt with dashes is refused before Beam is even imported
        if arg.startswith("-") and _normalized(arg) in known:
            check_unknown([arg], known)
    args.typed_options = _typed_names(argv)
    if not args.input or not args.output:
        raise UsageError("--input and --output are required", hint="python -m pipelines.convert --help lists every option")
    if typed(args, "target_shard_mb") and args.num_shards:
        raise UsageError("--target_shard_mb has no effect with --num_shards (the shard count is given); pass one of them")
    if typed(args, "max_skipped") and args.on_error != "skip":
        raise UsageError("--max_skipped has no effect with --on_error=fail (the first bad sequence stops the run)",
                         hint="pass --on_error=skip to convert what can be converted")
    if typed(args, "lance_videos") and args.table_format != "lance":
        raise UsageError("--lance_videos has no effect without --table_format=lance")
    if args.table_format in REFUSED_TABLE_FORMATS:
        raise UsageError(f"--table_format={args.table_format} is not supported: {REFUSED_TABLE_FORMATS[args.table_format]}")
    for name in ("catalog", "table_name", "partition_by"):
        if typed(args, name) and args.table_format != "iceberg":
            raise UsageError(f"--{name} has no effect with --table_format={args.table_format} (it names an Iceberg catalog or table)")
    if not args.quality:
        for name, *_ in QUALITY_THRESHOLDS:
            if typed(args, f"quality_{name}"):
                raise UsageError(f"--quality_{name} has no effect with --quality=false (no findings are computed)")
    if args.quality_frozen_share is not None and args.quality_frozen_share > 1:
        raise UsageError(f"--quality_frozen_share: expected a share of the steps (0 to 1), found {args.quality_frozen_share:g}")
    if typed(args, "progress_interval") and args.progress in ("off", "bar"):
        raise UsageError(f"--progress_interval has no effect with --progress={args.progress} (it spaces plain progress lines)")
    return args, rest
