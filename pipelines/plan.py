"""The conversion plan: the command line's options in, one frozen ConversionPlan out.

Everything the launcher decides before any worker runs is decided here, without Beam (tests call
`make_plan` directly): the source and its refs, the metadata exactly as mixtrain.json will carry
it (video columns as they will be written, dataset assets at their output paths), the copy or
encode decision per camera, the shard count, and what an --incremental run reuses.
`pipelines.conversion.build_pipeline` only wires transforms from the plan.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import gc
import math
from typing import Any

import pyarrow as pa

import formats
from formats import errors, mixtrain, sources, storage
from formats.mixtrain import array_layout, fingerprint, quality, schema, tables
from formats.sequence import SCALAR, TRAJECTORY, VIDEO, DatasetMeta
from formats.sources import Source, SourceRef
from formats.video import policy
from pipelines import cli
from pipelines.cli import UsageError

__all__ = ["ConversionPlan", "make_plan", "created_now", "without_cycle_collection", "estimate_num_shards", "requested_encoding", "source_options"]


@dataclasses.dataclass(frozen=True)
class ConversionPlan:
    """What the launcher decided. `meta` is the metadata as written; nothing mutates it later."""

    source: Source
    source_url: str
    meta: DatasetMeta
    refs: tuple[SourceRef, ...]
    to_convert: tuple[SourceRef, ...]  # all refs, or under --incremental the changed units' refs
    encode: dict  # video column -> EncodeOptions, or None for a packet copy
    sizes: dict  # video column -> the source's declared (width, height)
    copied: frozenset  # video columns planned as packet copies
    num_shards: int
    assets: tuple[str, ...]  # dataset-level files (relative to the source root) copied to files/_dataset/
    sidecar_extra: dict  # converter, options, created_at, incremental: mixtrain.json beside the metadata
    fingerprints: fingerprint.Fingerprints  # written for the next --incremental (computed as written, unless --incremental)
    reused: dict | None  # what --incremental keeps from the previous output (tables.reusable), or None


def source_options(source: Source, options: Any) -> dict:
    """What the source's `plan` reads of the command line: its own declared options only."""
    missing = [option.flag for option in source.options if not hasattr(options, option.flag)]
    if missing:  # a plugin's option: the command line is parsed before any source is imported, so it cannot list it
        raise errors.ConversionError(f"the {source.id} source declares --{', --'.join(missing)}, which this command line does "
                                     "not have (pipelines/cli.py lists every option)")
    return source.plan_options({option.flag: getattr(options, option.flag) for option in source.options})


def requested_encoding(options: Any) -> policy.EncodeOptions:
    """The --video_* flags as checked EncodeOptions (raises ConversionError on a bad combination)."""
    if options.video_codec == "ffv1":
        for name in ("video_crf", "video_preset", "video_pix_fmt", "video_min_psnr"):
            if getattr(options, name) is not None:
                raise errors.ConversionError(f"--{name} has no effect with --video_codec=ffv1 (lossless: each camera is kept in its own "
                                             "pixel format, every value)")
    return policy.EncodeOptions(options.video_codec or "h264", options.video_crf, options.video_gop,
                               options.video_preset, options.video_pix_fmt or "yuv420p", options.video_min_psnr).resolved()


def check_effective(options: Any, source: Source, meta: DatasetMeta, encode: dict) -> None:
    """Refuse an option that would change nothing for this source and mode: the user meant something."""
    own = {option.flag for option in source.options}
    for name, owner in cli.SOURCE_OPTIONS.items():
        if cli.typed(options, name) and name not in own:
            raise UsageError(f"--{name} is an option of --source={owner}; it has no effect on this {source.id} dataset")
    _check_quality_thresholds(options, source, meta)
    cameras = [spec.name for spec in meta.columns if spec.kind == VIDEO]
    if not cameras:
        for name in ("video", "video_stats", "verify_copies", *cli.ENCODING_OPTIONS):
            if cli.typed(options, name):
                raise UsageError(f"--{name} has no effect: this {source.id} dataset has no cameras")
        return
    if cli.typed(options, "verify_copies") and all(encode.values()):
        raise UsageError(f"--verify_copies has no effect: every camera of this dataset ({', '.join(cameras)}) is encoded, none copied")
    if not any(encode.values()):
        for name in cli.ENCODING_OPTIONS:
            if cli.typed(options, name):
                raise UsageError(f"--{name} has no effect: --video={options.video} copies every camera of this dataset "
                                 f"({', '.join(cameras)}) without encoding", hint="pass --video=reencode to encode them")


# Sources whose reader records where the source clock started (Sequence.source_facts["clock_start"]).
CLOCK_START_SOURCES = ("lerobot_v3", "lerobot_v2")


def _check_quality_thresholds(options: Any, source: Source, meta: DatasetMeta) -> None:
    """A --quality_* threshold that no check of this dataset reads is refused, as any ineffective option."""
    names = {spec.name for spec in meta.columns}
    trajectories = [spec.name for spec in meta.columns if spec.kind == TRAJECTORY]
    unused = {
        "first_time": (source.id not in CLOCK_START_SOURCES, f"only LeRobot sources record where an episode's clock started; this "
                                                             f"{source.id} dataset's timestamps are rebased by its own rule"),
        "idle_steps": (not any(quality.is_action(name) for name in trajectories), "this dataset has no action trajectory"),
        "min_task_sequences": ("task" not in names, "this dataset has no task column"),
        **{name: (not trajectories, "this dataset has no trajectory column")
           for name in ("jump_sigma", "frozen_share", "frozen_min_steps", "clip_steps")},
    }
    for name, (useless, why) in unused.items():
        if cli.typed(options, f"quality_{name}") and useless:
            raise UsageError(f"--quality_{name} has no effect: {why}")


def plan_videos(meta: DatasetMeta, mode: str, requested: policy.EncodeOptions) -> tuple[DatasetMeta, dict, dict]:
    """Decide copy or encode per video column. Returns the metadata whose video entries describe
    the output (a new DatasetMeta), column -> EncodeOptions or None for copy, and column ->
    declared source (width, height)."""
    encode, sizes, columns = {}, {}, []
    for spec in meta.columns:
        if spec.kind == VIDEO:
            encode[spec.name], entry = policy.plan_column(spec.meta, mode=mode, requested=requested)
            sizes[spec.name] = policy.declared_size(entry)
            spec = dataclasses.replace(spec, meta=entry)
        columns.append(spec)
    return dataclasses.replace(meta, columns=columns), encode, sizes


def partitionable(kind: pa.DataType) -> bool:
    """A type a lake table can partition by identity: a plain value (not a list, struct, binary or null)."""
    return (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_string(kind) or pa.types.is_large_string(kind)
            or pa.types.is_boolean(kind) or pa.types.is_date(kind))


def check_partition_by(options: Any, source: Source, meta: DatasetMeta) -> None:
    """--partition_by names scalar columns of plain values (refused before anything is written)."""
    columns = [column for column in (getattr(options, "partition_by", "") or "").split(",") if column]
    allowed = [spec.name for spec in meta.columns if spec.kind == SCALAR and spec.name != "sequence_id" and partitionable(spec.arrow_type)]
    specs = {spec.name: spec for spec in meta.columns}
    for column in columns:
        if column not in allowed:
            spec = specs.get(column)
            what = ("not a column" if spec is None else f"a {spec.kind} column" if spec.kind != SCALAR
                    else f"a {str(spec.arrow_type).replace('item: ', '')} column")
            raise UsageError(f"--partition_by={column}: not a scalar column of this {source.id} dataset that a table can partition "
                             f"by ({what}); columns it can partition by: {', '.join(allowed) or 'none'}")


def estimate_num_shards(meta: DatasetMeta, refs: list[SourceRef], target_mb: float) -> int:
    """Shards from the planned size of the rows (trajectories + timestamps, plus what each ref
    knows it holds beyond them), at least one; at most one per ref when every ref knows its steps."""
    bytes_per_step = 8
    for spec in meta.columns:
        if spec.kind == TRAJECTORY:
            bytes_per_step += spec.meta["dim"] * spec.arrow_type.value_type.value_type.bit_width // 8
    total = sum((ref.estimated_steps or 0) * bytes_per_step + ref.estimated_bytes for ref in refs)
    limit = len(refs) if all(ref.estimated_steps is not None for ref in refs) else max(len(refs), 1) * 1000
    return max(1, min(limit or 1, math.ceil(total / (target_mb * 1e6))))


def created_now() -> str:
    """The plan's `created_at`: now, in UTC, to the second."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def make_plan(options: Any, *, output_url: str, created_at: str, previous_root: str | None = "") -> ConversionPlan:
    """The whole plan from the command line's options (a ConvertOptions view, or any object with
    the same attributes). Reads the source's metadata and, under --incremental, the previous
    output's fingerprints; writes nothing.

    `previous_root` is where an --incremental run finds the previous output's fingerprints (a
    path on the output's filesystem): "" for the output itself, None when there is none (a lake
    table's current snapshot names the run folder that holds them).

    Raises UsageError for an option that has no effect on this dataset (or a --partition_by
    column a table cannot partition by), ConversionError for a
    source that cannot be converted.
    """
    with without_cycle_collection():
        return _make_plan(options, output_url=output_url, created_at=created_at, previous_root=previous_root)


@contextlib.contextmanager
def without_cycle_collection():
    """Planning builds a few objects per episode (refs, units, fingerprints: tens of millions at a
    million episodes), none of them in a reference cycle; Python's cycle collector walked them
    again and again as they piled up: 45 % of planning at 100,000 episodes. It is paused while
    planning (and while the plan files are written); reference counting still frees all of it.
    (Not `gc.freeze()`: nothing unfreezes, and a process that plans many times kept what each
    plan's garbage held.)"""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _refuse_forced_source(fs, root: str, source: Source) -> None:
    """--source names a format the input is not: say what it is instead (what auto-detection sees)."""
    try:
        seen = f"auto-detection finds {sources.detect(fs, root)}: pass --source={sources.detect(fs, root)} or leave --source out"
    except errors.FormatError:
        seen = "auto-detection finds no known format there either"
    why = ""
    if source.marker and not fs.exists(storage.join(root, source.marker)):
        why = f" (its {source.marker} is missing)"
    elif source.expects:
        why = f" ({source.expects})"
    raise errors.FormatError(f"{storage.url_for(fs, root)}: --source={source.id}, but this is not a {source.id} dataset{why}; {seen}")


def _make_plan(options: Any, *, output_url: str, created_at: str, previous_root: str | None) -> ConversionPlan:
    with blame(options.input, "cannot read the input"):
        fs, root = storage.open_root(options.input)
        source = sources.get(sources.detect(fs, root) if options.source == "auto" else options.source)
        if options.source != "auto" and not source.detect(fs, root):
            _refuse_forced_source(fs, root, source)
        plan_options = source_options(source, options)
        meta, refs = source.plan(fs, root, plan_options)
    planned_units = len(refs)
    if options.limit:  # the first N units, in the plan's order: a trial conversion
        refs = refs[:options.limit]
    # What the source's metadata puts in the columns, checked as mixtrain.json will hold it: a
    # value our own reader refuses (a camera fps of null, a pix_fmt of 5) is refused now, not published.
    schema.check_sidecar({"column_types": mixtrain.column_types(meta.columns)},
                         f"{storage.local_path(fs, root) or storage.url_for(fs, root)} ({source.id} metadata, as mixtrain.json would hold it)")
    mixtrain.check_output_names(meta.columns, (ref.sequence_id or ref.unit_prefix for ref in refs),
                                storage.local_path(fs, root) or storage.url_for(fs, root))
    if not refs or sources.sequence_count(refs) == 0:
        raise errors.ConversionError(f"{storage.url_for(fs, root)}: the {source.id} dataset holds no sequences; nothing to convert "
                                     "(an existing dataset at the output is left as it was)")
    requested = requested_encoding(options)
    meta, encode, sizes = plan_videos(meta, options.video, requested)
    check_effective(options, source, meta, encode)
    check_partition_by(options, source, meta)
    num_shards = options.num_shards or estimate_num_shards(meta, refs, options.target_shard_mb or cli.DEFAULT_SHARD_MB)
    # After the size estimate, which reads the list types.
    meta = dataclasses.replace(meta, columns=array_layout.with_layout(meta.columns, options.array_layout))
    assets = tuple(meta.source.get("assets") or ())
    if assets:  # published where the launcher copies them
        meta = dataclasses.replace(meta, source={**meta.source, "assets": [f"{mixtrain.FILES_DIR}/_dataset/{relative}" for relative in assets]})
    sidecar_extra = {
        "converter_version": formats.__version__,
        "options": {"source": source.id, "source_options": plan_options, "video": options.video, "num_shards": num_shards,
                    "on_error": options.on_error,
                    **({"max_skipped": errors.describe_skip_limit(options.max_skipped)} if options.on_error == "skip" else {}),
                    "video_encoding": dataclasses.asdict(requested), "video_stats": options.video_stats,
                    "array_layout": options.array_layout, "table_format": options.table_format,
                    **({"limit": {"first": len(refs), "of": planned_units}} if options.limit else {}),
                    **({"lance_videos": options.lance_videos} if options.table_format == "lance" else {})},
        "created_at": created_at,
    }
    # What changes the output of a unit; not the shard count, the error policy or the table format
    # (array_layout changes the columns' types, which the context hashes already).
    unrecorded = ("num_shards", "on_error", "max_skipped", "array_layout", "table_format", "lance_videos")
    recorded = {k: v for k, v in sidecar_extra["options"].items() if k not in unrecorded}
    context = fingerprint.context_hash(formats.__version__, {**recorded, "fps": meta.fps}, meta.columns)
    fingerprints = fingerprint.Fingerprints(context, source, tuple(refs), fingerprint.signatures(fs, root))
    to_convert, reused = refs, None
    if options.incremental and previous_root is not None:
        units, shared = source.incremental_units(refs)
        current = fingerprint.fingerprints(units, fingerprints.signed, shared, context)
        fingerprints = dataclasses.replace(fingerprints, known=current)
        out_fs, out_root = storage.open_root(output_url)
        reused = tables.reusable(out_fs, previous_root or out_root, units, current, context)
        if reused is not None:
            changed = {unit.key for unit, _ in units} - reused["units"]
            # The refs as planned: the ref paired with a unit is its fingerprinted identity (ORTF drops its row position).
            to_convert = [ref for (unit, _), ref in zip(units, refs, strict=True) if unit.key in changed]
            sidecar_extra["incremental"] = {"reused_sequences": len(reused["ids"]), "converted_units": len(to_convert),
                                            "previous_created_at": reused["created_at"]}
    copied = frozenset(spec.name for spec in meta.columns if spec.kind == VIDEO and spec.meta.get("written_as") == "copy")
    return ConversionPlan(source, storage.url_for(fs, root), meta, tuple(refs), tuple(to_convert), encode, sizes, copied,
                          num_shards, assets, sidecar_extra, fingerprints, reused)


@contextlib.contextmanager
def blame(url: str, what: str):
    """A failure that is not our ConversionError (storage unreachable, no credentials, permissions)
    becomes one naming the URL it concerns; the original stays the cause, for the log."""
    try:
        yield
    except errors.ConversionError:
        raise
    except Exception as error:  # noqa: BLE001 - filesystems raise many kinds
        first = (str(error).strip().splitlines() or [""])[0]
        raise errors.ConversionError(f"{url}: {what}: {type(error).__name__}: {first}") from error
