"""Convert a dataset to Mixtrain v1.0.

    python -m pipelines.convert --input=SRC --output=DST [--source=auto] [--video=copy|reencode]
        [--video_codec=h264 --video_crf=N --video_gop=N --video_preset=P --video_pix_fmt=yuv420p] [--video_stats]
        [--num_shards=N | --target_shard_mb=256] [--overwrite] [--runner=DirectRunner] [beam options]

Exit status: 0 converted; 1 bad input or a failed conversion (one line on stderr naming the file
and the sequence; the output is left as it was); 2 bad command line; 3 converted and published
with --on_error=skip, but some sequences were skipped (listed in DST/_errors.jsonl).
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import os
import re
import sys
import time
import uuid

# Before Arrow is imported: its jemalloc pool returns freed memory to the system, where mimalloc
# (the default) kept ~80 MB more at peak on long episodes (bench workload d). Set it to override.
if sys.platform.startswith("linux"):
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

import formats
from formats import errors, fingerprint, mixtrain, sources, storage, video
from formats.sequence import TRAJECTORY, VIDEO, DatasetMeta
from pipelines import local_workers
from transforms.errors import ERRORS, FAIL
from transforms.errors import MODES as ERROR_MODES
from transforms.read import ReadSequences
from transforms.reuse import ReusePrevious
from transforms.video import WriteVideos
from transforms.write import WriteMixtrain

__all__ = ["ConvertOptions", "build_pipeline", "main", "run"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_SKIPPED = 0, 1, 2, 3
# Runner names that mean "run here": served by Beam's FnApiRunner directly, because Beam's
# DirectRunner first tries Prism, which downloads a binary (NOTES.md) and ignores
# --direct_num_workers / --direct_running_mode.
LOCAL_RUNNERS = {None, "DirectRunner", "FnApiRunner", "BundleBasedDirectRunner"}


def _boolean(text: str) -> bool:
    """`--flag`, `--flag=true` and `--flag=false` all work: Flex Templates pass booleans as values."""
    value = text.strip().lower()
    if value not in ("true", "false", "1", "0", "yes", "no"):
        raise ValueError(f"expected true or false, found {text!r}")
    return value in ("true", "1", "yes")


class ConvertOptions(PipelineOptions):
    @classmethod
    def _add_argparse_args(cls, parser):
        parser.add_argument("--input", help="source dataset root (path or fsspec URL: gs://, file://, memory://)")
        parser.add_argument("--output", help="Mixtrain dataset root to write")
        parser.add_argument("--source", default="auto", help="source format: auto (detect) or " + ", ".join(sorted(sources.SOURCES)))
        parser.add_argument("--video", default="copy", choices=list(video.MODES),
                            help="copy: cut segments by packet remux, pixels identical to the source; "
                                 "reencode: decode and encode with --video_codec (image cameras are always encoded)")
        parser.add_argument("--video_codec", default="h264", choices=sorted(set(video.ENCODERS) - {"ffv1"}),
                            help="codec for encoded video (default h264: plays everywhere, decodes on NVDEC)")
        parser.add_argument("--video_crf", type=int, default=None,
                            help="quality, lower is better (default per codec: h264 16, hevc 16, av1 20)")
        parser.add_argument("--video_gop", type=int, default=None, help=f"keyframe every N frames (default {video.DEFAULT_GOP})")
        parser.add_argument("--video_preset", default=None, help="encoder speed preset (default: h264/hevc medium, av1 8)")
        parser.add_argument("--video_pix_fmt", default="yuv420p", help="yuv420p (default), yuv422p or yuv444p (h264, hevc)")
        parser.add_argument("--video_stats", type=_boolean, nargs="?", const=True, default=False,
                            help="per-channel image statistics of sampled frames into stats.json")
        parser.add_argument("--num_shards", type=int, default=0, help="number of Parquet shards (0: from --target_shard_mb)")
        parser.add_argument("--target_shard_mb", type=float, default=256.0, help="approximate uncompressed MB of rows per shard")
        parser.add_argument("--overwrite", type=_boolean, nargs="?", const=True, default=False,
                            help="replace an existing Mixtrain dataset at --output")
        parser.add_argument("--incremental", type=_boolean, nargs="?", const=True, default=False,
                            help="nightly re-conversion: reuse unchanged sequences of the dataset at --output, convert new and "
                                 "changed ones, drop deleted ones, publish a complete new version")
        parser.add_argument("--progress_every", type=int, default=100, help="worker progress line every N sequences (0: off)")
        parser.add_argument("--on_error", default=FAIL, choices=list(ERROR_MODES),
                            help="fail: the first bad sequence stops the run, output untouched; "
                                 "skip: bad sequences go to DST/_errors.jsonl, the rest is published (exit 3)")
        parser.add_argument("--split", default="", help="RLDS: comma-separated splits to convert (default: all, with a split column)")
        parser.add_argument("--fps", type=float, default=0.0,
                            help="RLDS: control rate in Hz (known Open X-Embodiment datasets have a default)")
        parser.add_argument("--bgr_cameras", default="",
                            help="RLDS: comma-separated cameras stored as BGR (column or feature names, or all): swapped to RGB")


def estimate_num_shards(meta: DatasetMeta, refs: list, target_mb: float) -> int:
    """Shards from the planned size of the rows (trajectories + timestamps), at least one."""
    bytes_per_step = 8 + meta.extra_bytes_per_step
    for spec in meta.columns:
        if spec.kind == TRAJECTORY:
            bytes_per_step += spec.meta["dim"] * spec.arrow_type.value_type.value_type.bit_width // 8
    total = sum(getattr(ref, "length", 0) for ref in refs) * bytes_per_step or meta.estimated_bytes
    limit = len(refs) if all(hasattr(ref, "length") for ref in refs) else max(len(refs), 1) * 1000
    return max(1, min(limit or 1, math.ceil(total / (target_mb * 1e6))))


def _runner(options: PipelineOptions):
    name = options.view_as(StandardOptions).runner
    if name in LOCAL_RUNNERS:
        from apache_beam.runners.portability.fn_api_runner import FnApiRunner

        return local_workers.runner(_ZYGOTE) if _ZYGOTE is not None else FnApiRunner()
    return name


def check_reachable_by_workers(options: PipelineOptions) -> None:
    """On a remote runner the workers cannot see the launcher's disk: --input and --output must be
    URLs of shared storage (gs://...), not local paths."""
    if options.view_as(StandardOptions).runner in LOCAL_RUNNERS:
        return
    for flag, url in (("--input", options.input), ("--output", options.output)):
        fs, _ = storage.open_root(url)
        if storage.is_local(fs):
            raise errors.ConversionError(f"{flag}={url} is on this machine's disk, which {options.view_as(StandardOptions).runner} "
                                         "workers cannot read; use a gs:// (or other shared storage) URL")


def prepare_output(output_url: str, overwrite: bool) -> None:
    """Refuse to touch an output that holds something we did not write, or a dataset without --overwrite."""
    fs, root = storage.open_root(output_url)
    if not fs.exists(root):
        return
    if not fs.isdir(root):
        raise errors.ConversionError(f"{root}: output exists and is not a directory")
    names = {entry.rstrip("/").rsplit("/", 1)[-1] for entry in fs.ls(root, detail=False)}
    names.discard(mixtrain.STAGING_DIR)
    if mixtrain.is_versioned(fs, root):  # `current` and _versions/ are ours only when `current` is our symlink
        names -= {mixtrain.VERSIONS_DIR, mixtrain.CURRENT}
    names = {name for name in names if not name.startswith(f".{mixtrain.CURRENT}-")}
    mixtrain.check_no_live_run(fs, root)
    if not names:
        return
    if mixtrain.SIDECAR in names or names <= set(mixtrain.PUBLISHED):
        if overwrite:
            return
        raise errors.ConversionError(f"{root}: output already holds a Mixtrain dataset; pass --overwrite to replace it")
    raise errors.ConversionError(f"{root}: output is not empty and is not a Mixtrain dataset ({', '.join(sorted(names))}); choose another --output")


def source_options(options: ConvertOptions) -> dict:
    """What `plan` may use of the command line (each source reads what concerns it)."""
    return {
        "splits": [s for s in options.split.split(",") if s],
        "fps": options.fps or None,
        "bgr_cameras": [c for c in options.bgr_cameras.split(",") if c],
    }


def requested_encoding(options: ConvertOptions) -> video.EncodeOptions:
    """The --video_* flags as checked EncodeOptions (raises ConversionError on a bad combination)."""
    return video.EncodeOptions(options.video_codec, options.video_crf, options.video_gop,
                               options.video_preset, options.video_pix_fmt).resolved()


def plan_videos(meta: DatasetMeta, mode: str, requested: video.EncodeOptions) -> tuple[dict, dict]:
    """Decide copy or encode per video column; rewrite meta.columns' entries to describe the output.

    Returns (column -> EncodeOptions or None for copy, column -> declared source (width, height)).
    """
    encode, sizes = {}, {}
    for position, spec in enumerate(meta.columns):
        if spec.kind == VIDEO:
            encode[spec.name], entry = video.plan_column(spec.meta, mode=mode, requested=requested)
            sizes[spec.name] = video.declared_size(entry)
            meta.columns[position] = dataclasses.replace(spec, meta=entry)
    return encode, sizes


def build_pipeline(pipeline: beam.Pipeline, options: ConvertOptions, run_id: str):
    """Plan on the launcher and add the conversion to `pipeline`. Returns (meta, refs, num_shards)."""
    fs, root = storage.open_root(options.input)
    source = sources.detect(fs, root) if options.source == "auto" else options.source
    module = sources.get(source)
    meta, refs = module.plan(fs, root, source_options(options))
    requested = requested_encoding(options)
    encode, sizes = plan_videos(meta, options.video, requested)
    num_shards = options.num_shards or estimate_num_shards(meta, refs, options.target_shard_mb)
    out_fs, out_root = storage.open_root(options.output)
    output_url = storage.url_for(out_fs, out_root)
    staging_url = storage.url_for(out_fs, storage.join(out_root, mixtrain.STAGING_DIR, run_id))
    source_url = storage.url_for(fs, root)
    sidecar_extra = {
        "converter_version": formats.__version__,
        "options": {"source": source, "source_options": source_options(options), "video": options.video, "num_shards": num_shards,
                    "on_error": options.on_error,
                    "video_encoding": dataclasses.asdict(requested), "video_stats": options.video_stats},
        "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    mixtrain.copy_assets(fs, root, out_fs, storage.join(out_root, mixtrain.STAGING_DIR, run_id), meta)
    units, shared = module.incremental_units(refs)
    context = fingerprint.context_hash(formats.__version__, {**{k: v for k, v in sidecar_extra["options"].items()
                                                                if k not in ("num_shards", "on_error")}, "fps": meta.fps}, meta.columns)
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
                                                         options.video_stats, options.progress_every, options.on_error)
    sequences = videos["sequences"]
    if reused is not None and reused["ids"]:
        kept = pipeline | "Reuse" >> ReusePrevious(reused["root_url"], staging_url, meta.columns, reused["shards"], reused["ids"])
        sequences = (sequences, kept) | "AllSequences" >> beam.Flatten()
    bad = read[ERRORS] + videos[ERRORS] | "BadSequences" >> beam.Flatten()
    _ = {"sequences": sequences, ERRORS: bad} | "Write" >> WriteMixtrain(
        staging_url, output_url, meta, num_shards, sidecar_extra, options.on_error, {"context": context, "units": current})
    return meta, refs, num_shards


_ERROR_LINE = re.compile(r"(?:^|\s|\.)(?:" + "|".join(n for n in errors.__all__ if n[0].isupper()) + r"): (.+)")


def user_message(error: BaseException) -> str | None:
    """The one line for a user: our own error's message, found even inside Beam's wrapping."""
    if isinstance(error, errors.ConversionError):
        return re.sub(r" \[while running '.*'\]$", "", str(error).splitlines()[0])
    matches = _ERROR_LINE.findall(str(error))
    if matches:
        return re.sub(r" \[while running '.*'\]$", "", matches[-1].strip())
    return None


def run(argv: list[str]) -> int:
    options = PipelineOptions(argv).view_as(ConvertOptions)
    if not options.input or not options.output:
        print("error: --input and --output are required (python -m pipelines.convert --help)", file=sys.stderr)
        return EXIT_USAGE
    try:
        requested_encoding(options)
        check_reachable_by_workers(options)
        if options.incremental and options.video_stats:
            raise errors.ConversionError("--video_stats cannot be combined with --incremental (image statistics of reused "
                                         "sequences are not kept); run without --incremental to refresh them")
    except errors.ConversionError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    started = time.monotonic()
    run_id = time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:8]
    out_fs, out_root = storage.open_root(options.output)
    staging = storage.join(out_root, mixtrain.STAGING_DIR, run_id)
    try:
        prepare_output(options.output, options.overwrite or options.incremental)
        mixtrain.claim_staging(out_fs, staging)
        pipeline = beam.Pipeline(runner=_runner(options), options=options)
        meta, refs, num_shards = build_pipeline(pipeline, options, run_id)
        units = "source shards" if hasattr(sources.get(meta.format), "expand_ref") else "sequences"
        print(f"[mixtrain-convert] {meta.format}: {len(refs)} {units} -> {options.output} ({num_shards} shards)", file=sys.stderr)
        pipeline.run().wait_until_finish()
    except Exception as error:  # noqa: BLE001 - every failure becomes one line and a clean output
        message = user_message(error)
        _discard(out_fs, staging, out_root)
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        return EXIT_FAILED
    summary, skipped = _summary(options.output, time.monotonic() - started)
    print(summary)
    return EXIT_SKIPPED if skipped else EXIT_OK


def _discard(fs, staging: str, out_root: str) -> None:
    """Best effort after a failure: drop this run's staging, and the output folder if we created it."""
    try:
        mixtrain.discard_staging(fs, staging, out_root)
        if fs.exists(out_root) and not fs.ls(out_root):
            fs.rm(out_root, recursive=True)
    except OSError:
        pass


def _summary(output_url: str, seconds: float) -> str:
    fs, root = storage.open_root(output_url)
    sidecar = mixtrain.read_sidecar(fs, root)
    total_bytes = sum(info["size"] for info in fs.find(mixtrain.published_root(fs, root), detail=True).values())
    skipped = int(sidecar.get("num_skipped", 0))
    line = (
        f"converted {sidecar['num_sequences']} sequences, {sidecar['num_timesteps']} timesteps, "
        f"{total_bytes / 1e6:.2f} MB in {seconds:.1f} s -> {output_url}"
    )
    non_finite = sidecar.get("non_finite_values") or {}
    if non_finite:
        line += f"; kept {sum(non_finite.values())} NaN/inf value(s) (" + ", ".join(f"{k}: {v}" for k, v in non_finite.items()) + ")"
    if skipped:
        line += f"; skipped {skipped} bad sequence(s), listed in {storage.join(root, mixtrain.ERRORS_FILE)}"
    return line, skipped


_ZYGOTE: local_workers.Zygote | None = None


def main() -> None:
    global _ZYGOTE
    if local_workers.wanted(sys.argv[1:]):  # local multi-process workers: forked from this process's imports
        _ZYGOTE = local_workers.Zygote()
    try:
        code = run(sys.argv[1:])
    finally:
        if _ZYGOTE is not None:
            _ZYGOTE.stop()
            _ZYGOTE = None
    sys.exit(code)


if __name__ == "__main__":
    main()
