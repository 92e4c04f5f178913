"""What a converted dataset holds, as a terminal summary and as one self-contained HTML page.

The page carries its plots as inline SVG written here and its thumbnails as JPEG data URIs
encoded with PyAV (already a dependency): no script, no network, no plotting library. Every
number comes from mixtrain.json, stats.json, the `length` column and a few sampled sequences,
so a report of thousands of sequences reads a few MB, not the dataset.
"""

from __future__ import annotations

import base64
import html
import math
import time
from fractions import Fraction
from typing import Any

import av
import numpy as np

from formats import storage, video
from formats.errors import FormatError
from formats.mixtrain import quality
from formats.read.reader import STEPS, TIMESTAMPS, TRAJECTORY, Dataset
from formats.text import for_terminal

__all__ = ["summarize", "render_text", "render_html", "sample_ids", "thumbnail_jpeg", "quality_summary", "quality_lines"]

HISTOGRAM_BINS = 20
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf")
STAT_KEYS = ("mean", "std", "min", "q01", "q50", "q99", "max")
# Plots against time per column: a 512-dim language embedding would otherwise weigh megabytes
# (its statistics table keeps every dimension).
MAX_PLOTTED_DIMENSIONS = 32
MAX_POINTS = 200  # per plotted line: longer sequences are subsampled evenly (end points kept)
THUMB_WIDTH = 160  # shown this wide; encoded at most this wide (smaller frames are scaled up by the browser)
WORST_SHOWN = 3  # findings per check in the terminal summary (the highest scores)
PAGE_FINDINGS = 200  # findings per check on the page (every one is in _quality.jsonl)


def _mb(size: float) -> str:
    if size >= 1 << 20:
        return f"{size / (1 << 20):.1f} MB"
    return f"{size / 1024:.1f} kB"


def _fmt(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.4g}"
    return str(value)


def _du(ds: Dataset, relative: str) -> tuple[int, int]:
    """(files, bytes) under a folder of the dataset (0, 0 when absent)."""
    path = storage.join(ds.root, relative)
    if not ds.fs.exists(path):
        return 0, 0
    sizes = [info["size"] for info in ds.fs.find(path, detail=True).values() if info.get("type", "file") == "file"]
    return len(sizes), int(sum(sizes))


def _referenced(ds: Dataset, column: str) -> tuple[int, int]:
    """(files, bytes) a file column's rows reference, where they are not under files/<column>
    (a lake table: each run's files are in its own folder)."""
    paths = {path for path in ds.scan([column]).column(column).to_pylist() if isinstance(path, str) and "://" not in path}
    return len(paths), sum(ds.fs.size(storage.join(ds.root, path)) for path in paths)


def summarize(ds: Dataset, compute_quality: bool = False) -> dict[str, Any]:
    """Everything the terminal summary and the page show, as plain values. The quality findings
    are those the conversion recorded; computed from the rows (a read of every per-step column)
    only with `compute_quality`, for a dataset without them."""
    meta = ds.metadata
    lengths = ds.scan(["length"]).column("length").to_numpy().astype(np.int64)
    columns = []
    for name in ds.schema.names:
        entry = ds.column_types.get(name) or {}
        kind = ds.kind(name)
        kind_type = ds.schema.field(name).type
        dtype = entry.get("dtype") or (str(kind_type.value_type) if kind in (TIMESTAMPS, STEPS) else str(kind_type))
        columns.append({"name": name, "kind": kind, "dtype": dtype, "dim": entry.get("dim"),
                        "names": entry.get("names"), "units": entry.get("units"), "shape": entry.get("shape")})
    cameras = []
    for name in ds.video_columns:
        entry = ds.column_types[name]
        files, size = _du(ds, f"files/{name}") if ds.fs.exists(storage.join(ds.root, f"files/{name}")) else _referenced(ds, name)
        resolution = entry.get("resolution") or {}
        cameras.append({"name": name, "codec": entry.get("codec"), "width": resolution.get("width"), "height": resolution.get("height"),
                        "fps": entry.get("fps"), "pix_fmt": entry.get("pix_fmt"), "written_as": entry.get("written_as"),
                        "depth": bool(entry.get("is_depth_map")), "files": files, "bytes": size})
    shard_files, shard_bytes = _du(ds, "data") if all(shard.startswith("data/") for shard in ds.shards) else \
        (len(ds.shards), sum(ds.fs.size(storage.join(ds.root, shard)) for shard in ds.shards))
    converter = meta.get("converter") or {}
    source = meta.get("source") or {}
    histogram = None
    if len(lengths):  # whole-number bins: [low, low + width) of timesteps
        width = max(1, math.ceil((int(lengths.max()) - int(lengths.min()) + 1) / HISTOGRAM_BINS))
        edges = np.arange(int(lengths.min()), int(lengths.max()) + width + 1, width)
        histogram = np.histogram(lengths, bins=edges)
    return {
        "url": storage.url_for(ds.fs, ds.root),
        "format": meta.get("mixtrain"),
        "sequences": int(meta.get("num_sequences", len(lengths))),
        "timesteps": int(meta.get("num_timesteps", int(lengths.sum()))),
        "shards": len(ds.shards),
        "shard_bytes": shard_bytes,
        "lengths": {"min": int(lengths.min()), "median": float(np.median(lengths)), "mean": float(lengths.mean()),
                    "max": int(lengths.max()), "count": len(lengths)} if len(lengths) else None,
        "histogram": None if histogram is None else {"counts": histogram[0].tolist(), "edges": histogram[1].tolist()},
        "columns": columns,
        "cameras": cameras,
        "stats": ds.stats(),
        "non_finite": meta.get("non_finite_values") or {},
        "provenance": {"source_format": source.get("format"), "source_uri": source.get("uri"),
                       "converter": f"{converter.get('name', '?')} {converter.get('version', '?')}",
                       "options": converter.get("options") or {}, "created_at": meta.get("created_at")},
        "skipped": ds.errors(),
        "num_skipped": int(meta.get("num_skipped") or 0),
        "quality": quality_summary(ds, compute=compute_quality),
    }


def quality_summary(ds: Dataset, thresholds: quality.Thresholds | None = None, compute: bool = True) -> dict[str, Any] | None:
    """The data-quality findings: those the conversion recorded (`recorded`: True), or computed
    now from the rows for a dataset without them (None without `compute`), or with `thresholds`."""
    found = ds.quality() if thresholds is None else None
    recorded = found is not None
    if not recorded and not compute:
        return None
    header, findings = found if recorded else ds.compute_quality(thresholds)
    return {"recorded": recorded, "thresholds": header.get("thresholds"), "checks": header["checks"], "findings": findings}


def _quality_count(checks: dict, level: str) -> int:
    return sum(int(entry.get("findings") or 0) for entry in checks.values() if isinstance(entry, dict) and entry.get("level") == level)


def quality_lines(summary: dict) -> list[str]:
    found = summary.get("quality")
    if not found:
        return ["quality     not recorded (converted with --quality=false or by an earlier version): inspect --quality or "
                "validate --quality computes it from the rows"]
    checks = found["checks"]
    how = "recorded by the conversion" if found["recorded"] else "computed now from the rows"
    lines = [f"quality     {_quality_count(checks, quality.ERROR)} error(s), {_quality_count(checks, quality.WARNING)} warning(s), {how}"]
    by_check: dict[str, list[dict]] = {}
    for finding in found["findings"]:
        by_check.setdefault(finding["check"], []).append(finding)
    for name, entry in checks.items():
        if not isinstance(entry, dict) or not entry.get("findings"):
            continue
        lines.append(f"  {name:<14} {entry.get('level', '?'):<8} {entry['findings']} finding(s)")
        for finding in by_check.get(name, [])[:WORST_SHOWN]:
            where = f"steps {finding['steps'][0]}-{finding['steps'][-1]}" if finding.get("steps") else ""
            what = " ".join(part for part in (finding.get("sequence_id") or "", finding.get("column") or "", where) if part)
            lines.append(f"    {what}: {finding['message']}")
    unchecked = [name for name, entry in checks.items() if isinstance(entry, dict) and not entry.get("checked")]
    if unchecked:
        lines.append(f"  not checked: {', '.join(unchecked)} (docs/quality.md says what each check needs)")
    return lines


# --- terminal ---------------------------------------------------------------------------------


def _flat_options(options: dict, prefix: str = "") -> list[str]:
    out = []
    for key, value in options.items():
        if isinstance(value, dict):
            out += _flat_options(value, f"{prefix}{key}.")
        else:
            out.append(f"{prefix}{key}={value if not isinstance(value, list) else ','.join(map(str, value)) or '[]'}")
    return out


def _length_bars(summary: dict, width: int = 40) -> list[str]:
    histogram = summary["histogram"]
    if not histogram:
        return []
    counts, edges = histogram["counts"], histogram["edges"]
    top = max(counts) or 1
    lines = []
    labels = [f"{edges[i]}" if edges[i + 1] - edges[i] == 1 else f"{edges[i]}-{edges[i + 1] - 1}" for i in range(len(counts))]
    label_width = max(len(label) for label in labels)
    for label, count in zip(labels, counts):
        lines.append(f"  {label:>{label_width}}  {'#' * math.ceil(width * count / top):<{width}} {count}")
    return lines


def render_text(summary: dict) -> str:
    """The terminal summary: one fact per line, columns aligned, control characters escaped."""
    lines = [f"dataset     {summary['url']} (Mixtrain {summary['format']})",
             f"sequences   {summary['sequences']}",
             f"timesteps   {summary['timesteps']}",
             f"shards      {summary['shards']} ({_mb(summary['shard_bytes'])})"]
    lengths = summary["lengths"]
    if lengths:
        lines.append(f"lengths     min {lengths['min']}, median {lengths['median']:g}, mean {lengths['mean']:.1f}, max {lengths['max']}")
        lines += _length_bars(summary)
    lines.append("")
    lines.append("columns")
    width = max(len(c["name"]) for c in summary["columns"])
    for column in summary["columns"]:
        dim = f"dim {column['dim']}" if column["dim"] is not None else ""
        names = f"  [{', '.join(map(str, column['names']))}]" if column["names"] else ""
        units = f"  units {_units(column['units'])}" if column["units"] else ""
        lines.append(f"  {column['name']:<{width}}  {column['kind']:<10}  {column['dtype']:<8}  {dim:<7}{names}{units}".rstrip())
    lines.append("")
    if summary["cameras"]:
        lines.append("cameras")
        width = max(len(c["name"]) for c in summary["cameras"])
        for camera in summary["cameras"]:
            lines.append(f"  {camera['name']:<{width}}  {camera['codec']}  {camera['width']}x{camera['height']}  {_fmt(camera['fps'])} fps  "
                         f"{camera['pix_fmt']}  {camera['written_as']}{'  depth' if camera['depth'] else ''}  "
                         f"{camera['files']} files  {_mb(camera['bytes'])}")
    else:
        lines.append("cameras     none")
    lines.append("")
    lines.append("statistics  (per dimension, over every timestep of every sequence)")
    for column, entry in summary["stats"].items():
        if not isinstance(entry, dict) or "mean" not in entry:
            continue
        names = _dimension_names(summary, column, len(np.ravel(entry["mean"])))
        count = _at(entry.get("count"), 0)  # [] passes check_stats: nothing to show, not an IndexError
        lines.append(f"  {column}" + (f"  ({_fmt(count)} timesteps)" if count is not None else ""))
        width = max(len(n) for n in names)
        lines.append(f"    {'':<{width}}  " + "  ".join(f"{key:>10}" for key in STAT_KEYS))
        for index, name in enumerate(names):
            values = [_fmt(_at(entry.get(key), index)) for key in STAT_KEYS]
            lines.append(f"    {name:<{width}}  " + "  ".join(f"{v:>10}" for v in values))
    if summary["non_finite"]:
        lines.append("non-finite  " + ", ".join(f"{k}: {v}" for k, v in summary["non_finite"].items()))
    lines.append("")
    provenance = summary["provenance"]
    lines += ["provenance",
              f"  source      {provenance['source_format']} {provenance['source_uri']}",
              f"  converter   {provenance['converter']}",
              f"  options     {' '.join(_flat_options(provenance['options']))}",
              f"  created_at  {provenance['created_at']}"]
    skipped = summary["skipped"]
    count = max(summary["num_skipped"], len(skipped))
    lines.append(f"skipped     {count}" if count else "skipped     none")
    for error in skipped:
        lines.append(f"  {error.get('sequence_id', '?')}: {error.get('error') or error.get('message') or error}")
    lines += quality_lines(summary)
    return "\n".join(for_terminal(line) for line in lines) + "\n"  # names, units, errors... are the data's: no control reaches the terminal


def _units(units: Any) -> str:
    """A column's units: one for all dimensions, or one per dimension (shown comma-separated)."""
    if not units:
        return ""
    return ", ".join(map(str, units)) if isinstance(units, list) else str(units)


def _at(values: Any, index: int) -> Any:
    if values is None:
        return None
    flat = np.ravel(np.asarray(values, dtype=object))
    return flat[index] if index < len(flat) else None


def _real(value: Any) -> float | None:
    """A statistic drawn on the page: a number, or None for anything else stats.json holds there
    (drawn as absent; the table cell shows the value escaped)."""
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        return float(value)
    return None


def _dimension_names(summary: dict, column: str, dim: int) -> list[str]:
    for entry in summary["columns"]:
        if entry["name"] == column and entry["names"] and len(entry["names"]) == dim:
            return [str(n) for n in entry["names"]]
    return [f"[{i}]" for i in range(dim)]


# --- page -------------------------------------------------------------------------------------


def sample_ids(ids: list[str], count: int) -> list[str]:
    """`count` ids spread evenly over the sorted ids (first and last included): deterministic."""
    if len(ids) <= count:
        return list(ids)
    return [ids[round(i * (len(ids) - 1) / (count - 1))] for i in range(count)] if count > 1 else [ids[0]]


def thumbnail_jpeg(frame: np.ndarray, width: int = 160) -> bytes:
    """A JPEG of an [H, W, C] frame scaled to `width` (even sizes: 4:2:0 JPEG), via PyAV's mjpeg."""
    if frame.shape[-1] == 1:  # depth: stretched to 8-bit gray over its own range
        plane = frame[..., 0].astype(np.float64)
        low, high = float(plane.min()), float(plane.max())
        gray = ((plane - low) / (high - low) * 255 if high > low else np.zeros_like(plane)).astype(np.uint8)
        frame = np.repeat(gray[..., None], 3, axis=2)
    height, src_width = frame.shape[:2]
    width = max(2, min(width, src_width) // 2 * 2)
    scaled_height = max(2, round(height * width / src_width / 2) * 2)
    image = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame, dtype=np.uint8), format="rgb24")
    image = image.reformat(width=width, height=scaled_height, format="yuvj420p")
    codec = av.CodecContext.create("mjpeg", "w")
    codec.width, codec.height, codec.pix_fmt = width, scaled_height, "yuvj420p"
    codec.time_base = Fraction(1, 25)
    packets = codec.encode(image) + codec.encode(None)
    return b"".join(bytes(packet) for packet in packets)


def _svg_text(x: float, y: float, text: str, anchor: str = "start", size: int = 11, extra: str = "") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}"{extra}>{html.escape(text)}</text>'


def _histogram_svg(summary: dict) -> str:
    histogram = summary["histogram"]
    counts, edges = histogram["counts"], histogram["edges"]
    width, height, left, bottom, top = 640, 220, 48, 34, 12
    plot_w, plot_h = width - left - 12, height - bottom - top
    peak = max(counts) or 1
    bar_w = plot_w / len(counts)
    parts = [f'<svg class="plot" id="length-histogram" role="img" aria-label="histogram of sequence lengths" '
             f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">']
    for index, count in enumerate(counts):
        bar_h = plot_h * count / peak
        parts.append(f'<rect x="{left + index * bar_w + 1:.1f}" y="{top + plot_h - bar_h:.1f}" width="{max(bar_w - 2, 1):.1f}" '
                     f'height="{bar_h:.1f}" fill="{PALETTE[0]}"><title>{edges[index]}-{edges[index + 1] - 1} timesteps: {count}</title></rect>')
    parts.append(f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="#333"/>')
    parts.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="#333"/>')
    step = max(1, math.ceil(len(counts) / 10))  # at most ~10 labels: a bar's first length, under its centre
    for index in range(0, len(counts), step):
        parts.append(_svg_text(left + (index + 0.5) * bar_w, top + plot_h + 14, str(edges[index]), "middle"))
    parts.append(_svg_text(left - 6, top + 8, str(peak), "end"))
    parts.append(_svg_text(left - 6, top + plot_h, "0", "end"))
    parts.append(_svg_text(left + plot_w / 2, height - 4, "timesteps per sequence", "middle"))
    parts.append("</svg>")
    return "".join(parts)


def _band_svg(entry: dict, index: int) -> str:
    """One dimension's distribution on its own scale: min-max line, q01-q99 and q10-q90 bars,
    mean +- std whisker, median tick, mean dot."""
    width, height, pad = 260, 18, 4
    low, high = _real(_at(entry.get("min"), index)), _real(_at(entry.get("max"), index))
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
        return f'<svg class="band" width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg">{_svg_text(4, 13, "undefined")}</svg>'
    span = (high - low) or 1.0

    def x(value: Any) -> float:
        if value is None or not math.isfinite(value):
            return float("nan")
        return pad + (width - 2 * pad) * (min(max(value, low), high) - low) / span

    mid = height / 2
    parts = [f'<svg class="band" width="{width}" height="{height}" viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">',
             f'<line x1="{x(low):.1f}" y1="{mid}" x2="{x(high):.1f}" y2="{mid}" stroke="#999"/>']
    for lo_key, hi_key, thick, colour in (("q01", "q99", 6, "#c6dbef"), ("q10", "q90", 10, "#6baed6")):
        a, b = x(_real(_at(entry.get(lo_key), index))), x(_real(_at(entry.get(hi_key), index)))
        if math.isfinite(a) and math.isfinite(b):
            parts.append(f'<rect x="{a:.1f}" y="{mid - thick / 2}" width="{max(b - a, 1):.1f}" height="{thick}" fill="{colour}"/>')
    mean, std = _real(_at(entry.get("mean"), index)), _real(_at(entry.get("std"), index))
    if mean is not None and std is not None and math.isfinite(mean) and math.isfinite(std):
        parts.append(f'<line x1="{x(mean - std):.1f}" y1="{mid + 6}" x2="{x(mean + std):.1f}" y2="{mid + 6}" '
                     f'stroke="{PALETTE[1]}" stroke-width="2"/>')
    median = x(_real(_at(entry.get("q50"), index)))
    if math.isfinite(median):
        parts.append(f'<line x1="{median:.1f}" y1="{mid - 7}" x2="{median:.1f}" y2="{mid + 7}" stroke="#08306b" stroke-width="2"/>')
    if mean is not None and math.isfinite(x(mean)):
        parts.append(f'<circle cx="{x(mean):.1f}" cy="{mid}" r="3" fill="{PALETTE[1]}"/>')
    parts.append("</svg>")
    return "".join(parts)


def _subsample(values: np.ndarray) -> np.ndarray:
    if len(values) <= MAX_POINTS:
        return np.arange(len(values))
    return np.unique(np.linspace(0, len(values) - 1, MAX_POINTS).round().astype(np.int64))


def _lines_svg(series: list[tuple[str, np.ndarray, np.ndarray]], title: str, element_id: str) -> str:
    """Small plot of value against time, one line per sampled sequence."""
    width, height, left, bottom, top = 230, 120, 44, 18, 16
    plot_w, plot_h = width - left - 6, height - bottom - top
    finite = [v[np.isfinite(v)] for _, _, v in series]
    values = np.concatenate(finite) if finite else np.zeros(0)
    times = np.concatenate([t for _, t, _ in series]) if series else np.zeros(0)
    parts = [f'<svg class="plot trajectory" id="{html.escape(element_id)}" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
             f'xmlns="http://www.w3.org/2000/svg">', _svg_text(left, 11, title, size=11, extra=' font-weight="bold"')]
    if len(values) == 0 or len(times) == 0:
        parts.append(_svg_text(left, top + plot_h / 2, "no finite values"))
        return "".join(parts) + "</svg>"
    low, high = float(values.min()), float(values.max())
    if high == low:
        low, high = low - 1, high + 1
    t_max = float(times.max()) or 1.0
    parts.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#ccc"/>')
    for index, (sequence_id, t, v) in enumerate(series):
        keep = _subsample(v)
        points = " ".join(f"{left + plot_w * t[i] / t_max:.1f},{top + plot_h * (1 - (v[i] - low) / (high - low)):.1f}"
                          for i in keep if math.isfinite(v[i]))
        parts.append(f'<polyline fill="none" stroke="{PALETTE[index % len(PALETTE)]}" stroke-width="1.2" points="{points}">'
                     f'<title>{html.escape(sequence_id)}</title></polyline>')
    parts.append(_svg_text(left - 3, top + 8, f"{high:.3g}", "end", 10))
    parts.append(_svg_text(left - 3, top + plot_h, f"{low:.3g}", "end", 10))
    parts.append(_svg_text(left, height - 4, "0 s", "start", 10))
    parts.append(_svg_text(left + plot_w, height - 4, f"{t_max:.3g} s", "end", 10))
    parts.append("</svg>")
    return "".join(parts)


STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:22px;margin-bottom:4px}h2{font-size:18px;border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:28px}
h3{font-size:15px;margin:18px 0 6px}
table{border-collapse:collapse;font-size:13px}td,th{padding:3px 8px;text-align:left;border-bottom:1px solid #eee;vertical-align:middle}
th{background:#f6f6f6}td.num{text-align:right;font-variant-numeric:tabular-nums}
.facts td:first-child{color:#666}.grid{display:flex;flex-wrap:wrap;gap:6px}
.thumbs img{display:block;border:1px solid #ccc}.legend span{display:inline-block;margin-right:14px;font-size:12px}
.legend i{display:inline-block;width:14px;height:3px;margin-right:4px;vertical-align:middle}
code{font-size:12px;background:#f4f4f4;padding:1px 4px}.muted{color:#777;font-size:12px}
"""


def _quality_html(summary: dict) -> list[str]:
    """The findings section: a row per check, then the findings by sequence (a <details> each, so
    that a thousand sequences make a short page), at most PAGE_FINDINGS per check."""
    found = summary.get("quality")
    e = html.escape
    if not found:
        return ['<h2 id="quality">Data quality</h2><p class="muted">Not recorded by the conversion (--quality=false or an earlier '
                "version): inspect --quality computes it from the rows.</p>"]
    checks = found["checks"]
    how = "recorded by the conversion" if found["recorded"] else "computed now from the rows"
    out = [f'<h2 id="quality">Data quality</h2><p class="muted">{_quality_count(checks, quality.ERROR)} error(s), '
           f'{_quality_count(checks, quality.WARNING)} warning(s), {e(how)}; every finding is in _quality.jsonl.</p>',
           '<table id="quality-checks"><tr><th>check</th><th>level</th><th>what it finds</th><th class="num">findings</th></tr>']
    for name, entry in checks.items():
        if not isinstance(entry, dict):
            continue
        what = quality.CHECKS.get(name, ("", "", ()))[1]
        count = entry.get("findings") if entry.get("checked") else "not checked"
        out.append(f"<tr><td><code>{e(str(name))}</code></td><td>{e(str(entry.get('level')))}</td><td>{e(what)}</td>"
                   f'<td class="num">{e(str(count))}</td></tr>')
    out.append("</table>")
    shown: dict[str, int] = {}
    by_sequence: dict[str, list[dict]] = {}
    for finding in found["findings"]:
        shown[finding["check"]] = shown.get(finding["check"], 0) + 1
        if shown[finding["check"]] <= PAGE_FINDINGS:
            by_sequence.setdefault(finding.get("sequence_id") or "(the dataset)", []).append(finding)
    if by_sequence:
        out.append('<h3>By sequence</h3><div id="quality-sequences">')
        for sequence_id, findings in sorted(by_sequence.items(), key=lambda item: (-sum(f["level"] == quality.ERROR for f in item[1]), item[0])):
            levels = sorted({f["level"] for f in findings})
            out.append(f"<details><summary><code>{e(sequence_id)}</code> {len(findings)} finding(s): {e(', '.join(levels))}</summary>"
                       "<table><tr><th>check</th><th>level</th><th>column</th><th>dims</th><th>steps</th><th>message</th></tr>")
            for f in findings:
                steps = f"{e(str(f['steps'][0]))}&ndash;{e(str(f['steps'][-1]))}" if f.get("steps") else ""
                dims = ", ".join(str(d) for d in f.get("dims") or [])
                out.append(f"<tr><td>{e(f['check'])}</td><td>{e(f['level'])}</td><td><code>{e(str(f.get('column') or ''))}</code></td>"
                           f"<td>{e(dims)}</td><td>{steps}</td><td>{e(f['message'])}</td></tr>")
            out.append("</table></details>")
        out.append("</div>")
    return out


def render_html(ds: Dataset, summary: dict, *, samples: int = 4, trajectory_samples: int = 3) -> str:
    """The page: summary, length histogram, per-dimension statistics bands and sampled
    trajectories for every trajectory column, and first/middle/last thumbnails per camera."""
    started = time.perf_counter()
    e = html.escape
    out = [f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Mixtrain report: {e(summary['url'])}</title>",
           f"<style>{STYLE}</style></head><body>",
           f"<h1>Mixtrain dataset report</h1><p class=\"muted\">{e(summary['url'])}</p>"]
    lengths = summary["lengths"] or {}
    provenance = summary["provenance"]
    facts = [("format", f"Mixtrain {summary['format']}"), ("sequences", f"{summary['sequences']:,}"),
             ("timesteps", f"{summary['timesteps']:,}"), ("shards", f"{summary['shards']} ({_mb(summary['shard_bytes'])})"),
             ("lengths", f"min {lengths.get('min')}, median {lengths.get('median', 0):g}, "
                         f"mean {lengths.get('mean', 0):.1f}, max {lengths.get('max')}"),
             ("source", f"{provenance['source_format']} {provenance['source_uri']}"), ("converter", provenance["converter"]),
             ("options", " ".join(_flat_options(provenance["options"]))), ("created_at", str(provenance["created_at"])),
             ("skipped", str(max(summary["num_skipped"], len(summary["skipped"])) or "none"))]
    out.append('<h2>Summary</h2><table class="facts">' + "".join(f"<tr><td>{e(k)}</td><td>{e(str(v))}</td></tr>" for k, v in facts) + "</table>")
    if summary["skipped"]:
        out.append("<h3>Skipped sequences</h3><table><tr><th>sequence</th><th>error</th></tr>" + "".join(
            f"<tr><td>{e(str(s.get('sequence_id', '?')))}</td><td>{e(str(s.get('error') or s.get('message') or s))}</td></tr>"
            for s in summary["skipped"]) + "</table>")
    out += _quality_html(summary)
    if summary["histogram"]:
        out.append("<h2>Sequence lengths</h2>" + _histogram_svg(summary))
    out.append("<h2>Columns</h2><table><tr><th>column</th><th>kind</th><th>dtype</th><th>dim</th><th>names</th><th>units</th></tr>")
    for column in summary["columns"]:
        out.append(f"<tr><td><code>{e(column['name'])}</code></td><td>{e(column['kind'])}</td><td>{e(str(column['dtype']))}</td>"
                   f"<td class=\"num\">{'' if column['dim'] is None else e(_fmt(column['dim']))}</td>"
                   f"<td>{e(', '.join(map(str, column['names'] or [])))}</td><td>{e(_units(column['units']))}</td></tr>")
    out.append("</table>")
    if summary["cameras"]:
        out.append("<h2>Cameras</h2><table><tr><th>camera</th><th>codec</th><th>resolution</th><th>fps</th><th>pix_fmt</th>"
                   "<th>written as</th><th>files</th><th>bytes</th></tr>")
        for camera in summary["cameras"]:
            out.append(f"<tr><td><code>{e(camera['name'])}</code>{' (depth)' if camera['depth'] else ''}</td><td>{e(str(camera['codec']))}</td>"
                       f"<td>{e(_fmt(camera['width']))}x{e(_fmt(camera['height']))}</td><td class=\"num\">{e(_fmt(camera['fps']))}</td>"
                       f"<td>{e(str(camera['pix_fmt']))}</td><td>{e(str(camera['written_as']))}</td>"
                       f"<td class=\"num\">{camera['files']}</td><td class=\"num\">{_mb(camera['bytes'])}</td></tr>")
        out.append("</table>")

    ids = ds.sequence_ids()
    picked = sample_ids(ids, trajectory_samples)
    trajectory_columns = [c["name"] for c in summary["columns"] if c["kind"] == TRAJECTORY]
    step_columns = [c["name"] for c in summary["columns"] if c["kind"] in (STEPS, TIMESTAMPS) and c["name"] in summary["stats"]]
    rows = {sequence_id: ds.sequence(sequence_id, ["sequence_id", "timestamp", *trajectory_columns]) for sequence_id in picked}
    out.append("<h2>Statistics per dimension</h2><p class=\"muted\">Over every timestep of every sequence (stats.json). Each bar is drawn "
               "on its dimension's own range, min to max: light band q01&ndash;q99, dark band q10&ndash;q90, dark tick median, red dot mean, "
               "red line mean &plusmn; std.</p>")
    for name in trajectory_columns + step_columns:
        entry = summary["stats"].get(name)
        column = next(c for c in summary["columns"] if c["name"] == name)
        if not entry or not isinstance(entry, dict):
            out.append(f"<h3><code>{e(name)}</code></h3><p class=\"muted\">no statistics in stats.json</p>")
            continue
        dim = len(np.ravel(entry.get("mean", [])))
        names = _dimension_names(summary, name, dim)
        units = column.get("units")
        out.append(f"<h3><code>{e(name)}</code> <span class=\"muted\">{e(column['kind'])}, {e(str(column['dtype']))}, "
                   f"{dim} dimension(s){', units ' + e(str(units)) if units else ''}</span></h3>")
        out.append(f'<table class="stats" id="stats-{e(name)}"><tr><th>dimension</th><th>units</th><th class="num">mean</th><th class="num">std</th>'
                   '<th class="num">min</th><th class="num">q01</th><th class="num">q50</th><th class="num">q99</th><th class="num">max</th>'
                   "<th>distribution</th></tr>")
        for index, dimension in enumerate(names):
            unit = units[index] if isinstance(units, list) and index < len(units) else (units or "")
            cells = "".join(f'<td class="num">{e(_fmt(_at(entry.get(k), index)))}</td>' for k in ("mean", "std", "min", "q01", "q50", "q99", "max"))
            out.append(f"<tr><td>{e(dimension)}</td><td>{e(str(unit))}</td>{cells}<td>{_band_svg(entry, index)}</td></tr>")
        out.append("</table>")

    if trajectory_columns and rows:
        legend = "".join(f'<span><i style="background:{PALETTE[i % len(PALETTE)]}"></i>{e(s)}</span>' for i, s in enumerate(picked))
        out.append(f"<h2>Sampled trajectories</h2><p class=\"legend\">{legend}</p>")
        for name in trajectory_columns:
            dim = ds.column_types[name].get("dim")
            if not isinstance(dim, int) or isinstance(dim, bool) or dim < 1:  # absent, or not a count: the decoded rows say
                dim = rows[picked[0]][name].shape[1]
            names = _dimension_names(summary, name, int(dim))
            shown = names[:MAX_PLOTTED_DIMENSIONS]
            note = f' <span class="muted">(the first {len(shown)} of {len(names)} dimensions)</span>' if len(shown) < len(names) else ""
            out.append(f'<h3><code>{e(name)}</code> against time{note}</h3><div class="grid" id="trajectories-{e(name)}">')
            for index, dimension in enumerate(shown):
                series = [(s, rows[s]["timestamp"], rows[s][name][:, index].astype(np.float64)) for s in picked if rows[s].get(name) is not None]
                out.append(_lines_svg(series, dimension, f"plot-{name}-{index}"))
            out.append("</div>")

    if summary["cameras"]:
        out.append("<h2>Camera thumbnails</h2><p class=\"muted\">First, middle and last frame of sampled sequences.</p>")
        thumb_ids = sample_ids(ids, samples)
        scalars = ds.scan(["sequence_id", "length", *(["task"] if "task" in ds.schema.names else []), *ds.video_columns],
                          [("sequence_id", "in", thumb_ids)]).to_pylist()
        for camera in summary["cameras"]:
            name = camera["name"]
            out.append(f'<h3><code>{e(name)}</code></h3><table class="thumbs" id="thumbs-{e(name)}"><tr><th>sequence</th><th>task</th>'
                       "<th>first</th><th>middle</th><th>last</th></tr>")
            for row in scalars:
                cells = []
                if row[name] is None:
                    cells = ['<td colspan="3" class="muted">no video</td>']
                else:
                    length = int(row["length"])
                    for step in sorted({0, length // 2, length - 1}) if length > 2 else range(length):
                        try:
                            frame = ds.decode(row[name], name, step, step + 1)[0]
                            jpeg = base64.b64encode(thumbnail_jpeg(frame, THUMB_WIDTH)).decode()
                            cells.append(f'<td><img width="{THUMB_WIDTH}" alt="{e(row["sequence_id"])} {e(name)} timestep {step}" '
                                         f'title="timestep {step}" src="data:image/jpeg;base64,{jpeg}"></td>')
                        except (FormatError, video.VideoError) as error:
                            cells.append(f'<td class="muted">timestep {step}: {e(str(error))}</td>')
                    cells += ["<td></td>"] * (3 - len(cells))  # one or two timesteps: the row keeps three cells
                out.append(f"<tr><td><code>{e(row['sequence_id'])}</code><br><span class=\"muted\">{int(row['length'])} timesteps</span></td>"
                           f"<td>{e(str(row.get('task') or ''))}</td>{''.join(cells)}</tr>")
            out.append("</table>")
    out.append(f"<p class=\"muted\">Written by mixtrain-convert's pipelines.inspect in {time.perf_counter() - started:.1f} s.</p></body></html>")
    return "\n".join(out)
