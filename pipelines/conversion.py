"""The conversion behind `python -m pipelines.convert`: plan on the launcher, build the Beam
pipeline, run it, and turn every outcome into an exit status and one line.

`pipelines.convert` parses the command line without Beam (fast help, typos refused at once) and
calls `run` here. Exit status: 0 converted; 1 bad input or a failed conversion (one `error:` line
on stderr naming the file and the sequence, the output left as it was); 2 bad command line; 3
converted with --on_error=skip but some sequences were skipped; 130 / 143 interrupted.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
import signal
import sys
import time
from typing import TextIO

# Before Arrow is imported: its jemalloc pool returns freed memory to the system, where mimalloc
# (the default) kept ~80 MB more at peak on long episodes (bench workload d). Set it to override.
if sys.platform.startswith("linux"):
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")

import apache_beam as beam
from apache_beam.options.pipeline_options import DirectOptions, GoogleCloudOptions, PipelineOptions, StandardOptions, TestOptions

from formats import errors, mixtrain, sources, storage
from formats.mixtrain import publish, quality, resume, tables
from formats.mixtrain.tables import lake, lance
from formats.text import for_terminal
from pipelines import cli, failures, local_workers, preflight
from pipelines.beam_flags import DASK_FLAGS
from pipelines.cli import EXIT_FAILED, EXIT_OK, EXIT_SKIPPED, UsageError
from pipelines.early_plan import EarlyPlan
from pipelines.plan import ConversionPlan, blame, created_now, make_plan, without_cycle_collection
from pipelines.progress import Progress
from pipelines.session import Interrupted, interrupted_by, new_run_id
from transforms import staged_plan
from transforms.errors import ERRORS
from transforms.read import TALLIES, ReadSequences, stage_refs
from transforms.resume import ResumeSpilled, stage_resumed
from transforms.reuse import KEPT_IDS, ReusePrevious
from transforms.video import WriteVideos
from transforms.write import Checks, Planned, WriteMixtrain, stage_fingerprints

__all__ = ["ConvertOptions", "build_pipeline", "run"]

# Runner names that mean "run here" (pipelines/preflight.py): served by Beam's FnApiRunner directly,
# because Beam's DirectRunner first tries Prism, which downloads a binary (NOTES.md) and ignores
# --direct_num_workers / --direct_running_mode.
_LOG = logging.getLogger("mixtrain-convert")


class ConvertOptions(PipelineOptions):
    """Our options registered with Beam too: the job's options (Dataflow UI, Flex Template) are these."""

    @classmethod
    def _add_argparse_args(cls, parser):
        cli.add_arguments(parser)


def _runner(options: PipelineOptions, zygote: local_workers.Zygote | None):
    name = options.view_as(StandardOptions).runner
    if name in preflight.LOCAL_RUNNERS:
        return local_workers.runner(zygote)
    if name == preflight.DASK:
        from pipelines.dask_runner import DaskRunner

        return DaskRunner()
    return name


def prepare_output(output_url: str, overwrite: bool, table_format: str = tables.DEFAULT) -> None:
    """Refuse to touch an output that holds something we did not write, or a dataset without
    --overwrite; and, where publication replaces the whole folder, one that holds anything else."""
    fs, root = storage.open_root(output_url)
    publish.check_no_live_run(fs, root)
    if not fs.exists(root):
        return
    if not fs.isdir(root):
        raise errors.ConversionError(f"{root}: output exists and is not a directory")
    if lance.is_dataset(fs, root):  # each run publishes a new version of it
        if table_format != "lance":
            raise errors.ConversionError(f"{root}: output holds a Lance dataset; pass --table_format=lance to publish a new "
                                         "version of it, or choose another --output")
        if not overwrite:
            raise errors.ConversionError(preflight.already_published(root, "Lance"))
        return
    names = {entry.rstrip("/").rsplit("/", 1)[-1] for entry in fs.ls(root, detail=False)}
    if not names - {publish.STAGING_DIR}:
        return
    problem = preflight.foreign_output(fs, root)
    if problem is not None:
        raise errors.ConversionError(problem)
    foreign = publish.foreign_entries(fs, root)
    if not overwrite:
        raise errors.ConversionError(preflight.already_published(root, "Mixtrain"))
    if foreign and storage.is_local(fs) and publish.replaces_whole_folder(root):
        raise errors.ConversionError(f"{root}: the output folder also holds {', '.join(foreign)}, which replacing the dataset "
                                     "would delete (the whole folder is replaced); move them out or choose another --output")


def table_settings(options: ConvertOptions, run_id: str, base: str = "") -> tables.TableSettings:
    """The --table_format and its options, for the publish step (`base`: the lake table's state at planning)."""
    return tables.TableSettings(format=options.table_format, run_id=run_id, incremental=bool(options.incremental),
                                catalog=options.catalog, table=options.table_name, base=base,
                                partition_by=tuple(column for column in options.partition_by.split(",") if column),
                                video_storage=options.lance_videos if options.table_format == "lance" else "")


def quality_checks(options: ConvertOptions, meta) -> Checks | None:
    """The data-quality checks the shard writers run (--quality and its thresholds), or None."""
    if not options.quality:
        return None
    given = {name: getattr(options, f"quality_{name}") for name, *_ in cli.QUALITY_THRESHOLDS}
    return Checks(meta.fps, quality.Thresholds(**{name: value for name, value in given.items() if value is not None}))


def staging_root(fs, root: str, run_id: str, options: ConvertOptions) -> str:
    """Where this run writes: its own folder inside a lake table's location (where it stays), or
    the standalone layout's staging (moved into place on publication)."""
    if lake.is_lake(options.table_format):
        return lake.run_root(root, run_id)
    return publish.staging_root(fs, root, run_id)


def codec_threads(options: PipelineOptions) -> int | None:
    """Local runs share the cores among the workers' codecs; a Dataflow worker has its own cores
    and the codecs' own choice (None) stands; a Dask worker learns its share from the runner
    (transforms.video.CODEC_THREADS_ENV)."""
    if options.view_as(StandardOptions).runner not in preflight.LOCAL_RUNNERS:
        return None
    return local_workers.codec_threads(options.view_as(DirectOptions).direct_num_workers)


def local_partitions(options: PipelineOptions) -> int | None:
    """Into how many parts the local runner deals each stage's input (Beam's FnApiRunner:
    --direct_num_workers, 0 for multiprocessing.cpu_count(), which os.cpu_count() is: Beam's own
    count, not the CPUs this process may use that `local_workers.codec_threads` shares out), so
    that the refs' batches can be dealt evenly (`transforms.read.ref_batches`; `build_pipeline`
    passes the same answer to `ReadSequences`); None where the runner spreads work its own way."""
    if options.view_as(StandardOptions).runner not in preflight.LOCAL_RUNNERS:
        return None
    workers = options.view_as(DirectOptions).direct_num_workers
    return (os.cpu_count() or 1) if workers == 0 else max(1, workers or 1)


def build_pipeline(pipeline: beam.Pipeline, options: ConvertOptions, run_id: str, *, write_assets: bool = True,
                   plan_folder: staged_plan.PlanFolder | None = None, early_plan: EarlyPlan | None = None,
                   journal: resume.Journal | None = None, resumed: list | None = None, staging: str | None = None) -> ConversionPlan:
    """Plan (`pipelines.plan.make_plan`, or the early planner's plan) and add the conversion it
    describes to `pipeline`. `write_assets=False` (dry runs, templates) leaves the output untouched: no asset
    is copied into the staging, and the plan files go elsewhere (below).

    The plan's per-unit data (the refs, the fingerprints, the ids an --incremental run reuses) is
    written to files the workers read (`transforms/staged_plan.py`), never into the graph: to
    `plan_folder` when given (a classic template's, beside it), else to the staging folder's `_plan/`
    (removed before publication), or with `write_assets=False` to a temporary folder on the
    launcher, removed when the process exits: a dry run builds the graph and runs nothing.
    `early_plan`: the planner forked before Beam was imported (`pipelines/early_plan.py`), whose
    plan is taken when it is done and was made for this output (never under --incremental)."""
    out_fs, out_root = storage.open_root(options.output)
    output_url = storage.url_for(out_fs, out_root)
    settings = table_settings(options, run_id)
    previous_root = out_root
    if lake.is_lake(settings.format):  # the table's state before planning: a commit refuses to land on a newer one
        settings = dataclasses.replace(settings, base=lake.current_state(output_url, settings))
        previous_root = lake.previous_run_root(out_fs, out_root, output_url, settings)
    plan = None
    if early_plan is not None and options.incremental:  # never forked for it (early_plan.wanted); stopped if it was
        early_plan.cancel()
    elif early_plan is not None:
        plan = early_plan.result(output_url=output_url)
    if plan is None:
        plan = make_plan(options, output_url=output_url, previous_root=previous_root, created_at=created_now())
    meta = plan.meta
    staging = staging or staging_root(out_fs, out_root, run_id, options)  # the run's own (an adopted one is `journal.staging`)
    staging_url = storage.url_for(out_fs, staging)
    pending, generation, resumption, fingerprints = plan.to_convert, None, None, plan.fingerprints
    if write_assets:
        with without_cycle_collection():
            units, _ = plan.source.incremental_units(list(plan.to_convert))
            fingerprints = dataclasses.replace(fingerprints, known=fingerprints.units)
        keep = (lake.PENDING,) if lake.is_lake(settings.format) else ()
        resumption, why_not = _resumption(out_fs, staging, journal, plan, units, fingerprints.known, keep)
        if resumed is not None and (resumption is not None or why_not):
            resumed.append(resumption or why_not)
        pending = resumption.pending if resumption is not None else plan.to_convert
        generation = resumption.generation if resumption is not None else 1
        resume.write_header(out_fs, staging, generation, output=resume.output_identity(out_fs, out_root), run_id=run_id,
                            context=fingerprints.context,
                            options=plan.sidecar_extra["options"],
                            units={unit.key: fingerprints.known[unit.key]["fingerprint"] for unit, _ in units})
        fs, root = storage.open_root(plan.source_url)
        publish.copy_assets(fs, root, out_fs, staging, list(plan.assets))
    plan_folder = plan_folder or staged_plan.PlanFolder.create(storage.join(staging_url, staged_plan.PLAN_DIR) if write_assets
                                                               else _launcher_folder())
    with without_cycle_collection():
        workers = local_partitions(options)
        files = stage_refs(list(pending), plan_folder, workers)
        stage_fingerprints(fingerprints, plan_folder)
    read = pipeline | "Read" >> ReadSequences(plan.source, plan.source_url, meta, plan_folder, files, options.on_error,
                                              spread_batches=workers is None,
                                              journal=(staging_url, generation) if generation is not None else None)
    videos = read["sequences"] | "Videos" >> WriteVideos(plan.source_url, staging_url, meta.fps or 30.0, plan.encode, plan.sizes,
                                                         options.video_stats, options.on_error, options.verify_copies,
                                                         plan.copied, codec_threads(options))
    sequences = videos["sequences"]
    file_prefix = ""
    if lake.is_lake(settings.format):  # file references relative to the table location
        file_prefix = lake.run_prefix(run_id)
        sequences = sequences | "TablePaths" >> beam.Map(lake.with_run_prefix, file_prefix)
    inputs = {"sequences": sequences}
    reused = plan.reused
    if reused is not None and reused["ids"]:
        staged_plan.write_value(plan_folder, KEPT_IDS, sorted(reused["ids"]))
        inputs["kept"] = pipeline | "Reuse" >> ReusePrevious(reused["root_url"], staging_url, meta.columns, reused["shards"],
                                                             plan_folder, link_files=not lake.is_lake(settings.format))
    tallies = list(read[TALLIES])
    if resumption is not None and resumption.spilled:
        inputs["resumed"] = pipeline | "Resume" >> ResumeSpilled(staging_url, plan_folder, stage_resumed(resumption, plan_folder),
                                                                 plan.num_shards)
        if resumption.tallies:
            tallies.append(pipeline | "ResumedTallies" >> beam.Create(resumption.tallies))
    inputs[ERRORS] = read[ERRORS] + videos[ERRORS] | "BadSequences" >> beam.Flatten()
    if tallies:
        inputs[TALLIES] = tallies | "Tallies" >> beam.Flatten()
    planned = Planned.of(plan.to_convert, len(reused["ids"]) if reused is not None else 0)
    _ = inputs | "Write" >> WriteMixtrain(staging_url, output_url, meta, plan.num_shards, plan.sidecar_extra, options.on_error,
                                          plan_folder, tuple(options.max_skipped), settings, planned, generation, file_prefix,
                                          mark_published=write_assets and not options.detach, checks=quality_checks(options, meta))
    return plan


def _resumption(fs, staging: str, journal: resume.Journal | None, plan: ConversionPlan, units: list,
                current: dict, keep: tuple[str, ...]) -> tuple[resume.Resumption | None, str]:
    """What this run takes from the interrupted run's journal in its staging folder, or (None, why
    it takes nothing): a journal written with other options or by another converter version is
    discarded with everything the folder holds, and the run starts afresh in it."""
    if journal is None:
        return None, ""
    latest = journal.latest or {}
    if latest.get("context") == plan.fingerprints.context:
        resumption = resume.plan(journal, units, current)
        resume.tidy(fs, journal, resumption, keep)
        return resumption, ""
    changed = resume.options_changed(latest.get("options") or {}, plan.sidecar_extra["options"]) if latest else []
    why = (f"with other options ({', '.join(changed)})" if changed else
           "by another converter version" if latest else "without a readable record of its run")
    resume.clear(fs, staging, keep)
    return None, (f"the interrupted run {journal.run_id} for this output was converting {why}; its "
                  f"{journal.sequences} recorded sequences are discarded and every sequence is converted")


def _launcher_folder() -> str:
    """A folder on the launcher for a plan no worker will read (a dry run), removed at exit (and,
    when the command line leaves through os._exit, with the session's temporary folder)."""
    import atexit
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="mixtrain-plan-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


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
    """Every option name a command line may use: ours, Beam's and its DaskRunner's (for "did you mean")."""
    parser = _add_beam_options(cli.build_parser(), ours=False)
    return sorted({option for action in parser._actions for option in action.option_strings} | DASK_FLAGS)


def print_beam_help(out: TextIO) -> None:
    from apache_beam.options.pipeline_options import _BeamArgumentParser

    if importlib.util.find_spec("dask") is not None and importlib.util.find_spec("distributed") is not None:
        import pipelines.dask_runner  # noqa: F401 - Beam's DaskOptions listed too
    parser = _BeamArgumentParser(prog="python -m pipelines.convert", allow_abbrev=False, add_help=False)
    _add_beam_options(parser, ours=False).print_help(out)


def _launch_only(options: PipelineOptions) -> str | None:
    """Why this launch will not run the job (a dry run, a template), or None."""
    if options.view_as(StandardOptions).runner in preflight.LOCAL_RUNNERS:
        return None
    if options.view_as(TestOptions).dry_run:  # Beam takes any non-empty value as true
        return "dry run"
    if options.view_as(GoogleCloudOptions).template_location:
        return "template"
    return None


def _check_command_line(argv: list[str], options: ConvertOptions, all_options: PipelineOptions) -> None:
    """Every check that needs Beam but not the data; raises UsageError."""
    cli.check_unknown(beam_unknown(argv), known_options())
    if options.table_format == "lance" and importlib.util.find_spec("lance") is None:
        raise UsageError("--table_format=lance needs pylance, which is not installed: pip install 'mixtrain-convert[lance]'")
    if options.table_format not in tables.names():
        raise UsageError(f"--table_format={options.table_format} is not available in this build (available: {', '.join(tables.names())})")
    if lake.missing_library(options.table_format):
        raise UsageError(f"--table_format={options.table_format} needs {lake.missing_library(options.table_format)}, which is not "
                         "installed: pip install 'mixtrain-convert[lake]' (or -e '.[lake]' in a clone)")


def run(argv: list[str], *, console: TextIO | None = None, out: TextIO | None = None, run_id: str | None = None,
        started: float | None = None, log_path: str | None = None, zygote: local_workers.Zygote | None = None,
        early_plan: EarlyPlan | None = None) -> int:
    """Convert as the command line `argv` says; returns the exit status.

    Failures print one `error:` line on `console` (stderr) naming the file and the sequence, plus
    at most one hint line; progress and the summary go to `out` (stdout).
    """
    console = console or sys.stderr
    out = out or sys.stdout
    started = time.monotonic() if started is None else started
    run_id = run_id or new_run_id()
    try:
        argv = preflight.as_meant(argv)
        args, rest = cli.parse(argv)
        preflight.check(args, argv, rest)
        if preflight.uses_dask(argv):  # Beam's DaskOptions registered before the command line is checked against Beam's options
            if importlib.util.find_spec("dask") is None or importlib.util.find_spec("distributed") is None:
                raise UsageError("--runner=DaskRunner needs dask.distributed, which is not installed: pip install "
                                 "'mixtrain-convert[dask]' (on the launcher and on every worker)")
            import pipelines.dask_runner  # noqa: F401
        all_options = PipelineOptions(argv)
        options = all_options.view_as(ConvertOptions)
        _check_command_line(argv, options, all_options)
    except UsageError as error:
        return failures.report(error, console, output="", log_path=None)  # a command-line error names no output
    except preflight.Refusal as error:
        print(f"error: {for_terminal(error)}", file=console, flush=True)
        return EXIT_FAILED
    launch_only = _launch_only(all_options)
    runner = all_options.view_as(StandardOptions).runner
    local = runner in preflight.LOCAL_RUNNERS
    try:  # the stores first: an unreachable one (no network, no credentials) is one line, at once
        in_fs, in_root, found = storage.open_reachable(options.input)
        if not found:
            raise errors.FormatError(f"{storage.url_for(in_fs, in_root)}: input not found")
        out_fs, out_root, exists = storage.open_reachable(options.output)
        created = None if exists else _first_missing(out_fs, out_root)  # a failed run removes the folders it made
    except errors.ConversionError as error:
        print(f"error: {for_terminal(error)}", file=console, flush=True)
        return EXIT_FAILED
    staging = staging_root(out_fs, out_root, run_id, options)
    result, journal, started_pipeline, kept, taken, claimed, lease = None, None, False, None, 0, False, None
    try:
        try:
            if not launch_only:
                with blame(options.output, "cannot write the output"):
                    if lake.is_lake(options.table_format):
                        lake.prepare_output(out_fs, out_root, storage.url_for(out_fs, out_root), table_settings(options, run_id),
                                            options.overwrite or options.incremental)
                    else:
                        prepare_output(options.output, options.overwrite or options.incremental, options.table_format)
                    resume.check_no_leased_run(out_fs, out_root)
                    journal = _interrupted_run(out_fs, out_root, options, out)
                    if journal is not None:  # this run resumes it, in its folder and under its name
                        staging, run_id = journal.staging, journal.run_id
                    if not lake.is_lake(options.table_format):
                        resume.collect_leftovers(out_fs, out_root, keep=journal.staging if journal is not None else None)
                    publish.claim_staging(out_fs, staging)
                    claimed = True  # from here on the folder is this run's to remove, or to keep for a resumption
                    lease = resume.Lease(out_fs, staging).__enter__()
                    if lake.is_lake(options.table_format):
                        lake.begin_run(out_fs, staging)
            pipeline = beam.Pipeline(runner=_runner(all_options, zygote), options=all_options)
            template_plan = staged_plan.PlanFolder.create(template_plan_url(all_options, run_id)) if launch_only == "template" else None
            resumed: list = []
            plan = build_pipeline(pipeline, options, run_id, write_assets=not launch_only, plan_folder=template_plan,
                                  early_plan=early_plan, journal=journal, resumed=resumed, staging=staging)
            pending = plan.to_convert
            for outcome in resumed:
                if isinstance(outcome, resume.Resumption):
                    pending, taken = outcome.pending, outcome.sequences
                    print(for_terminal(f"[mixtrain-convert] resuming {resume.describe(outcome.journal, out_fs)}: {outcome.sequences} "
                                       f"sequences reused, {len(outcome.pending)} of {len(plan.to_convert)} units left to convert"),
                          file=out, flush=True)
                else:
                    print(for_terminal(f"[mixtrain-convert] {outcome}"), file=out, flush=True)
            total = sources.sequence_count(pending)
            what = f"{total} sequences" if total is not None else f"{len(pending)} source units"
            reused = len(plan.refs) - len(plan.to_convert)
            limit = plan.sidecar_extra["options"].get("limit")
            if limit:
                what += f" (--limit: the first {limit['first']} of {limit['of']} units)"
            if plan.reused is not None and plan.reused["context_changed"]:
                print("[mixtrain-convert] --incremental: the previous output was written with other options or by another "
                      "converter version; every sequence is converted again", file=out, flush=True)
            print(f"[mixtrain-convert] {plan.meta.format}: {what}{f' ({reused} reused)' if reused else ''} -> {options.output} "
                  f"({plan.num_shards} shard{'s' if plan.num_shards != 1 else ''})", file=out, flush=True)
            mode = options.progress if local or runner == preflight.DASK else "off"  # Dask workers send it as events
            if mode == "auto":
                mode = "bar" if out.isatty() else "lines"
            with Progress(out, mode, options.progress_interval or cli.DEFAULT_PROGRESS_SECONDS, total, plan.num_shards):
                started_pipeline = True
                result = pipeline.run()
                if not launch_only and not options.detach:
                    result.wait_until_finish()
                    _check_published(out_fs, out_root, staging, options, run_id)
        except (Exception, Interrupted) as failure:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the clean-up short
            if lease is not None:
                lease.__exit__(None, None, None)  # given up before the folder is removed or kept
            if result is not None and not local and not options.detach:  # the cluster's or Dataflow's tasks stop too
                _cancel(result)
            if not claimed and not launch_only:
                pass  # refused before it claimed a folder: whatever is there belongs to another run
            elif lake.is_lake(options.table_format) and lake.is_committed(out_fs, staging, table_settings(options, run_id)):
                pass  # the table references this run's files (a commit landed before the failure): keep them
            elif (started_pipeline or journal is not None) and _kept_for_resumption(out_fs, staging):
                kept = storage.shown(out_fs, staging)  # what it completed stays, hidden from readers, for the same command to resume
            elif isinstance(failure, failures.RunnerLost) and not local:
                pass  # a cluster's worker may still be publishing from it (a lost scheduler lets its task end): the next run collects it
            else:
                _discard(out_fs, staging, out_root, created)
            raise
    except (Interrupted, Exception) as error:  # noqa: BLE001 - every failure becomes one line and a clean output
        interrupt = interrupted_by(error)
        if interrupt is not None:
            if error is not interrupt:  # what failed on the way out (a clean-up after the interrupt), for the log
                _LOG.error("interrupted; then: %s", error, exc_info=error)
            message = interrupt.message() + (f"; {_resume_hint(kept)}" if kept else "")
            print(f"error: {for_terminal(message)}", file=console, flush=True)
            return interrupt.exit_code
        return failures.report(error, console, output=options.output, log_path=log_path, kept_hint=_resume_hint(kept) if kept else "")
    finally:
        if lease is not None:
            lease.__exit__(None, None, None)
        publish.release_staging(staging)  # kept for a resumption or gone: another process may take it now
    if launch_only or options.detach:
        print(_launched(result, all_options, launch_only or "submitted", run_id), file=out, flush=True)
        if launch_only:
            _discard(out_fs, staging, out_root, created)
        return EXIT_OK
    if lake.is_lake(options.table_format):
        summary, skipped = _lake_summary(out_fs, out_root, options, run_id, time.monotonic() - started)
    else:
        summary, skipped = _summary(out_fs, out_root, options.output, time.monotonic() - started)
    if taken:
        summary += f"; resumed: {taken} of them reused from the interrupted run {run_id}, not converted again"
    print(for_terminal(summary), file=out, flush=True)
    return EXIT_SKIPPED if skipped else EXIT_OK


def _interrupted_run(fs, root: str, options: ConvertOptions, out: TextIO) -> resume.Journal | None:
    """The journal of the newest run for this output that was interrupted (no live process owns
    its staging folder, no commit of it landed), which this run resumes; None to start afresh.
    With --fresh every such folder is removed first (said on `out`); one whose journal names
    another output (copied from elsewhere) is never resumed (--fresh discards it; a local one is
    collected after publication like any leftover)."""
    identity = resume.output_identity(fs, root)
    is_lake = lake.is_lake(options.table_format)
    for journal in resume.interrupted(fs, root, lake_table=is_lake):
        if is_lake and lake.is_committed(fs, journal.staging, table_settings(options, journal.run_id)):
            continue  # its commit landed: part of the table's history, not an interrupted run
        if options.fresh:
            print(for_terminal(f"[mixtrain-convert] --fresh: discarding the interrupted {resume.describe(journal, fs)}"), file=out, flush=True)
            publish.discard_staging(fs, journal.staging, root)
            continue
        latest = journal.latest
        if latest is not None and latest.get("output") != identity:
            continue
        return journal
    return None


def _check_published(fs, root: str, staging: str, options: ConvertOptions, run_id: str) -> None:
    """A runner that reports success must have run the publish step of this run (its marker, or
    the lake table's current run): a runner that lost its publish step would otherwise print the
    previous dataset's numbers with exit 0 (Beam's DaskRunner did, when its scheduler died)."""
    if lake.is_lake(options.table_format):  # a version of the table names this run (another writer may have committed since)
        done = lake.is_committed(fs, staging, table_settings(options, run_id))
    else:
        done = publish.take_done(fs, staging, root)
    if not done:
        raise errors.ConversionError(f"{options.output}: the runner reported the run done, but its publish step never ran; "
                                     "nothing was published")


def _kept_for_resumption(fs, staging: str) -> bool:
    """Whether a failed run's staging holds completed work worth resuming (a journal entry)."""
    return storage.holds_entries(fs, storage.join(staging, resume.DONE_DIR))


def _resume_hint(staging: str) -> str:
    return (f"the sequences it completed are kept in {staging}: run the same command again to resume, "
            "or add --fresh to start afresh")


def _cancel(result) -> None:
    """Best effort: a failed or interrupted run's remaining work on a cluster cancelled."""
    try:
        result.cancel()
    except Exception:  # noqa: BLE001 - the run already failed; its own error is the one to report
        _LOG.warning("could not cancel the run's remaining work", exc_info=True)


def _first_missing(fs, out_root: str) -> str | None:
    """The outermost folder of the missing `out_root`'s path that does not exist yet (the output or
    a parent that the run will create on the way)."""
    missing = out_root
    if storage.is_local(fs):
        parent = os.path.dirname(missing)
        while parent != missing and not os.path.exists(parent):
            missing, parent = parent, os.path.dirname(parent)
    return missing


def _discard(fs, staging: str, out_root: str, created: str | None) -> None:
    """Best effort after a failure, so the output is left as it was: drop this run's staging, a
    lake table's `runs/` when no other run's folder is in it, and the folders this run created
    (the output and the parents made for it) when nothing else is in them (on object stores,
    where folders exist only through their objects, any output folder left empty)."""
    try:
        publish.discard_staging(fs, staging, out_root)
        runs = storage.join(out_root, lake.RUNS_DIR)
        if staging.startswith(runs + "/") and fs.exists(runs) and not fs.ls(runs):
            fs.rm(runs, recursive=True)
        if not storage.is_local(fs):
            if fs.exists(out_root) and not fs.ls(out_root):
                fs.rm(out_root, recursive=True)
            return
        folder = out_root
        while created is not None and (folder == created or folder.startswith(created.rstrip("/") + "/")):
            if os.path.isdir(folder) and not os.listdir(folder):
                os.rmdir(folder)
            folder = os.path.dirname(folder)
    except OSError:
        pass


def _summary(fs, root: str, output_url: str, seconds: float) -> tuple[str, int]:
    """The success line (root resolved before the run: `--output=.` names a folder that publication replaced)."""
    sidecar = (lance.read_sidecar if lance.is_dataset(fs, root) else mixtrain.read_sidecar)(fs, root)
    total_bytes = sum(info["size"] for info in fs.find(publish.published_root(fs, root), detail=True).values())
    skipped = int(sidecar.get("num_skipped", 0))
    units = int(sidecar.get("num_skipped_units", 0))
    line = (f"{_sequences_phrase(sidecar)}, {sidecar['num_timesteps']} timesteps, {total_bytes / 1e6:.2f} MB in {seconds:.1f} s "
            f"-> {output_url}")
    non_finite = sidecar.get("non_finite_values") or {}
    if non_finite:
        line += f"; kept {sum(non_finite.values())} NaN/inf value(s) (" + ", ".join(f"{k}: {v}" for k, v in non_finite.items()) + ")"
    if skipped or units:
        what = " and ".join(part for part in (skipped and f"{skipped} bad sequence(s)",
                                              units and f"{units} unreadable source unit(s) whose sequences could not be counted") if part)
        line += f"; skipped {what}, listed in {storage.join(root, mixtrain.ERRORS_FILE)}"
    return line, skipped + units


def _sequences_phrase(sidecar: dict) -> str:
    """What the run did to the sequences: 'converted N sequences', or with --incremental how many of
    the published ones it converted and how many it kept unchanged (all 12 reused is not "converted 12")."""
    total = sidecar.get("num_sequences")
    incremental = sidecar.get("incremental") or {}
    if not incremental:
        return f"converted {total} sequences"
    reused = int(incremental.get("reused_sequences", 0))
    return f"published {total} sequences (--incremental: {int(total or 0) - reused} converted, {reused} unchanged sequences reused)"


def _lake_summary(fs, root: str, options: ConvertOptions, run_id: str, seconds: float) -> tuple[str, int]:
    """The success line of a lake run: what was committed, where the table is and how to open it."""
    value, where = lake.summary(storage.url_for(fs, root), table_settings(options, run_id))
    skipped = int(value.get("num_skipped", 0)) + int(value.get("num_skipped_units", 0))
    # What this run wrote (its folder: every shard, and the videos it converted; reused ones stay in earlier runs' folders).
    written = sum(info["size"] for info in fs.find(lake.run_root(root, run_id), detail=True).values())
    line = (f"{_sequences_phrase(value)}, {value.get('num_timesteps')} timesteps, {written / 1e6:.2f} MB in "
            f"{seconds:.1f} s -> {options.output}: {where}")
    if skipped:
        line += f"; skipped {skipped}, listed in {storage.join(root, value.get('errors', mixtrain.ERRORS_FILE))}"
    return line, skipped


def template_plan_url(options: PipelineOptions, run_id: str) -> str:
    """Where a classic template's plan files go: beside it, since every job launched from it reads
    them, in a folder of this run's own, so that writing the template again never mixes two plans
    under a job being launched from the first."""
    return f"{options.view_as(GoogleCloudOptions).template_location.rstrip('/')}.plan/{run_id}"


def _launched(result, options: PipelineOptions, how: str, run_id: str) -> str:
    """What a launch that does not wait for the job prints instead of a summary."""
    google = options.view_as(GoogleCloudOptions)
    job = getattr(result, "job", None)
    name = getattr(getattr(job, "proto", None), "name", None) or google.job_name
    if how == "dry run":
        return f"[mixtrain-convert] dry run: job {name} was built and not submitted; nothing was written to {google.temp_location or 'GCS'} " \
               f"or to the output"
    if how == "template":
        return (f"[mixtrain-convert] template of job {name} written to {google.template_location} (its plan files to "
                f"{template_plan_url(options, run_id)}, which its jobs' workers read); nothing was converted")
    job_id = result.job_id() if hasattr(result, "job_id") else None
    url = f"https://console.cloud.google.com/dataflow/jobs/{google.region}/{job_id}?project={google.project}"
    return f"[mixtrain-convert] submitted job {name} (id {job_id}): {url}; it publishes the dataset when it finishes"
