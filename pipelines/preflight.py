"""What the command line alone decides, answered before Beam, pyarrow or fsspec is imported.

A new user's first mistakes (a missing input, an existing output, a laptop path handed to Dataflow,
a Dataflow run without its project) must be refused in a fraction of a second, not after the two
to fifteen seconds that importing Beam and building a pipeline take. These checks use `os` and the
command line only, so they cover local paths; URLs are checked by the conversion itself (the
same rules, `pipelines.conversion`), which imports the storage libraries.
"""

from __future__ import annotations

import difflib
import os

from pipelines import cli
from pipelines.beam_flags import BEAM_FLAGS, DASK_FLAGS
from pipelines.cli import UsageError

__all__ = ["LOCAL_RUNNERS", "KNOWN_RUNNERS", "RUNNERS", "DASK", "uses_dask", "PATH_OPTIONS", "as_meant", "runner_of", "check", "Refusal",
           "is_local_path", "inside", "output_holds_dataset", "already_published"]

# Runner names that mean "run here": served by Beam's FnApiRunner directly (pipelines.conversion).
# The DirectRunner's variants (switching, test) are the same here: this process, FnApiRunner.
LOCAL_RUNNERS = {None, "DirectRunner", "FnApiRunner", "BundleBasedDirectRunner", "SwitchingDirectRunner", "TestDirectRunner"}
# Runners that run on this machine but that this converter does not serve (PrismRunner downloads
# its binary at start, offline it fails or hangs, and ignores --direct_num_workers; the others need
# a notebook or a Kafka cluster): refused with what to use instead.
UNSERVED_LOCAL = {"PrismRunner": "it downloads its runner binary at start and ignores --direct_num_workers",
                  "InteractiveRunner": "it is for notebooks", "KafkaStreamsRunner": "it runs on a Kafka cluster"}
# Beam's runner names (StandardOptions.ALL_KNOWN_RUNNERS; a test checks the list), which Beam
# matches without case and with "Runner" optional: `--runner=direct` is the DirectRunner.
KNOWN_RUNNERS = ("DataflowRunner", "BundleBasedDirectRunner", "DirectRunner", "SwitchingDirectRunner", "InteractiveRunner",
                 "FlinkRunner", "FnApiRunner", "KafkaStreamsRunner", "PortableRunner", "PrismRunner", "SparkRunner",
                 "TestDirectRunner", "TestDataflowRunner")
# Runners that Beam ships outside that list: the DaskRunner (apache_beam.runners.dask), which this
# converter runs through its own corrected translation (pipelines/dask_runner.py).
DASK = "DaskRunner"
RUNNERS = (*KNOWN_RUNNERS, DASK)
# Options whose value is a path of this machine's or a URL: `~` is expanded in them as a shell
# would have, had the user not written `--name=~/...` (bash expands `~` only at a word's start).
PATH_OPTIONS = ("input", "output", "log_file", "dask_scheduler_file")
# What Dataflow needs to start a job; without them Beam creates a default bucket over the network.
DATAFLOW_REQUIRED = (("project", ("project",)), ("region", ("region",)),
                     ("temp_location", ("temp_location", "staging_location")))


# A LeRobot user names datasets by their Hub id (`lerobot/svla_so100_pickplace`).
HUB_HINT = ("; a Hugging Face Hub dataset id? pass --input=hf://datasets/{repo} (pip install 'mixtrain-convert[hub]'), "
            "or download it first: huggingface-cli download {repo} --repo-type=dataset --local-dir DIR")


def looks_like_hub_id(value: str) -> bool:
    """`owner/name` as the Hub spells a repository: one slash, no path syntax around it."""
    owner, slash, name = value.partition("/")
    allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")
    return bool(slash and owner and name and not owner.startswith(".") and set(owner) <= allowed and set(name) <= allowed)


class Refusal(Exception):
    """The input or output as they stand cannot be converted (exit 1, not a command-line error)."""


def is_local_path(value: str) -> bool:
    return "://" not in value or value.startswith("file://")


def _local(value: str) -> str:
    return os.path.abspath(value[len("file://"):] if value.startswith("file://") else value)


def as_meant(argv: list[str]) -> list[str]:
    """`argv` as the user meant it: `~` and `~user` expanded at the start of every path option's
    value (as the shell does for a word, but not after `--name=`), and `--runner` spelt as Beam's
    runner it names (`Direct`, `dataflow`: what Beam itself accepts), so that every later check
    sees the runner that will run."""
    meant = []
    for position, arg in enumerate(argv):
        name, equals, value = arg.partition("=")
        if equals and name.startswith("--") and name[2:] in PATH_OPTIONS and value.startswith("~"):
            arg = f"{name}={os.path.expanduser(value)}"
        elif equals and name == "--runner":
            arg = f"--runner={_runner_name(value)}"
        elif position and argv[position - 1] == "--runner":
            arg = _runner_name(arg)
        meant.append(arg)
    return meant


def _runner_name(value: str) -> str:
    names = {name.lower(): name for name in RUNNERS}
    if "." in value:  # a runner class given by its module path: Beam's own by its name
        module, _, name = value.rpartition(".")
        return name if module.startswith("apache_beam.runners.") and name in RUNNERS else value
    known = names.get(value.lower()) or names.get(value.lower() + "runner")
    if known is None:
        match = difflib.get_close_matches(value, RUNNERS, n=1, cutoff=0.5)
        raise UsageError(f"unknown runner {value!r} (Beam's runners: {', '.join(RUNNERS)})",
                         hint=f"did you mean --runner={match[0]}?" if match else None)
    return known


def _option(argv: list[str], name: str) -> str | None:
    """The value of `--name=value` or `--name value` in `argv` (the last one), None if absent."""
    value = None
    for position, arg in enumerate(argv):
        if arg.startswith(f"--{name}="):
            value = arg.split("=", 1)[1]
        elif arg == f"--{name}" and position + 1 < len(argv):
            value = argv[position + 1]
    return value


def runner_of(argv: list[str]) -> str | None:
    return _option(argv, "runner")


def uses_dask(argv: list[str]) -> bool:
    """Whether the command line names the DaskRunner or one of its options (`argv` as_meant)."""
    return runner_of(argv) == DASK or any(arg.split("=", 1)[0] in DASK_FLAGS for arg in argv)


def inside(path: str, folder: str) -> bool:
    """Whether local `path` is `folder` or lies under it (symlinks resolved)."""
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def output_holds_dataset(root: str) -> str | None:
    """What kind of published dataset the local folder `root` holds ("Mixtrain", "Lance"), None for none."""
    if os.path.isfile(os.path.join(root, "mixtrain.json")):
        return "Mixtrain"
    versions = os.path.join(root, "_versions")  # as formats.mixtrain.tables.lance.is_dataset, without its imports
    if os.path.isdir(versions) and any(name.endswith(".manifest") for name in os.listdir(versions)):
        return "Lance"
    return None


def foreign_output(fs, root: str) -> str | None:
    """Why the existing output folder `root` is not one to publish into: it holds files and no
    Mixtrain dataset (our own staging aside); None when it is empty or a dataset."""
    from formats.mixtrain import SIDECAR, publish

    names = {entry.rstrip("/").rsplit("/", 1)[-1] for entry in fs.ls(root, detail=False)}
    foreign = publish.foreign_entries(fs, root)
    ours = names - set(foreign) - {publish.STAGING_DIR}
    if not ours and not foreign:
        return None
    if SIDECAR not in ours and not (ours and not foreign):
        return f"{root}: output is not empty and is not a Mixtrain dataset ({', '.join(sorted(names))}); choose another --output"
    return None


def already_published(root: str, kind: str) -> str:
    """The one message for an output that holds a dataset and no --overwrite/--incremental."""
    verb = "replace it" if kind == "Mixtrain" else "publish a new version of it"
    return (f"{root}: output already holds a {kind} dataset; pass --overwrite to {verb}, "
            "or --incremental to convert only what changed")


# Options of Google Cloud Dataflow that a local run would silently ignore (a local --dry_run=True
# performed and published the whole conversion).
DATAFLOW_ONLY = ("dry_run", "project", "region", "zone", "worker_zone", "machine_type", "worker_machine_type", "num_workers",
                 "max_num_workers", "autoscaling_algorithm", "disk_size_gb", "network", "subnetwork", "service_account_email",
                 "staging_location", "template_location", "dataflow_service_options")
WORKERS_PER_CPU = 8  # local workers beyond this many per CPU only queue for the CPUs, each a process of 150-250 MB


def _check_local_workers(text: str | None) -> None:
    """--direct_num_workers: 0 (one per CPU, Beam's meaning) up to WORKERS_PER_CPU per CPU."""
    if text is None:
        return
    try:
        workers = int(text)
    except ValueError:
        raise UsageError(f"--direct_num_workers={text}: expected a whole number") from None
    limit = WORKERS_PER_CPU * (os.cpu_count() or 1)
    if workers < 0:
        raise UsageError(f"--direct_num_workers={text}: expected 0 (one worker per CPU) or more")
    if workers > limit:
        raise UsageError(f"--direct_num_workers={text}: this machine has {os.cpu_count() or 1} CPU(s); at most {limit} local "
                         f"workers ({WORKERS_PER_CPU} per CPU), each a process of its own")


def check_dask_values(argv: list[str]) -> None:
    """Beam's DaskOptions take what they are given (a timeout of "soon" became dask's default, a
    partition count of -5 was passed on): each value is checked here, as ours are."""
    for name in ("dask_npartitions", "dask_partition_size", "dask_connection_limit", "dask_connection_timeout"):
        text = _option(argv, name)
        if text is not None and not (text.isascii() and text.isdigit() and int(text) >= 1):
            raise UsageError(f"--{name}={text}: expected a whole number of at least 1" + (" (seconds)" if name.endswith("timeout") else ""))
    scheduler_file = _option(argv, "dask_scheduler_file")  # `~` expanded by as_meant, as Beam then passes it on
    if scheduler_file is not None and not os.path.isfile(scheduler_file):
        raise UsageError(f"--dask_scheduler_file={scheduler_file}: no such file (the one `dask scheduler --scheduler-file` writes)")
    address = _option(argv, "dask_client_address")
    if address is not None and (not address.strip() or any(char.isspace() for char in address)):
        raise UsageError(f"--dask_client_address={address!r}: expected a scheduler address, HOST:PORT or tcp://HOST:PORT")


def check(args, argv: list[str], rest: list[str]) -> None:
    """Every check of the command line (`argv` as_meant; `rest`: what our parser left for Beam)
    against Beam's option names and this machine's disk; raises UsageError (exit 2) for a command
    line that cannot work, Refusal (exit 1) for an input or output that cannot."""
    unknown = [arg for arg in rest if arg.startswith("-") and arg.split("=", 1)[0] not in BEAM_FLAGS | DASK_FLAGS]
    if unknown:
        ours = [option for action in cli.build_parser()._actions for option in action.option_strings]
        cli.check_unknown(unknown, ours + sorted(BEAM_FLAGS | DASK_FLAGS))
    runner = runner_of(argv)
    dask_flags = sorted({arg.split("=", 1)[0] for arg in rest if arg.split("=", 1)[0] in DASK_FLAGS})
    if dask_flags and runner != DASK:
        raise UsageError(f"{dask_flags[0]} has no effect without --runner=DaskRunner")
    if runner == DASK:  # workers in other processes or on other machines: a POSIX path must be on storage they share
        check_dask_values(argv)
        for flag, value in (("--input", args.input), ("--output", args.output)):
            if value.startswith("memory://"):
                raise UsageError(f"{flag}={value} is this process's memory, which DaskRunner workers cannot read; use a path on "
                                 "storage the workers share, or an object store URL")
    if args.detach and runner in LOCAL_RUNNERS:
        raise UsageError("--detach has no effect on a local runner (the run is this process); it is for --runner=DataflowRunner")
    if runner == DASK:
        for name in ("dry_run", "template_location"):
            if _option(argv, name):
                raise UsageError(f"--{name} has no effect with --runner=DaskRunner (it runs the conversion); it is for "
                                 "--runner=DataflowRunner")
        if args.detach:
            raise UsageError("--detach cannot work with --runner=DaskRunner: the run's tasks belong to this process's Dask "
                             "client, and its exit cancels them; run the launcher where it can wait (a batch job, tmux)")
    if args.incremental and args.video_stats:
        raise UsageError("--video_stats cannot be combined with --incremental (image statistics of reused sequences are not "
                         "kept); run without --incremental to refresh them")
    _check_encoding(args)
    if args.limit and args.incremental:
        raise UsageError("--limit cannot be combined with --incremental: the published dataset would lose every unit past "
                         "the first N; try the conversion into another --output")
    if args.overwrite and args.incremental:
        raise UsageError("--overwrite and --incremental cannot be combined: --incremental replaces the dataset too, reusing its "
                         "unchanged sequences; --overwrite converts every sequence again")
    if runner in LOCAL_RUNNERS:
        for name in DATAFLOW_ONLY:
            if _option(argv, name) is not None or f"--{name}" in argv:
                raise UsageError(f"--{name} has no effect on the local runner (it runs the conversion here); it is for "
                                 "--runner=DataflowRunner")
        _check_local_workers(_option(argv, "direct_num_workers"))
    if runner in UNSERVED_LOCAL:
        raise UsageError(f"--runner={runner} is not one this converter runs on ({UNSERVED_LOCAL[runner]}); use --runner=DirectRunner "
                         "here (Beam's FnApiRunner, --direct_num_workers for parallelism) or DataflowRunner")
    if runner not in LOCAL_RUNNERS and runner != DASK:  # a Dask cluster's workers may share a file system (docs/dask.md)
        for flag, value in (("--input", args.input), ("--output", args.output)):
            if is_local_path(value):
                raise UsageError(f"{flag}={value} is on this machine's disk, which {runner} workers cannot read; use a gs:// "
                                 "(or other shared storage) URL")
        if runner == "DataflowRunner":
            missing = [f"--{name}" for name, spellings in DATAFLOW_REQUIRED if not any(_option(argv, s) for s in spellings)]
            if missing:
                raise UsageError(f"DataflowRunner needs {', '.join(missing)}",
                                 hint="python -m pipelines.convert --input=gs://... --output=gs://... --runner=DataflowRunner "
                                      "--project=PROJECT --region=REGION --temp_location=gs://BUCKET/tmp (docs/dataflow.md)")
    _check_stores(args)
    if not (is_local_path(args.input) and is_local_path(args.output)):
        return
    source, target = _local(args.input), _local(args.output)
    if not os.path.exists(source):
        raise Refusal(f"{source}: input not found" + (HUB_HINT.format(repo=args.input) if looks_like_hub_id(args.input) else ""))
    if inside(source, target):
        raise UsageError(f"--input={args.input} is inside --output={args.output}: publishing the output would replace "
                         "the input; choose an output folder outside the dataset")
    if inside(target, source):
        raise UsageError(f"--output={args.output} is inside --input={args.input}: the dataset would be written into the "
                         "source dataset; choose an output folder outside it")
    if os.path.exists(target) and not os.path.isdir(target):
        raise Refusal(f"{target}: output exists and is not a directory")
    kind = output_holds_dataset(target)
    if kind is None and args.table_format in ("parquet", "lance") and os.path.isdir(target) and os.listdir(target):
        from formats import storage

        problem = foreign_output(storage.open_root(target)[0], target)
        if problem is not None:
            raise Refusal(problem)
    if kind is not None and not (args.overwrite or args.incremental) and args.table_format in ("parquet", "lance"):
        if (kind == "Lance") == (args.table_format == "lance"):
            raise Refusal(already_published(target, kind))


def _check_encoding(args) -> None:
    """The --video_* options as one encoder setting (a crf outside the codec's range, a pixel
    format it lacks), before any import of Beam."""
    if not any(getattr(args, name) is not None for name in cli.ENCODING_OPTIONS):
        return
    from formats.errors import ConversionError
    from pipelines.plan import requested_encoding

    try:
        requested_encoding(args)
    except ConversionError as error:
        raise UsageError(str(error)) from None


def _check_stores(args) -> None:
    """What the URLs alone refuse: a protocol whose package is missing or unknown, the embedded
    Iceberg catalog on an object store, an input and output one inside the other on one store.
    Local paths are left to the checks below (no import of fsspec and pyarrow before the planner
    is forked)."""
    if is_local_path(args.input) and is_local_path(args.output):
        return
    from formats import storage

    roots = {}
    for flag, url in (("--input", args.input), ("--output", args.output)):
        try:
            roots[flag] = storage.parse_url(url)  # not opened: the stores are reached later, with a deadline
        except ImportError as error:  # storage.MissingPackageError (also a ValueError): its message starts with the URL
            raise UsageError(f"{flag}={error}") from None
        except ValueError as error:  # an unknown protocol
            raise UsageError(f"{flag}={url}: {error}") from None
    (in_fs, in_root), (out_fs, out_root) = roots["--input"], roots["--output"]
    if args.table_format == "iceberg" and not args.catalog and not storage.is_local(out_fs):
        raise UsageError(f"--output={args.output}: the embedded Iceberg catalog is an SQLite file on the output's disk, which "
                         "an object store is not; pass --catalog (a REST, SQL or Glue catalog the workers reach, docs/lake.md)")
    if in_fs is out_fs and not storage.is_local(in_fs):  # local paths: below
        for (inner, inner_flag), (outer, outer_flag) in (((in_root, "--input"), (out_root, "--output")),
                                                         ((out_root, "--output"), (in_root, "--input"))):
            if inner == outer or inner.startswith(outer.rstrip("/") + "/"):
                raise UsageError(f"{inner_flag} is inside {outer_flag} ({args.input} and {args.output}): choose an output "
                                 "folder outside the input dataset")

