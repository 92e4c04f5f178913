"""`validate --deep`: every video decoded and compared frame by frame with the source it came
from, and the statistics recomputed from the rows and compared with stats.json (pipelines/validate.py
runs the structural checks first)."""

from __future__ import annotations

import itertools
import json
import math

import av
import pyarrow.parquet as pq

from formats import mixtrain, sources, storage, video
from formats.errors import ConversionError, FormatError
from formats.mixtrain.schema import check_sidecar, check_stats
from formats.mixtrain.stats import summarise, table_stats
from formats.mixtrain.tables import lake, lance
from formats.sequence import ImageFrames
from formats.video import verify

__all__ = ["deep_check", "check_statistics", "cell_path", "NO_VIDEO", "NOT_COMPARED"]

NO_VIDEO = "no video columns"
NOT_COMPARED = "--deep's frame-by-frame comparison with the source is made on standalone (--table_format=parquet) datasets"


def cell_path(fs, root: str, relative: str, what: str) -> str:
    """The file a row's cell references: a URL as it is, a relative path inside the dataset; one
    that leads out of it (`../`, absolute, a symlink out) is a FormatError: validate never opens
    a file outside the dataset because a row says so."""
    return relative if "://" in relative else storage.resolve_inside(root, relative, what=what, fs=fs)


def _lossless(entry: dict) -> bool:
    """Copied columns and lossless encodes must match the source exactly."""
    return bool(entry.get("lossless")) or entry.get("written_as") == "copy"


def deep_check(url: str, source_url: str | None = None, min_psnr: float = 35.0) -> tuple[list[str], list[str]]:
    """Decode every video and compare it with its source. Returns (findings, summary lines)."""
    fs, root = storage.open_root(url)
    if not fs.exists(storage.join(root, mixtrain.SIDECAR)) and (lance.is_dataset(fs, root) or lake.detect(fs, root)):
        kind = "a Lance dataset" if lance.is_dataset(fs, root) else f"a {lake.detect(fs, root).capitalize()} table"
        return [], [f"{kind}: its structure is checked; {NOT_COMPARED}"]
    sidecar = storage.read_json(fs, storage.join(root, mixtrain.SIDECAR), limit=storage.MAX_SIDECAR_BYTES)
    check_sidecar(sidecar, storage.join(root, mixtrain.SIDECAR))
    statistics = check_statistics(fs, root, sidecar)
    columns = {name: entry for name, entry in sidecar["column_types"].items() if entry.get("type") == "video"}
    if not columns:
        return statistics, [NO_VIDEO]
    source = sidecar.get("source") or {}
    plan_options = (sidecar.get("converter") or {}).get("options", {}).get("source_options") or {}
    named, notes = source_url, []
    if named is None:  # what the dataset says: followed only on this machine's disk (a dataset from elsewhere is untrusted)
        uri = source.get("uri")
        if isinstance(uri, str) and (uri.startswith("file://") or "://" not in uri):
            named = uri
        elif uri:
            notes = [f"source {uri!r} (named by mixtrain.json) not fetched: pass --source=URI to compare with it; checked decoding "
                     "and timing only"]
    loader = _source_loader(named, source.get("format"), plan_options)
    if loader is None and not notes:
        notes = [f"source {named!r} not reachable: checked decoding and timing only"]
    findings: list[str] = statistics
    totals = {name: {"sequences": 0, "frames": 0, "identical": 0, "psnr": math.inf} for name in columns}
    for shard in sidecar.get("shards", []):
        with storage.arrow_input(fs, storage.join(root, shard)) as handle:
            table = pq.read_table(handle, columns=["sequence_id", "length", *columns])
        for row in table.to_pylist():
            sequence = loader(row["sequence_id"]) if loader is not None else None
            if loader is not None and sequence is None:
                findings.append(f"{storage.join(root, shard)}: {row['sequence_id']}: not in the source, nothing to compare with")
                continue
            for name, entry in columns.items():
                if row[name] is None:
                    continue
                fps = float(entry.get("fps") or 30)
                try:
                    file_path = cell_path(fs, root, row[name], f"{name} file")
                except FormatError as error:
                    findings.append(f"{storage.join(root, shard)}: {row['sequence_id']}: {error}")
                    continue
                reference = _reference_frames(loader, sequence, name, fps) if sequence is not None else iter(())
                try:
                    with storage.open_input(fs, file_path) as handle:
                        report = verify.compare_video(handle, reference, fps=fps)
                except (OSError, ValueError, ConversionError, av.FFmpegError) as error:
                    findings.append(f"{file_path}: {row['sequence_id']}: cannot be decoded: {type(error).__name__}: {error}")
                    continue
                if sequence is None:
                    report.reference_frames = row["length"]
                problems = report.problems(expected_frames=row["length"], min_psnr=min_psnr if sequence is not None else None,
                                           lossless=_lossless(entry) and sequence is not None)
                findings += [f"{file_path}: {row['sequence_id']}: {problem}" for problem in problems]
                total = totals[name]
                total["sequences"] += 1
                total["frames"] += report.frames
                total["identical"] += int(report.identical)
                total["psnr"] = min(total["psnr"], report.psnr_min)
    summary = notes + [
        f"{name}: {t['sequences']} videos, {t['frames']} frames, "
        + (f"{t['identical']}/{t['sequences']} pixel-identical" + ("" if t["psnr"] == math.inf else f", min luma PSNR {t['psnr']:.2f} dB")
           if loader else "not compared")
        for name, t in totals.items()
    ]
    return findings, summary


def check_statistics(fs, root: str, sidecar: dict) -> list[str]:
    """Recompute the statistics of the rows (per row group, merged in shard order, as the writer
    did) and compare them with stats.json: a finding per column whose stored value differs,
    naming the stat. Statistics only the videos give (image statistics) are not recomputed."""
    path = storage.resolve_inside(root, sidecar.get("stats") or mixtrain.STATS_FILE, what="stats", fs=fs)
    stored = storage.read_json(fs, path, want_object=False)
    if stored is None:
        return []
    check_stats(stored, path)
    partials = []
    for shard in sidecar.get("shards", []):
        with storage.arrow_input(fs, storage.join(root, shard)) as handle:
            storage.check_parquet_footer(handle, storage.join(root, shard))
            parquet = pq.ParquetFile(handle)
            specs = mixtrain.column_specs(parquet.schema_arrow, sidecar["column_types"])
            partial: dict = {}
            for group in range(parquet.num_row_groups):
                if parquet.metadata.row_group(group).num_rows == 0:  # an empty shard's one group: no values (a crash in table_stats)
                    continue
                for name, stats in table_stats(parquet.read_row_group(group), specs).items():
                    partial[name] = partial[name].merge(stats) if name in partial else stats
        partials.append(partial)
    recomputed = json.loads(mixtrain.dumps(summarise(partials)))
    findings = []
    for column, values in recomputed.items():
        if column not in stored:
            findings.append(f"{path}: {column}: no statistics, the rows give some")
            continue
        for stat, value in values.items():
            difference = _difference(stored[column].get(stat), value)
            if difference is not None:
                findings.append(f"{path}: {column}.{stat}{difference}")
                break
    return findings


def _difference(stored, recomputed, at: str = "") -> str | None:
    """Where two stat values first differ (`[i] is a, the rows give b`), or None when equal:
    means and standard deviations within 1e-9 relative (sums of floats), everything else exactly."""
    if isinstance(stored, list) and isinstance(recomputed, list) and len(stored) == len(recomputed):
        return next((found for index, (a, b) in enumerate(zip(stored, recomputed))
                     if (found := _difference(a, b, f"{at}[{index}]")) is not None), None)
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (stored, recomputed))
    if stored == recomputed and type(stored) is type(recomputed) or \
            numbers and math.isclose(stored, recomputed, rel_tol=1e-9, abs_tol=1e-12):
        return None
    return f"{at} is {_short(stored)}, the rows give {_short(recomputed)}"


def _short(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _source_loader(url: str | None, source_format: str | None, plan_options: dict):
    """sequence_id -> the source's Sequence (videos as segments or images), or None if unreachable."""
    if not url or source_format not in sources.SOURCES:
        return None
    try:
        fs, root = storage.open_root(url)
        if not fs.exists(root):
            return None
        source = sources.get(source_format)
        meta, refs = source.plan(fs, root, plan_options)
        reader = source.open(fs, root, meta)
        refs = [record for ref in refs for record in reader.expand(ref)]
    except Exception:  # noqa: BLE001 - a source the user named that cannot be read: the note says so, no traceback
        return None
    by_id = {ref.sequence_id: ref for ref in refs}

    def load(sequence_id: str):
        ref = by_id.get(sequence_id)
        return None if ref is None else reader.load(ref)

    load.fs, load.root = fs, root
    return load


def _reference_frames(loader, sequence, column: str, fps: float):
    item = sequence.videos.get(column)
    if item is None:
        return iter(())
    if isinstance(item, ImageFrames):
        return iter(item.frames)
    path = storage.resolve_inside(loader.root, item.path, what="video file")
    if getattr(item, "frame_indices", None) is not None:
        frames = list(video.iter_frames(storage.open_input(loader.fs, path), fps=fps))
        return (frames[i] for i in item.frame_indices if i < len(frames))
    frames = video.iter_frames(storage.open_input(loader.fs, path), start=item.start, end=item.end, fps=fps)
    if item.start is None and item.end is None:  # a whole file that may run on past the episode: its first frames
        return itertools.islice(frames, item.frames)
    return frames
