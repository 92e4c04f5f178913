"""`python -m pipelines.export --input=MIXTRAIN --output=DST --to=lerobot_v3|lerobot_v2.1`: a Mixtrain
dataset this converter wrote, written out as a LeRobot dataset (docs/export.md).

The plan (episode order, which episodes share a file) is made here from the metadata and the
scalar columns; Beam reads the shards, writes each group of episodes on a worker, then `meta/`.
Everything is written into a staging folder beside DST, which becomes DST only when complete:
an export that fails or is interrupted leaves DST as it was.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import sys
import time
import uuid
from typing import TextIO

from formats import storage
from formats.errors import ConversionError
from formats.text import for_terminal
from pipelines import exit_without_teardown
from pipelines.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE

FORMATS = ("lerobot_v3", "lerobot_v2.1")
RUNNERS = ("DirectRunner", "DaskRunner", "DataflowRunner")
# Beam's options the export refuses with DataflowRunner: they would launch a job and not run it, so
# nothing would be published (the conversion's --dry_run and templates, docs/dataflow.md).
LAUNCH_ONLY = ("--dry_run", "--template_location")
STAGING_MARK = ".mixtrain-export-"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, as every command of this package says a bad command line
        print(f"error: {message} (see --help)", file=sys.stderr)
        sys.exit(EXIT_USAGE)


def parser() -> argparse.ArgumentParser:
    installed = os.path.basename(sys.argv[0]) == "mixtrain-export"  # the console script, else python -m
    p = _Parser(prog="mixtrain-export" if installed else "python -m pipelines.export", allow_abbrev=False,
                description="Write a Mixtrain dataset (standalone, Iceberg, Delta or Lance, as this converter wrote it) as a LeRobot "
                            "dataset. The output appears only when complete.")
    p.add_argument("--input", required=True, help="the Mixtrain dataset: a local path, gs://, s3:// or another fsspec URL")
    p.add_argument("--output", required=True, help="the folder to write (must not exist, or be empty, unless --overwrite)")
    p.add_argument("--to", required=True, choices=FORMATS,
                   help="the layout to write: lerobot_v3 (as lerobot 0.6 writes it) or lerobot_v2.1 (as lerobot 0.3 writes it)")
    p.add_argument("--fresh", action="store_true",
                   help="discard what an interrupted export of this output kept for resumption and write everything anew")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing output (on a local disk the old one stays until the new one is complete; on an object "
                        "store its files are removed before the new ones are moved in)")
    p.add_argument("--data_file_mb", type=float, default=None,
                   help="lerobot_v3: roll data files over at about this size, like lerobot's data_files_size_in_mb (default 100)")
    p.add_argument("--video_file_mb", type=float, default=None,
                   help="lerobot_v3: roll each camera's video files over at about this size, like lerobot's video_files_size_in_mb "
                        "(default 200)")
    p.add_argument("--fps", type=float, default=None,
                   help="the frame rate to declare for a dataset that records none (no camera, no source rate); refused for a "
                        "dataset that records one")
    p.add_argument("--direct_num_workers", type=int, default=None,
                   help="DirectRunner: local worker processes (0: one per core; default 1)")
    p.add_argument("--runner", default="DirectRunner", choices=RUNNERS,
                   help="Beam runner: DirectRunner (this machine, the default), DaskRunner (a Dask cluster, pip install "
                        "'mixtrain-convert[dask]'; its workers must reach the input and the output: an object store, or a file "
                        "system they share) or DataflowRunner (Google Cloud; input and output on gs://, and Beam's own options "
                        "after ours: --project, --region, --temp_location and any other of python -m pipelines.convert "
                        "--help_beam, as for the conversion, docs/dataflow.md)")
    p.add_argument("--dask_client_address", default=None,
                   help="DaskRunner: the scheduler's address, HOST:PORT or tcp://HOST:PORT (default: a local cluster of this machine)")
    p.add_argument("--dask_scheduler_file", default=None,
                   help="DaskRunner: the file `dask scheduler --scheduler-file` wrote, instead of --dask_client_address")
    return p


def run(argv: list[str], *, out: TextIO | None = None, console: TextIO | None = None) -> int:
    out, console = out or sys.stdout, console or sys.stderr
    args, rest = parser().parse_known_args(argv)
    refusal = _beam_options_refusal(args, rest)
    if refusal:
        print(f"error: {for_terminal(refusal)} (see --help)", file=console)
        return EXIT_USAGE
    args.beam_options = rest
    sizes = [value for value in (args.data_file_mb, args.video_file_mb) if value is not None]
    if args.to == "lerobot_v2.1" and sizes:
        print("error: --data_file_mb and --video_file_mb have no effect with --to=lerobot_v2.1 (one file per episode) (see --help)",
              file=console)
        return EXIT_USAGE
    workers = args.direct_num_workers
    if any(not value > 0 for value in sizes) or (workers is not None and workers < 0) or \
            (args.fps is not None and not 0 < args.fps < float("inf")):
        print("error: --data_file_mb, --video_file_mb and --fps must be positive, --direct_num_workers at least 0 (see --help)",
              file=console)
        return EXIT_USAGE
    refusal = _runner_refusal(args)
    if refusal:
        print(f"error: {for_terminal(refusal)} (see --help)", file=console)
        return EXIT_USAGE
    args.direct_num_workers = 1 if workers is None else workers
    args.data_file_mb = args.data_file_mb or 100.0
    args.video_file_mb = args.video_file_mb or 200.0
    from pipelines.failures import RunnerLost, user_message
    from pipelines.session import EXIT_SIGNALS, Interrupted, interrupted_by

    started = time.monotonic()
    run_state = _Run()
    try:
        info, left_out = _export(args, run_state, out)
    except (KeyboardInterrupt, Interrupted) as interrupt:  # Ctrl-C or SIGTERM: the output as it was
        name = str(interrupt) if isinstance(interrupt, Interrupted) else "SIGINT"
        left = "" if run_state.publishing else ": the output was left as it was"
        print(f"error: {for_terminal(f'interrupted ({name}){left}{run_state.hint()}')}", file=console)
        return interrupt.exit_code if isinstance(interrupt, Interrupted) else EXIT_SIGNALS[signal.SIGINT]
    except Exception as error:  # noqa: BLE001 - ours (perhaps inside Beam's wrapping), or a fault of ours: one line
        interrupt = interrupted_by(error)  # Beam's in-process runner wraps the Interrupted a step raised; a worker the signal killed
        if interrupt is not None:
            print(f"error: {for_terminal(interrupt.message() + run_state.hint())}", file=console)
            return interrupt.exit_code
        if isinstance(error, RunnerLost):  # no file or sequence to name: the output is named
            message = f"{args.output}: {error}"
        elif isinstance(error, ConversionError):  # its "[while running ...]" dropped
            message = str(user_message(error) or error)
        else:
            message = user_message(error) or f"{args.output}: export failed: {type(error).__name__}: {(str(error).splitlines() or [''])[0]}"
        print(f"error: {for_terminal(message + run_state.hint())}", file=console)
        return EXIT_FAILED
    frames, episodes = info["total_frames"], info["total_episodes"]
    cameras = sum(1 for feature in info["features"].values() if feature.get("dtype") in ("video", "image"))
    resumed = f"; resumed: {run_state.reused} of {run_state.groups} groups reused from the interrupted export" if run_state.reused else ""
    print(f"exported {episodes} episode{'s' * (episodes != 1)}, {frames} frame{'s' * (frames != 1)}, {cameras} "
          f"camera{'s' * (cameras != 1)} as {args.to} in "
          f"{time.monotonic() - started:.1f} s -> {for_terminal(args.output)}{resumed}", file=out)
    for item in left_out:
        print(f"left out: {for_terminal(item)}", file=out)
    return EXIT_OK


def _beam_options_refusal(args, rest: list[str]) -> str | None:
    """Beam's own options, taken with DataflowRunner only (each one Beam knows, none that only
    launches a job); anything else left on the command line is unknown to this command."""
    from pipelines.beam_flags import BEAM_FLAGS
    from pipelines.preflight import DATAFLOW_REQUIRED, _option, is_local_path

    names, unknown, value_next = [], [], False
    for arg in rest:
        if value_next and not arg.startswith("-"):  # the value of `--name value`
            value_next = False
            continue
        name = arg.split("=", 1)[0]
        if arg.startswith("--") and name in BEAM_FLAGS:
            names.append(name)
            value_next = "=" not in arg
        else:
            unknown.append(arg)
    if unknown or (rest and args.runner != "DataflowRunner"):
        hint = " (Beam's options are taken with --runner=DataflowRunner only)" if names and not unknown else ""
        return f"unrecognized arguments: {' '.join(unknown or rest)}{hint}"
    if args.runner != "DataflowRunner":
        return None
    for name in names:
        if name in LAUNCH_ONLY or name.startswith("--direct_") or name == "--runner":
            return f"{name} has no effect with the export on DataflowRunner (it runs the export and publishes it)"
    for flag, value in (("--input", args.input), ("--output", args.output)):
        if is_local_path(str(value)):
            return f"{flag}={value} is on this machine's disk, which DataflowRunner workers cannot read; use a gs:// URL"
    missing = [f"--{name}" for name, spellings in DATAFLOW_REQUIRED if not any(_option(rest, spelling) for spelling in spellings)]
    return f"DataflowRunner needs {', '.join(missing)}" if missing else None


def _runner_refusal(args) -> str | None:
    """What the runner options cannot do, in words; None when they can."""
    import importlib.util

    if args.runner == "DataflowRunner" and args.direct_num_workers is not None:
        return "--direct_num_workers has no effect with --runner=DataflowRunner (Dataflow's workers write the groups)"
    if args.runner != "DaskRunner":
        given = [name for name in ("dask_client_address", "dask_scheduler_file") if getattr(args, name)]
        return f"--{given[0]} has no effect without --runner=DaskRunner" if given else None
    if args.dask_client_address and args.dask_scheduler_file:
        return "--dask_client_address and --dask_scheduler_file both name the scheduler: give one"
    from pipelines.cli import UsageError
    from pipelines.preflight import check_dask_values

    if args.dask_scheduler_file:
        args.dask_scheduler_file = os.path.expanduser(args.dask_scheduler_file)  # as the conversion's command line expands it
    try:  # the conversion's checks of the same options
        check_dask_values([f"--{name}={getattr(args, name)}" for name in ("dask_client_address", "dask_scheduler_file")
                           if getattr(args, name) is not None])
    except UsageError as error:
        return str(error)
    if args.direct_num_workers is not None:
        return "--direct_num_workers has no effect with --runner=DaskRunner (the cluster's workers write the groups)"
    if importlib.util.find_spec("dask") is None or importlib.util.find_spec("distributed") is None:
        return "--runner=DaskRunner needs dask.distributed, which is not installed: pip install 'mixtrain-convert[dask]'"
    for name in ("input", "output"):
        if str(getattr(args, name)).startswith("memory://"):
            return (f"--{name}={getattr(args, name)} is this process's memory, which DaskRunner workers cannot read; use a path on "
                    "storage the workers share, or an object store URL")
    return None


class _Run:
    """What the launcher knows of its staging folder, for the last line of a stopped export."""

    def __init__(self) -> None:
        self.kept: str | None = None  # the staging folder kept for a resumption (its URL)
        self.publishing = False  # an object store's files were being moved into the output
        self.reused = self.groups = 0

    def hint(self) -> str:
        if self.publishing:
            return ("; it stopped while moving its files into the output, which is partial now: run the same command again to "
                    "finish it")
        return (f"; the groups it wrote are kept in {self.kept}: run the same command again to resume, or add --fresh to start "
                "afresh") if self.kept else ""


def _export(args, run_state: _Run, out: TextIO) -> tuple[dict, list[str]]:
    """Plan, write into the staging folder (a new one, or an interrupted export's: resumed),
    publish; info.json and what was left out."""
    from formats.exports import journal, lerobot
    from formats.mixtrain import publish, resume
    from formats.read.reader import open_dataset

    dataset = open_dataset(args.input)
    out_fs, out_root = storage.open_root(args.output)
    identity = journal.identity(dataset, args.to, {"data_file_mb": args.data_file_mb, "video_file_mb": args.video_file_mb,
                                                   "fps": args.fps})
    _restore_replaced_output(out_fs, out_root)
    published = _published_by_interrupted_export(out_fs, out_root, identity, out)
    if published is not None:
        return published, list((published.get("mixtrain_export") or {}).get("left_out") or [])
    _check_output(dataset, out_fs, out_root, args, identity)
    plan = lerobot.plan_export(dataset, data_file_mb=args.data_file_mb, video_file_mb=args.video_file_mb, fps=args.fps)
    writer = lerobot.Writer(plan, dataset.stats() if len(dataset) else {}, args.to)
    staging, recorded = _take_staging(out_fs, out_root, identity, plan.groups, args, out)
    run_state.groups, run_state.reused = plan.groups, len(recorded)
    lease = resume.Lease(out_fs, staging).__enter__()
    interrupt_handler = signal.getsignal(signal.SIGINT)
    try:
        if not recorded:
            journal.write_header(out_fs, staging, output=out_root, export_identity=identity, groups=plan.groups)
        with _quiet_beam():
            info = _run_pipeline(args, dataset, writer, storage.url_for(out_fs, staging), plan.groups, identity, recorded)
        _publish(out_fs, staging, out_root, run_state)
    except BaseException:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the clean-up short
        lease.__exit__(None, None, None)
        if run_state.publishing or _holds_groups(out_fs, staging):
            run_state.kept = storage.shown(out_fs, staging)  # stays, hidden from readers, for the same command to resume
        else:
            with contextlib.suppress(OSError):
                out_fs.rm(staging, recursive=True)
        raise
    finally:
        lease.__exit__(None, None, None)
        publish.release_staging(staging)
        if interrupt_handler is not None:
            signal.signal(signal.SIGINT, interrupt_handler)
    return info, plan.left_out


def _restore_replaced_output(fs, out_root: str) -> None:
    """A local publication killed between its two renames left the replaced output aside
    (`.NAME.mixtrain-export-*.old`) and no output: it is put back, so that the output is as it was
    before that export; one left beside a published output is removed."""
    if not storage.is_local(fs):
        return
    for folder in _export_stagings(fs, out_root, aside=True):
        if not os.path.lexists(out_root):
            os.rename(folder, out_root)
        else:
            shutil.rmtree(folder, ignore_errors=True)


def _published_by_interrupted_export(fs, out_root: str, identity: str, out: TextIO) -> dict | None:
    """An export of the same identity killed on an object store after it had moved every file into
    the output (meta/info.json last) but before it removed its staging folder: the output is
    complete. Its folder is removed and the output's info.json returned; None otherwise."""
    from formats.exports import journal

    if storage.is_local(fs):
        return None
    info_path = storage.join(out_root, "meta/info.json")
    for folder in _export_stagings(fs, out_root):
        header = journal.read_header(fs, folder)
        if header is None or header.get("identity") != identity or not fs.exists(storage.join(folder, journal.PUBLISHING)):
            continue
        prefix = folder.rstrip("/") + f"/{journal.JOURNAL_DIR}/"
        if any(not path.startswith(prefix) for path in fs.find(folder)) or not fs.exists(info_path):
            continue
        print(f"[mixtrain-export] the interrupted export in {for_terminal(storage.shown(fs, folder))} had published the output "
              "whole; its folder is removed", file=out)
        with contextlib.suppress(OSError, FileNotFoundError):
            fs.rm(folder, recursive=True)
        return json.loads(fs.cat_file(info_path))
    return None


def _holds_groups(fs, staging: str) -> bool:
    from formats.exports import journal

    return storage.holds_entries(fs, storage.join(staging, journal.GROUPS_DIR))


def _export_stagings(fs, out_root: str, *, aside: bool = False) -> list[str]:
    """The staging folders exports of this output made (its hidden siblings `.NAME.mixtrain-export-*`);
    with `aside`, the replaced outputs a local publication renamed aside (`*.old`) instead."""
    parent, _, name = out_root.rstrip("/").rpartition("/")
    mark = f".{name}{STAGING_MARK}"
    if storage.is_local(fs):
        if not os.path.isdir(parent):
            return []
        return sorted(f"{parent}/{entry}" for entry in os.listdir(parent)
                      if entry.startswith(mark) and entry.endswith(".old") == aside and os.path.isdir(f"{parent}/{entry}")
                      and not os.path.islink(f"{parent}/{entry}"))
    if aside:
        return []
    fs.invalidate_cache(parent)
    if not parent or not fs.exists(parent):
        return []
    return sorted(entry["name"].rstrip("/") for entry in fs.ls(parent, detail=True)
                  if entry["name"].rstrip("/").rsplit("/", 1)[-1].startswith(mark) and entry.get("type") == "directory")


def _take_staging(fs, out_root: str, identity: str, groups: int, args, out: TextIO) -> tuple[str, frozenset[int]]:
    """The staging folder this export writes in, claimed (a live owner's lock on a local disk, a
    lease on an object store), and the groups it already holds: an interrupted export's folder for
    the same output, input and options is resumed; any other one no live export owns is removed
    (said on `out`); one a live export owns is a refusal."""
    from formats.exports import journal
    from formats.mixtrain import publish, resume

    chosen = None
    for folder in _export_stagings(fs, out_root):
        where = for_terminal(storage.shown(fs, folder))
        if publish.has_live_owner(fs, folder):
            raise ConversionError(f"{args.output}: another export is writing this output (its staging folder {where}); wait for it "
                                  "to finish")
        age = publish.renewal_age(fs, storage.join(folder, resume.LEASE), resume.LEASE_STALE)
        if age is not None:  # an object store: a live launcher renews its lease; a killed one's lapses
            raise ConversionError(f"{args.output}: another export is writing this output (its staging folder {where} holds a lease "
                                  f"renewed {age:.0f} s ago); wait for it to finish, or, if it was stopped, run again in "
                                  f"{resume.LEASE_STALE - age:.0f} s, when its lease has lapsed, to resume it")
        header = journal.read_header(fs, folder)
        if header is None and _young(fs, folder):
            continue  # no journal yet, or a publication between its steps: another export's, perhaps; left alone
        same = (header is not None and header.get("identity") == identity
                and header.get("output") == resume.output_identity(fs, out_root) and header.get("groups") == groups)
        foreign = same and _foreign_entries(fs, folder)
        if chosen is None and same and not args.fresh and not foreign:
            chosen = folder
            continue
        if header is not None:
            why = ("--fresh" if args.fresh else f"it holds {foreign}, which an export does not write" if foreign
                   else "another interrupted export of the same command" if same
                   else "it was exporting another input, or with other options")
            print(f"[mixtrain-export] discarding an interrupted export's folder {where} ({why})", file=out)
        with contextlib.suppress(OSError, FileNotFoundError):
            fs.rm(folder, recursive=True)
    if chosen is None:
        chosen = _staging(out_root)
        fs.makedirs(chosen, exist_ok=True)
        publish.claim_staging(fs, chosen)
        return chosen, frozenset()
    publish.claim_staging(fs, chosen)
    recorded = journal.recorded_groups(fs, chosen, identity, groups)
    print(f"[mixtrain-export] resuming the interrupted export in {for_terminal(storage.shown(fs, chosen))}: {len(recorded)} of "
          f"{groups} groups reused, {groups - len(recorded)} left to write", file=out)
    return chosen, frozenset(recorded)


YOUNG_SECONDS = 60.0  # a staging folder without a journal is taken for abandoned only once this old


def _young(fs, folder: str) -> bool:
    """Whether a folder was changed within YOUNG_SECONDS (local disks; object stores keep no folder time)."""
    if not storage.is_local(fs):
        return False
    try:
        return time.time() - os.stat(folder).st_mtime < YOUNG_SECONDS
    except OSError:
        return False


def _foreign_entries(fs, folder: str) -> str | None:
    """What in a local staging folder an export never writes and a resumption must not follow: a
    symbolic link, a device or pipe, a file of another user. None when there is nothing of that."""
    if not storage.is_local(fs):
        return None
    for top, folders, files in os.walk(folder):
        for name in [*folders, *files]:
            stat = os.lstat(os.path.join(top, name))
            if os.path.islink(os.path.join(top, name)):
                return "a symbolic link"
            if not (os.path.isdir(os.path.join(top, name)) or os.path.isfile(os.path.join(top, name))):
                return "a file that is not a regular file"
            if stat.st_uid != os.geteuid():
                return "a file of another user"
    return None


def _check_output(dataset, out_fs, out_root: str, args, identity: str) -> None:
    source = os.path.realpath(dataset.root) if storage.is_local(dataset.fs) else dataset.root
    target = os.path.realpath(out_root) if storage.is_local(out_fs) else out_root
    if target == source or target.startswith(source.rstrip("/") + "/") or source.startswith(target.rstrip("/") + "/"):
        raise ConversionError(f"{args.output}: the output must not be the input, inside it, or hold it")
    if out_fs.exists(out_root) and (not out_fs.isdir(out_root) or out_fs.ls(out_root)) and not args.overwrite \
            and not _half_published(out_fs, out_root, identity):
        raise ConversionError(f"{args.output}: exists and is not empty; pass --overwrite to replace it")


def _half_published(fs, out_root: str, identity: str) -> bool:
    """Whether the output's files are those of this same export, killed while it moved them into
    place (an object store): the same command then finishes the job."""
    from formats.exports import journal

    for folder in _export_stagings(fs, out_root):
        header = journal.read_header(fs, folder)
        if header is not None and header.get("identity") == identity and fs.exists(storage.join(folder, journal.PUBLISHING)):
            return True
    return False


def _staging(out_root: str) -> str:
    parent, _, name = out_root.rstrip("/").rpartition("/")
    if not parent or not name:
        raise ConversionError(f"{out_root}: the output must be a folder inside another (a bucket's or a disk's root cannot be staged "
                              "beside)")
    return f"{parent}/.{name}{STAGING_MARK}{uuid.uuid4().hex[:12]}"


def _publish(out_fs, staging: str, out_root: str, run_state: _Run) -> None:
    """The staging folder becomes the output. Locally one rename (the old output, if replaced,
    renamed aside first and removed after; the journal and the claim removed just before); on an
    object store the files are moved, meta/info.json last, so a reader that finds info.json finds
    everything it lists, and the journal removed after (a kill while moving: the next run resumes)."""
    from formats.exports import journal
    from formats.mixtrain import publish

    if storage.is_local(out_fs):
        shutil.rmtree(f"{staging}/{journal.JOURNAL_DIR}", ignore_errors=True)
        for name in (publish.LOCK_FILE, publish.OWNER_FILE):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{staging}/{name}")
        aside = None
        if os.path.lexists(out_root):
            aside = f"{staging}.old"
            os.rename(out_root, aside)
        try:
            os.rename(staging, out_root)
        except BaseException:  # a failure or a Ctrl-C between the two renames: the old output back where it was
            if aside and not os.path.lexists(out_root):
                os.rename(aside, out_root)
            raise
        if aside:
            shutil.rmtree(aside, ignore_errors=True)
        return
    # Marked first: a run killed while moving leaves an output that is part of this one, which the
    # same command run again replaces (the groups whose files were moved are written again).
    out_fs.pipe_file(storage.join(staging, journal.PUBLISHING), b"")
    run_state.publishing = True
    if out_fs.exists(out_root):
        out_fs.rm(out_root, recursive=True)
    journal_files = staging.rstrip("/") + f"/{journal.JOURNAL_DIR}/"
    files = sorted((path for path in out_fs.find(staging) if not path.startswith(journal_files)),
                   key=lambda path: path.endswith("meta/info.json"))
    for path in files:
        out_fs.mv(path, out_root + path[len(staging):])
        publish.stop_point("export", "file-moved")
    run_state.publishing = False  # every file is in place: the output is whole
    publish.stop_point("export", "files-moved")
    with contextlib.suppress(OSError, FileNotFoundError):
        out_fs.rm(staging, recursive=True)


@contextlib.contextmanager
def _quiet_beam():
    """Beam's and its workers' log lines go to a log file, not to the terminal."""
    from pipelines.session import Session, new_run_id

    session = Session(new_run_id(), None, False)
    session.__enter__()
    try:
        yield
    finally:
        session.close()


def _run_pipeline(args, dataset, writer, staging_url: str, groups: int, identity: str, recorded: frozenset[int]) -> dict:
    """Run the export's Beam steps into `staging_url`; meta/info.json as write_meta wrote it."""
    out_fs, out_root = storage.open_root(staging_url)
    if not groups:  # no episode: only meta/
        return writer.write_meta([], out_fs, out_root)
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from formats.exports import journal
    from transforms import staged_plan
    from transforms.export import export

    if args.runner == "DaskRunner":
        from pipelines.dask_runner import DaskRunner

        runner = DaskRunner()
        options = PipelineOptions([f"--dask_client_address={args.dask_client_address}"] if args.dask_client_address else
                                  [f"--dask_scheduler_file={args.dask_scheduler_file}"] if args.dask_scheduler_file
                                  else [])
    elif args.runner == "DataflowRunner":
        runner = "DataflowRunner"
        options = PipelineOptions(["--runner=DataflowRunner", *args.beam_options])
    else:  # Beam's FnApiRunner itself: Beam's DirectRunner would first try Prism, which downloads a binary (pipelines/conversion.py)
        from pipelines import local_workers

        runner = local_workers.runner(None)  # its worker processes watched: one that dies fails the run, in one line
        workers = args.direct_num_workers
        options = PipelineOptions([f"--direct_num_workers={workers}",
                                   f"--direct_running_mode={'in_memory' if workers == 1 else 'multi_processing'}"])
    pipeline = beam.Pipeline(runner=runner, options=options)
    pending = [episode.sequence_id for episode in writer.plan.episodes if episode.group not in recorded]
    plan_folder = staged_plan.PlanFolder.create(storage.join(staging_url, journal.PLAN_DIR))  # removed with the journal
    export(pipeline, storage.url_for(dataset.fs, dataset.root), dataset.shards_holding(pending) if pending else [], writer, staging_url,
           plan_folder, identity=identity, groups=groups, recorded=recorded)
    result = pipeline.run()
    try:
        result.wait_until_finish()
    except BaseException:
        if args.runner != "DirectRunner":  # the cluster's or Dataflow's remaining tasks stop too
            with contextlib.suppress(Exception):
                result.cancel()
        raise
    path = storage.join(out_root, "meta/info.json")
    if not out_fs.exists(path):
        raise ConversionError(f"{args.output}: the export wrote no meta/info.json")
    return json.loads(out_fs.cat_file(path))


def main() -> None:
    """The process entry: leaves without interpreter teardown, as `convert` does (a one-worker
    export reads its shards in this process; see `exit_without_teardown`)."""
    exit_without_teardown(run(sys.argv[1:]))


if __name__ == "__main__":
    main()
