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
from pipelines.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE

FORMATS = ("lerobot_v3", "lerobot_v2.1")
STAGING_MARK = ".mixtrain-export-"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, as every command of this package says a bad command line
        print(f"error: {message} (see --help)", file=sys.stderr)
        sys.exit(EXIT_USAGE)


def parser() -> argparse.ArgumentParser:
    installed = os.path.basename(sys.argv[0]) == "mixtrain-export"  # the console script, else python -m
    p = _Parser(prog="mixtrain-export" if installed else "python -m pipelines.export", allow_abbrev=False,
                description="Write a Mixtrain dataset (standalone, Iceberg or Delta, as this converter wrote it) as a LeRobot "
                            "dataset. The output appears only when complete.")
    p.add_argument("--input", required=True, help="the Mixtrain dataset: a local path, gs://, s3:// or another fsspec URL")
    p.add_argument("--output", required=True, help="the folder to write (must not exist, or be empty, unless --overwrite)")
    p.add_argument("--to", required=True, choices=FORMATS,
                   help="the layout to write: lerobot_v3 (as lerobot 0.6 writes it) or lerobot_v2.1 (as lerobot 0.3 writes it)")
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
    p.add_argument("--direct_num_workers", type=int, default=1, help="local worker processes (0: one per core; default 1)")
    p.add_argument("--runner", default="DirectRunner", choices=("DirectRunner",), help="Beam runner (the local runner)")
    return p


def run(argv: list[str], *, out: TextIO | None = None, console: TextIO | None = None) -> int:
    out, console = out or sys.stdout, console or sys.stderr
    args = parser().parse_args(argv)
    sizes = [value for value in (args.data_file_mb, args.video_file_mb) if value is not None]
    if args.to == "lerobot_v2.1" and sizes:
        print("error: --data_file_mb and --video_file_mb have no effect with --to=lerobot_v2.1 (one file per episode) (see --help)",
              file=console)
        return EXIT_USAGE
    if any(not value > 0 for value in sizes) or args.direct_num_workers < 0 or (args.fps is not None and not 0 < args.fps < float("inf")):
        print("error: --data_file_mb, --video_file_mb and --fps must be positive, --direct_num_workers at least 0 (see --help)",
              file=console)
        return EXIT_USAGE
    args.data_file_mb = args.data_file_mb or 100.0
    args.video_file_mb = args.video_file_mb or 200.0
    from pipelines.failures import user_message
    from pipelines.session import EXIT_SIGNALS, Interrupted, interrupted_by

    started = time.monotonic()
    try:
        info, left_out = _export(args)
    except (KeyboardInterrupt, Interrupted) as interrupt:  # Ctrl-C or SIGTERM: the staging folder is gone, the output as it was
        name = str(interrupt) if isinstance(interrupt, Interrupted) else "SIGINT"
        print(f"error: interrupted ({name}): the output was left as it was", file=console)
        return interrupt.exit_code if isinstance(interrupt, Interrupted) else EXIT_SIGNALS[signal.SIGINT]
    except ConversionError as error:  # ours, perhaps raised inside a Beam step (its "[while running ...]" dropped)
        print(f"error: {for_terminal(user_message(error) or error)}", file=console)
        return EXIT_FAILED
    except Exception as error:  # noqa: BLE001 - Beam's wrapping of our own error, or a fault of ours: one line
        interrupt = interrupted_by(error)  # Beam's in-process runner wraps the Interrupted a step raised
        if interrupt is not None:
            print(f"error: {interrupt.message()}", file=console)
            return interrupt.exit_code
        message = user_message(error) or f"{args.output}: export failed: {type(error).__name__}: {(str(error).splitlines() or [''])[0]}"
        print(f"error: {for_terminal(message)}", file=console)
        return EXIT_FAILED
    frames, episodes = info["total_frames"], info["total_episodes"]
    cameras = sum(1 for feature in info["features"].values() if feature.get("dtype") == "video")
    print(f"exported {episodes} episode{'s' * (episodes != 1)}, {frames} frame{'s' * (frames != 1)}, {cameras} "
          f"camera{'s' * (cameras != 1)} as {args.to} in "
          f"{time.monotonic() - started:.1f} s -> {for_terminal(args.output)}", file=out)
    for item in left_out:
        print(f"left out: {for_terminal(item)}", file=out)
    return EXIT_OK


def _export(args) -> tuple[dict, list[str]]:
    """Plan, write into the staging folder, publish; info.json and what was left out."""
    from formats.exports import lerobot
    from formats.read.reader import open_dataset

    dataset = open_dataset(args.input)
    if hasattr(dataset, "lance"):  # formats/read/lance_rows.py: one pseudo-shard, videos as blobs
        raise ConversionError(f"{args.input}: a Lance dataset (--table_format=lance) cannot be exported yet; convert the source to "
                              "the standalone layout, Iceberg or Delta and export that")
    out_fs, out_root = storage.open_root(args.output)
    _check_output(dataset, out_fs, out_root, args)
    plan = lerobot.plan_export(dataset, data_file_mb=args.data_file_mb, video_file_mb=args.video_file_mb, fps=args.fps)
    writer = lerobot.Writer(plan, dataset.stats() if len(dataset) else {}, args.to)
    staging = _staging(out_root)
    out_fs.makedirs(staging, exist_ok=True)
    try:
        with _quiet_beam():
            info = _run_pipeline(args, dataset, writer, storage.url_for(out_fs, staging), plan.groups)
        _publish(out_fs, staging, out_root, args.overwrite)
    except BaseException:
        with contextlib.suppress(OSError):
            out_fs.rm(staging, recursive=True)
        raise
    return info, plan.left_out


def _check_output(dataset, out_fs, out_root: str, args) -> None:
    source = os.path.realpath(dataset.root) if storage.is_local(dataset.fs) else dataset.root
    target = os.path.realpath(out_root) if storage.is_local(out_fs) else out_root
    if target == source or target.startswith(source.rstrip("/") + "/") or source.startswith(target.rstrip("/") + "/"):
        raise ConversionError(f"{args.output}: the output must not be the input, inside it, or hold it")
    if out_fs.exists(out_root) and (not out_fs.isdir(out_root) or out_fs.ls(out_root)) and not args.overwrite:
        raise ConversionError(f"{args.output}: exists and is not empty; pass --overwrite to replace it")


def _staging(out_root: str) -> str:
    parent, _, name = out_root.rstrip("/").rpartition("/")
    if not parent or not name:
        raise ConversionError(f"{out_root}: the output must be a folder inside another (a bucket's or a disk's root cannot be staged "
                              "beside)")
    return f"{parent}/.{name}{STAGING_MARK}{uuid.uuid4().hex[:12]}"


def _publish(out_fs, staging: str, out_root: str, overwrite: bool) -> None:
    """The staging folder becomes the output. Locally one rename (the old output, if replaced,
    renamed aside first and removed after); on an object store the files are moved, meta/info.json
    last, so a reader that finds info.json finds everything it lists."""
    if storage.is_local(out_fs):
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
    if out_fs.exists(out_root):
        out_fs.rm(out_root, recursive=True)
    files = sorted(out_fs.find(staging), key=lambda path: path.endswith("meta/info.json"))
    for path in files:
        out_fs.mv(path, out_root + path[len(staging):])
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


def _run_pipeline(args, dataset, writer, staging_url: str, groups: int) -> dict:
    """Run the export's Beam steps into `staging_url`; meta/info.json as write_meta wrote it."""
    out_fs, out_root = storage.open_root(staging_url)
    if not groups:  # no episode: only meta/
        return writer.write_meta([], out_fs, out_root)
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from transforms.export import export

    workers = args.direct_num_workers
    options = PipelineOptions([f"--runner={args.runner}", f"--direct_num_workers={workers}",
                               f"--direct_running_mode={'in_memory' if workers == 1 else 'multi_processing'}"])
    pipeline = beam.Pipeline(options=options)
    export(pipeline, storage.url_for(dataset.fs, dataset.root), list(dataset.shards), writer, staging_url)
    pipeline.run().wait_until_finish()
    path = storage.join(out_root, "meta/info.json")
    if not out_fs.exists(path):
        raise ConversionError(f"{args.output}: the export wrote no meta/info.json")
    return json.loads(out_fs.cat_file(path))


def main() -> None:
    sys.exit(run(sys.argv[1:]))


if __name__ == "__main__":
    main()
