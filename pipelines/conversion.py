"""The conversion behind `python -m pipelines.convert`: plan on the launcher, build the Beam
pipeline, run it, and turn every outcome into an exit status and one line.

`pipelines.convert` parses the command line without Beam (fast help, typos refused at once) and
calls `run` here. Exit status: 0 converted; 1 bad input or a failed conversion (one `error:` line
on stderr naming the file and the sequence, the output left as it was); 2 bad command line; 3
converted with --on_error=skip but some sequences were skipped; 130 / 143 interrupted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
import math
import os
import signal
import sys
import time
from typing import NamedTuple, TextIO

# Before Arrow is imported: its jemalloc pool returns freed memory to the system, where mimalloc
# (the default) kept ~80 MB more at peak on long episodes (bench workload d). Set it to override.
if sys.platform.startswith("linux"):
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")

import apache_beam as beam
from apache_beam.options.pipeline_options import DirectOptions, GoogleCloudOptions, PipelineOptions, StandardOptions, TestOptions

import formats
from formats import errors, fingerprint, mixtrain, publish, sources, storage, video_policy
from formats.sequence import TRAJECTORY, VIDEO, DatasetMeta
from pipelines import cli, failures, local_workers
from pipelines.cli import EXIT_FAILED, EXIT_OK, EXIT_SKIPPED, EXIT_USAGE, UsageError
from pipelines.progress import Progress
from pipelines.session import Interrupted
from transforms.errors import ERRORS
from transforms.read import ReadSequences
from transforms.reuse import ReusePrevious
from transforms.video import WriteVideos
from transforms.write import WriteMixtrain

__all__ = ["ConvertOptions", "Plan", "build_pipeline", "run"]

# Runner names that mean "run here": served by Beam's FnApiRunner directly, because Beam's
# DirectRunner first tries Prism, which downloads a binary (NOTES.md) and ignores
# --direct_num_workers / --direct_running_mode.
LOCAL_RUNNERS = {None, "DirectRunner", "FnApiRunner", "BundleBasedDirectRunner"}
_LOG = logging.getLogger("mixtrain-convert")


class ConvertOptions(PipelineOptions):
    """Our options registered with Beam too: the job's options (Dataflow UI, Flex Template) are these."""

    @classmethod
    def _add_argparse_args(cls, parser):
        cli.add_arguments(parser)


class Plan(NamedTuple):
    """What the launcher decided: the metadata, every ref, the shard count, the refs converted now."""

    meta: DatasetMeta
    refs: list
    num_shards: int
    to_convert: list


def estimate_num_shards(meta: DatasetMeta, refs: list, target_mb: float) -> int:
    """Shards from the planned size of the rows (trajectories + timestamps), at least one."""
    bytes_per_step = 8 + meta.extra_bytes_per_step
    for spec in meta.columns:
        if spec.kind == TRAJECTORY:
            bytes_per_step += spec.meta["dim"] * spec.arrow_type.value_type.value_type.bit_width // 8
    total = sum(getattr(ref, "length", 0) for ref in refs) * bytes_per_step or meta.estimated_bytes
    limit = len(refs) if all(hasattr(ref, "length") for ref in refs) else max(len(refs), 1) * 1000
    return max(1, min(limit or 1, math.ceil(total / (target_mb * 1e6))))


def _runner(options: PipelineOptions, zygote: local_workers.Zygote | None):
    name = options.view_as(StandardOptions).runner
    if name in LOCAL_RUNNERS:
        from apache_beam.runners.portability.fn_api_runner import FnApiRunner

        return local_workers.runner(zygote) if zygote is not None else FnApiRunner()
    return name


def check_reachable_by_workers(options: PipelineOptions) -> None:
    """On a remote runner the workers cannot see the launcher's disk: --input and --output must be
    URLs of shared storage (gs://...), not local paths."""
    if options.view_as(StandardOptions).runner in LOCAL_RUNNERS:
        return
    ours = options.view_as(ConvertOptions)
    for flag, url in (("--input", ours.input), ("--output", ours.output)):
        fs, _ = storage.open_root(url)
        if storage.is_local(fs):
            raise errors.ConversionError(f"{flag}={url} is on this machine's disk, which {options.view_as(StandardOptions).runner} "
                                         "workers cannot read; use a gs:// (or other shared storage) URL")


def prepare_output(output_url: str, overwrite: bool) -> None:
    """Refuse to touch an output that holds something we did not write, or a dataset without
    --overwrite; and, where publication replaces the whole folder, one that holds anything else."""
    fs, root = storage.open_root(output_url)
    publish.check_no_live_run(fs, root)
    if not fs.exists(root):
        return
    if not fs.isdir(root):
        raise errors.ConversionError(f"{root}: output exists and is not a directory")
    names = {entry.rstrip("/").rsplit("/", 1)[-1] for entry in fs.ls(root, detail=False)}
    foreign = publish.foreign_entries(fs, root)
    ours = names - set(foreign) - {publish.STAGING_DIR}
    if not ours and not foreign:
        return
    if mixtrain.SIDECAR not in ours and not (ours and not foreign):
        raise errors.ConversionError(f"{root}: output is not empty and is not a Mixtrain dataset ({', '.join(sorted(names))}); "
                                     "choose another --output")
    if not overwrite:
        raise errors.ConversionError(f"{root}: output already holds a Mixtrain dataset; pass --overwrite to replace it")
    if foreign and storage.is_local(fs) and publish.replaces_whole_folder(root):
        raise errors.ConversionError(f"{root}: the output folder also holds {', '.join(foreign)}, which replacing the dataset "
                                     "would delete (the whole folder is replaced); move them out or choose another --output")


def source_options(options: ConvertOptions) -> dict:
    """What `plan` may use of the command line (each source reads what concerns it)."""
    return {
        "splits": [s for s in options.split.split(",") if s],
        "fps": options.fps or None,
        "bgr_cameras": [c for c in options.bgr_cameras.split(",") if c],
    }


def requested_encoding(options: ConvertOptions) -> video_policy.EncodeOptions:
    """The --video_* flags as checked EncodeOptions (raises ConversionError on a bad combination)."""
    return video_policy.EncodeOptions(options.video_codec or "h264", options.video_crf, options.video_gop,
                               options.video_preset, options.video_pix_fmt or "yuv420p").resolved()


def given(options: ConvertOptions, name: str) -> bool:
    """The user set this option to something other than its default."""
    return getattr(options, name) != cli.DEFAULTS[name]


def check_effective(options: ConvertOptions, source: str, meta: DatasetMeta, encode: dict) -> None:
    """Refuse an option that would change nothing for this source and mode: the user meant something."""
    for name, owner in cli.SOURCE_OPTIONS.items():
        if given(options, name) and owner != source:
            raise UsageError(f"--{name} is an option of --source={owner}; it has no effect on this {source} dataset")
    cameras = [spec.name for spec in meta.columns if spec.kind == VIDEO]
    if not cameras:
        for name in ("video", "video_stats", "verify_copies", *cli.ENCODING_OPTIONS):
            if given(options, name):
                raise UsageError(f"--{name} has no effect: this {source} dataset has no cameras")
        return
    if given(options, "verify_copies") and all(encode.values()):
        raise UsageError(f"--verify_copies has no effect: every camera of this dataset ({', '.join(cameras)}) is encoded, none copied")
    if not any(encode.values()):
        for name in cli.ENCODING_OPTIONS:
            if given(options, name):
                raise UsageError(f"--{name} has no effect: --video={options.video} copies every camera of this dataset "
                                 f"({', '.join(cameras)}) without encoding", hint="pass --video=reencode to encode them")


def copied_columns(meta: DatasetMeta) -> frozenset:
    """The video columns planned as packet copies (`plan_videos` has written their entries)."""
    return frozenset(spec.name for spec in meta.columns if spec.kind == VIDEO and spec.meta.get("written_as") == "copy")


def codec_threads(options: PipelineOptions) -> int | None:
    """Local runs share the cores among the workers' codecs; a Dataflow worker has its own cores
    and the codecs' own choice (None) stands."""
    if options.view_as(StandardOptions).runner not in LOCAL_RUNNERS:
        return None
    return local_workers.codec_threads(options.view_as(DirectOptions).direct_num_workers)


def plan_videos(meta: DatasetMeta, mode: str, requested: video_policy.EncodeOptions) -> tuple[dict, dict]:
    """Decide copy or encode per video column; rewrite meta.columns' entries to describe the output.

    Returns (column -> EncodeOptions or None for copy, column -> declared source (width, height)).
    """
    encode, sizes = {}, {}
    for position, spec in enumerate(meta.columns):
        if spec.kind == VIDEO:
            encode[spec.name], entry = video_policy.plan_column(spec.meta, mode=mode, requested=requested)
            sizes[spec.name] = video_policy.declared_size(entry)
            meta.columns[position] = dataclasses.replace(spec, meta=entry)
    return encode, sizes


def build_pipeline(pipeline: beam.Pipeline, options: ConvertOptions, run_id: str, *, write_assets: bool = True) -> Plan:
    """Plan on the launcher and add the conversion to `pipeline`.

    Raises UsageError for an option that has no effect on this dataset. `write_assets=False` (dry
    runs, templates) leaves the output untouched: nothing is staged on the launcher.
    """
    with _blame(options.input, "cannot read the input"):
        fs, root = storage.open_root(options.input)
        source = sources.detect(fs, root) if options.source == "auto" else options.source
        module = sources.get(source)
        meta, refs = module.plan(fs, root, source_options(options))
    if not refs or sources.sequence_count(refs) == 0:
        raise errors.ConversionError(f"{storage.url_for(fs, root)}: the {source} dataset holds no sequences; nothing to convert "
                                     "(an existing dataset at the output is left as it was)")
    requested = requested_encoding(options)
    encode, sizes = plan_videos(meta, options.video, requested)
    check_effective(options, source, meta, encode)
    num_shards = options.num_shards or estimate_num_shards(meta, refs, options.target_shard_mb or cli.DEFAULT_SHARD_MB)
    out_fs, out_root = storage.open_root(options.output)
    output_url = storage.url_for(out_fs, out_root)
    staging = publish.staging_root(out_fs, out_root, run_id)
    staging_url = storage.url_for(out_fs, staging)
    source_url = storage.url_for(fs, root)
    sidecar_extra = {
        "converter_version": formats.__version__,
        "options": {"source": source, "source_options": source_options(options), "video": options.video, "num_shards": num_shards,
                    "on_error": options.on_error,
                    **({"max_skipped": errors.describe_skip_limit(options.max_skipped)} if options.on_error == "skip" else {}),
                    "video_encoding": dataclasses.asdict(requested), "video_stats": options.video_stats},
        "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    if write_assets:
        publish.copy_assets(fs, root, out_fs, staging, meta)
    units, shared = module.incremental_units(refs)
    # What changes the output of a unit; not the shard count or the error policy.
    recorded = {k: v for k, v in sidecar_extra["options"].items() if k not in ("num_shards", "on_error", "max_skipped")}
    context = fingerprint.context_hash(formats.__version__, {**recorded, "fps": meta.fps}, meta.columns)
    current = fingerprint.fingerprints(units, fingerprint.signatures(fs, root), shared, context)
    to_convert, reused = refs, None
    if options.incremental:
        reused = fingerprint.reusable(out_fs, out_root, units, current)
        if reused is not None:
            changed = {unit.key for unit, _ in units} - reused["units"]
            to_convert = [ref for unit, ref in units if unit.key in changed]
            sidecar_extra["incremental"] = {"reused_sequences": len(reused["ids"]), "converted_units": len(to_convert),
                                            "previous_created_at": reused["created_at"]}
    read = pipeline | "Read" >> ReadSequences(source, source_url, meta, to_convert, options.on_error)
    videos = read["sequences"] | "Videos" >> WriteVideos(source_url, staging_url, meta.fps or 30.0, encode, sizes,
                                                         options.video_stats, options.on_error, options.verify_copies,
                                                         copied_columns(meta), codec_threads(options))
    sequences = videos["sequences"]
    if reused is not None and reused["ids"]:
        kept = pipeline | "Reuse" >> ReusePrevious(reused["root_url"], staging_url, meta.columns, reused["shards"], reused["ids"])
        sequences = (sequences, kept) | "AllSequences" >> beam.Flatten()
    bad = read[ERRORS] + videos[ERRORS] | "BadSequences" >> beam.Flatten()
    _ = {"sequences": sequences, ERRORS: bad} | "Write" >> WriteMixtrain(
        staging_url, output_url, meta, num_shards, sidecar_extra, options.on_error, {"context": context, "units": current},
        tuple(options.max_skipped))
    return Plan(meta, refs, num_shards, to_convert)


def _add_beam_options(parser, *, ours: bool):
    """Every pipeline option class's arguments on `parser` (ours too, or Beam's alone); one class
    per name, as Beam's own `get_all_options` does."""
    for cls in {str(cls): cls for cls in PipelineOptions.__subclasses__()}.values():
        if ours or cls is not ConvertOptions:
            cls._add_argparse_args(parser)
    return parser


def beam_unknown(argv: list[str]) -> list[str]:
    """The arguments that neither our options nor any of Beam's pipeline options take."""
    from apache_beam.options.pipeline_options import _BeamArgumentParser

    class Parser(_BeamArgumentParser):
        def error(self, message):
            raise UsageError(message, hint="python -m pipelines.convert --help_beam lists Beam's options")

    _, unknown = _add_beam_options(Parser(allow_abbrev=False), ours=True).parse_known_args(argv)
    return unknown


def known_options() -> list[str]:
    """Every option name a command line may use: ours and Beam's (for "did you mean")."""
    parser = _add_beam_options(cli.build_parser(), ours=False)
    return [option for action in parser._actions for option in action.option_strings]


def print_beam_help(out: TextIO) -> None:
    from apache_beam.options.pipeline_options import _BeamArgumentParser

    parser = _BeamArgumentParser(prog="python -m pipelines.convert", allow_abbrev=False, add_help=False)
    _add_beam_options(parser, ours=False).print_help(out)


def _launch_only(options: PipelineOptions) -> str | None:
    """Why this launch will not run the job (a dry run, a template), or None."""
    if options.view_as(StandardOptions).runner in LOCAL_RUNNERS:
        return None
    if options.view_as(TestOptions).dry_run:  # Beam takes any non-empty value as true
        return "dry run"
    if options.view_as(GoogleCloudOptions).template_location:
        return "template"
    return None


def _check_command_line(argv: list[str], options: ConvertOptions, all_options: PipelineOptions) -> None:
    """Every check that needs Beam but not the data; raises UsageError."""
    cli.check_unknown(beam_unknown(argv), known_options())
    try:
        requested_encoding(options)
        check_reachable_by_workers(all_options)
    except errors.ConversionError as error:
        raise UsageError(str(error)) from None
    if options.incremental and options.video_stats:
        raise UsageError("--video_stats cannot be combined with --incremental (image statistics of reused sequences are not "
                         "kept); run without --incremental to refresh them")
    if options.detach and all_options.view_as(StandardOptions).runner in LOCAL_RUNNERS:
        raise UsageError("--detach has no effect on a local runner (the run is this process); it is for --runner=DataflowRunner")
    roots = {}
    for flag, url in (("--input", options.input), ("--output", options.output)):
        try:
            roots[flag] = storage.open_root(url)
        except (ValueError, ImportError) as error:  # an unknown protocol, or one whose package is missing
            raise UsageError(f"{flag}={url}: {error}") from None
    (in_fs, in_root), (out_fs, out_root) = roots["--input"], roots["--output"]
    if type(in_fs) is type(out_fs) and _inside(in_root, out_root, storage.is_local(in_fs)):
        raise UsageError(f"--input={options.input} is inside --output={options.output}: publishing the output would replace "
                         "the input; choose an output folder outside the dataset")


def _inside(path: str, folder: str, local: bool) -> bool:
    if local:
        path, folder = os.path.realpath(path), os.path.realpath(folder)
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def run(argv: list[str], *, console: TextIO | None = None, out: TextIO | None = None, run_id: str | None = None,
        started: float | None = None, log_path: str | None = None, zygote: local_workers.Zygote | None = None) -> int:
    """Convert as the command line `argv` says; returns the exit status.

    Failures print one `error:` line on `console` (stderr) naming the file and the sequence, plus
    at most one hint line; progress and the summary go to `out` (stdout).
    """
    console = console or sys.stderr
    out = out or sys.stdout
    started = time.monotonic() if started is None else started
    run_id = run_id or new_run_id()
    try:
        args, _ = cli.parse(argv)
        all_options = PipelineOptions(argv)
        options = all_options.view_as(ConvertOptions)
        _check_command_line(argv, options, all_options)
    except UsageError as error:
        _usage(console, error)
        return EXIT_USAGE
    launch_only = _launch_only(all_options)
    runner = all_options.view_as(StandardOptions).runner
    local = runner in LOCAL_RUNNERS
    out_fs, out_root = storage.open_root(options.output)
    staging = publish.staging_root(out_fs, out_root, run_id)
    try:
        try:
            if not launch_only:
                with _blame(options.output, "cannot write the output"):
                    prepare_output(options.output, options.overwrite or options.incremental)
                    publish.claim_staging(out_fs, staging)
            pipeline = beam.Pipeline(runner=_runner(all_options, zygote), options=all_options)
            plan = build_pipeline(pipeline, options, run_id, write_assets=not launch_only)
            total = sources.sequence_count(plan.to_convert)
            what = f"{total} sequences" if total is not None else f"{len(plan.to_convert)} source units"
            reused = len(plan.refs) - len(plan.to_convert)
            print(f"[mixtrain-convert] {plan.meta.format}: {what}{f' ({reused} reused)' if reused else ''} -> {options.output} "
                  f"({plan.num_shards} shards)", file=out, flush=True)
            mode = options.progress if local else "off"
            if mode == "auto":
                mode = "bar" if out.isatty() else "lines"
            with Progress(out, mode, options.progress_interval or cli.DEFAULT_PROGRESS_SECONDS, total, plan.num_shards):
                result = pipeline.run()
                if not launch_only and not options.detach:
                    result.wait_until_finish()
        except (Exception, Interrupted):
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the clean-up short
            _discard(out_fs, staging, out_root)
            raise
    except UsageError as error:
        _usage(console, error)
        return EXIT_USAGE
    except Interrupted as interrupt:
        print(f"error: interrupted ({interrupt}): the output was left as it was", file=console, flush=True)
        return interrupt.exit_code
    except Exception as error:  # noqa: BLE001 - every failure becomes one line and a clean output
        message = failures.output_message(error, options.output) or failures.user_message(error)
        if message is None:  # not bad input: a fault of ours or of the platform
            first = (str(error).strip().splitlines() or [""])[0]
            message = f"{options.output}: conversion failed: {type(error).__name__}: {first}"
        _LOG.error("conversion failed: %s", message, exc_info=error)  # the traceback, for whoever reads the log
        print(f"error: {message}", file=console, flush=True)
        if log_path:
            print(f"(Beam's and the workers' log of this run: {log_path})", file=console, flush=True)
        return EXIT_FAILED
    if launch_only or options.detach:
        print(_launched(result, all_options, launch_only or "submitted"), file=out, flush=True)
        if launch_only:
            _discard(out_fs, staging, out_root)
        return EXIT_OK
    summary, skipped = _summary(out_fs, out_root, options.output, time.monotonic() - started)
    print(summary, file=out, flush=True)
    return EXIT_SKIPPED if skipped else EXIT_OK


def _discard(fs, staging: str, out_root: str) -> None:
    """Best effort after a failure: drop this run's staging (on object stores, where folders exist
    only through their objects, also an output folder left empty)."""
    try:
        publish.discard_staging(fs, staging, out_root)
        if not storage.is_local(fs) and fs.exists(out_root) and not fs.ls(out_root):
            fs.rm(out_root, recursive=True)
    except OSError:
        pass


def _summary(fs, root: str, output_url: str, seconds: float) -> tuple[str, int]:
    """The success line (root resolved before the run: `--output=.` names a folder that publication replaced)."""
    sidecar = mixtrain.read_sidecar(fs, root)
    total_bytes = sum(info["size"] for info in fs.find(publish.published_root(fs, root), detail=True).values())
    skipped = int(sidecar.get("num_skipped", 0))
    units = int(sidecar.get("num_skipped_units", 0))
    line = (
        f"converted {sidecar['num_sequences']} sequences, {sidecar['num_timesteps']} timesteps, "
        f"{total_bytes / 1e6:.2f} MB in {seconds:.1f} s -> {output_url}"
    )
    non_finite = sidecar.get("non_finite_values") or {}
    if non_finite:
        line += f"; kept {sum(non_finite.values())} NaN/inf value(s) (" + ", ".join(f"{k}: {v}" for k, v in non_finite.items()) + ")"
    if skipped or units:
        what = " and ".join(part for part in (skipped and f"{skipped} bad sequence(s)",
                                              units and f"{units} unreadable source unit(s) whose sequences could not be counted") if part)
        line += f"; skipped {what}, listed in {storage.join(root, mixtrain.ERRORS_FILE)}"
    return line, skipped + units


@contextlib.contextmanager
def _blame(url: str, what: str):
    """A failure that is not our ConversionError (storage unreachable, no credentials, permissions)
    becomes one naming the URL it concerns; the original stays the cause, for the log."""
    try:
        yield
    except errors.ConversionError:
        raise
    except Exception as error:  # noqa: BLE001 - filesystems raise many kinds
        first = (str(error).strip().splitlines() or [""])[0]
        raise errors.ConversionError(f"{url}: {what}: {type(error).__name__}: {first}") from error


def new_run_id() -> str:
    import uuid

    return time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:8]


def _usage(console: TextIO, error: UsageError) -> None:
    print(f"error: {error}", file=console, flush=True)
    if error.hint:
        print(error.hint, file=console, flush=True)


def _launched(result, options: PipelineOptions, how: str) -> str:
    """What a launch that does not wait for the job prints instead of a summary."""
    google = options.view_as(GoogleCloudOptions)
    job = getattr(result, "job", None)
    name = getattr(getattr(job, "proto", None), "name", None) or google.job_name
    if how == "dry run":
        return f"[mixtrain-convert] dry run: job {name} was built and not submitted; nothing was written to {google.temp_location or 'GCS'} " \
               f"or to the output"
    if how == "template":
        return f"[mixtrain-convert] template of job {name} written to {google.template_location}; nothing was converted"
    job_id = result.job_id() if hasattr(result, "job_id") else None
    url = f"https://console.cloud.google.com/dataflow/jobs/{google.region}/{job_id}?project={google.project}"
    return f"[mixtrain-convert] submitted job {name} (id {job_id}): {url}; it publishes the dataset when it finishes"
