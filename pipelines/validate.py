"""Check a Mixtrain dataset against the contract this product writes.

    python -m pipelines.validate DST [--deep [--source=SRC] [--min_psnr=35]]

Checks: mixtrain.json present and well-formed; every shard's schema matches column_types;
sequence_ids unique across shards; T consistent across `length`, timestamps, trajectories and
per-step columns; every referenced file exists, holds T frames, and has the codec and size
column_types declares; counts match the sidecar.

--deep decodes every video and compares it frame by frame with the source it came from (the
source URI recorded in mixtrain.json, or --source): frame count, frame i at i/fps, and pixels:
identical for copied and lossless columns, luma PSNR >= --min_psnr for lossy encodes. It prints
one summary line per camera. Without a reachable source only the decode and timing are checked.
It also recomputes the statistics of the rows and compares them with stats.json (a finding names
the column and the stat).
Exit status 0 when clean, 1 with one finding per line otherwise, 2 on a bad command line.
"""

from __future__ import annotations

import argparse
import sys

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from formats import mixtrain, storage, video
from formats.errors import ConversionError, FormatError
from formats.mixtrain import array_layout
from formats.mixtrain.schema import check_sidecar, check_stats
from formats.mixtrain.tables import TableSettings, lake, lance
from formats.read import reader
from formats.text import for_terminal
from pipelines import command_name, exit_without_teardown
from pipelines.validate_deep import NO_VIDEO, NOT_COMPARED, cell_path, deep_check

__all__ = ["validate", "validate_table", "deep_check", "main", "entry"]



def _expected_type(entry: dict) -> pa.DataType | None:
    kind = entry.get("type")
    if kind == "timestamps":
        return pa.list_(pa.float64())
    if kind == "trajectory":
        return array_layout.cell_type(entry)
    if kind == "video":
        return pa.string()
    return None


def validate(url: str) -> list[str]:
    """Return the findings (empty when the dataset is valid)."""
    fs, root = storage.open_root(url)
    sidecar_path = storage.join(root, mixtrain.SIDECAR)
    if not fs.exists(sidecar_path) and lance.is_dataset(fs, root):
        return _validate_lance(fs, root)
    table_format = lake.detect(fs, root) if not fs.exists(sidecar_path) else None
    if table_format is not None:
        return validate_table(fs, root, table_format)
    if not fs.exists(sidecar_path):
        return [f"{sidecar_path}: missing (not a finished Mixtrain dataset)"]
    try:
        sidecar = storage.parse_json(storage.read_small(fs, sidecar_path, "mixtrain.json", limit=storage.MAX_SIDECAR_BYTES), sidecar_path)
    except FormatError as error:
        return [str(error)]
    findings: list[str] = []
    if not isinstance(sidecar, dict) or sidecar.get("mixtrain") != mixtrain.VERSION:
        return [f"{sidecar_path}: 'mixtrain' must be {mixtrain.VERSION!r}"]
    check_sidecar(sidecar, sidecar_path)  # values of the wrong type: one error, nothing else can be checked
    column_types = sidecar["column_types"]
    shards = sidecar.get("shards") or sorted(
        p[len(root) + 1:] for p in fs.glob(storage.join(root, mixtrain.DATA_DIR, "*.parquet"))
    )
    if not shards:
        findings.append(f"{root}: no data shards")
    seen_ids: dict[str, str] = {}
    sequences = timesteps = 0
    for shard in shards:
        path = storage.join(root, shard)
        if not fs.exists(path):
            findings.append(f"{path}: listed in mixtrain.json but missing")
            continue
        try:
            with storage.arrow_input(fs, path) as handle:
                storage.check_parquet_footer(handle, path)
                table = pq.read_table(handle)
        except FormatError as error:
            findings.append(str(error))
            continue
        except (OSError, pa.ArrowException) as error:
            findings.append(f"{path}: unreadable Parquet shard: {str(error).splitlines()[0] if str(error) else type(error).__name__}")
            continue
        findings += _check_schema(path, table.schema, column_types)
        if "sequence_id" not in table.column_names:
            continue
        for sequence_id in table.column("sequence_id").to_pylist():
            if sequence_id in seen_ids:
                findings.append(f"{path}: sequence_id {sequence_id!r} also in {seen_ids[sequence_id]}")
            seen_ids[sequence_id] = shard
        sequences += table.num_rows
        findings += _check_lengths(path, table, column_types)
        findings += _check_files(fs, root, path, table, column_types)
        if "length" in table.column_names:
            timesteps += pc.sum(table.column("length")).as_py() or 0
    if sidecar.get("num_sequences") not in (None, sequences):
        findings.append(f"{sidecar_path}: num_sequences {sidecar['num_sequences']} but the shards hold {sequences}")
    if sidecar.get("num_timesteps") not in (None, timesteps):
        findings.append(f"{sidecar_path}: num_timesteps {sidecar['num_timesteps']} but the shards hold {timesteps}")
    findings += _check_stats_file(fs, root, sidecar.get("stats"), "mixtrain.json")
    return findings


def _check_stats_file(fs, root: str, name: str | None, named_in: str) -> list[str]:
    """stats.json: present when named, and of the types stats.json has (a FormatError otherwise)."""
    if not name:
        return []
    path = storage.resolve_inside(root, name, what="stats", fs=fs)
    if not fs.exists(path):
        return [f"{path}: named in {named_in} but missing"]
    check_stats(storage.read_json(fs, path, want_object=False), path)
    return []


def _validate_lance(fs, root: str) -> list[str]:
    """A Lance dataset (--table_format=lance): the same row checks as a shard's, on its latest
    version; blob videos probed through take_blobs (frames == length, codec, resolution)."""
    rows = reader.open_dataset(storage.url_for(fs, root))  # checks the metadata: a FormatError when it cannot be used
    where = f"{storage.url_for(fs, root)} (Lance version {rows.version})"
    blobs = [name for name, entry in rows.column_types.items() if entry.get("stored_as") == "blob"]
    plain = {name: entry for name, entry in rows.column_types.items() if name not in blobs}
    table = rows.scan(rows.schema.names)
    findings = _check_schema(where, table.schema, plain)
    ids = table.column("sequence_id").to_pylist()
    if len(set(ids)) != len(ids):
        findings.append(f"{where}: duplicate sequence ids")
    findings += _check_lengths(where, table, plain)
    findings += _check_files(fs, root, where, table.drop_columns(blobs), plain)
    for name in blobs:
        entry = rows.column_types[name]
        for sequence_id, token, length in zip(ids, table.column(name).to_pylist(), table.column("length").to_pylist()):
            if token is None:
                if not entry.get("optional"):
                    findings.append(f"{where}: {sequence_id}: {name} has no video")
                continue
            try:
                with rows.video_file(sequence_id, name) as handle:
                    info = video.probe(handle)
            except (ConversionError, FormatError) as error:
                findings.append(f"{where}: {sequence_id}: {name}: {error}")
                continue
            findings += _check_video_info(f"{where} {name}", sequence_id, info,
                                          {**entry, **(entry.get("not_copied") or {}).get(sequence_id, {})})
            if info.frames != length:
                findings.append(f"{where}: {sequence_id}: {name} has {info.frames} frames, length is {length}")
    for key in ("num_sequences", "num_timesteps"):
        counted = len(ids) if key == "num_sequences" else sum(table.column("length").to_pylist())
        if rows.metadata.get(key) not in (None, counted):
            findings.append(f"{where}: {key} {rows.metadata[key]} in its metadata but the rows hold {counted}")
    return findings


def validate_table(fs, root: str, table_format: str, settings: TableSettings | None = None) -> list[str]:
    """A lake table (current snapshot): the `mixtrain` property, the rows against column_types (a
    trajectory's dimension, which the table's list<list<float>> does not keep, checked per row),
    the checks run on shards, and the files the rows reference (relative to the table location)."""
    settings = settings or TableSettings(format=table_format)
    url = storage.url_for(fs, root)
    where = f"{root} ({table_format} table, property {lake.PROPERTY!r})"
    try:
        value = lake.current_property(url, settings)
    except ValueError as error:  # the property's JSON (a FormatError, a table that cannot be read, passes on)
        raise FormatError(f"{where}: unreadable: {error}") from None
    if not isinstance(value, dict) or value.get("mixtrain") != mixtrain.VERSION:
        return [f"{where}: missing, or 'mixtrain' is not {mixtrain.VERSION!r}"]
    check_sidecar(value, where)
    column_types = value["column_types"]
    table = lake.read_rows(url, settings)
    findings: list[str] = []
    columns = []
    for name in table.column_names:
        column, expected = table.column(name), _expected_type(column_types.get(name, {}))
        if expected is not None and column.type != expected:
            try:
                column = column.cast(expected)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
                findings.append(f"{where}: column {name!r} does not fit column_types ({expected}): {str(error).splitlines()[0]}")
        columns.append(column)
    table = pa.Table.from_arrays(columns, names=table.column_names)
    findings += _check_schema(where, table.schema, column_types)
    ids = table.column("sequence_id").to_pylist() if "sequence_id" in table.column_names else []
    if len(set(ids)) != len(ids):
        findings.append(f"{where}: duplicate sequence_id values")
    findings += _check_lengths(where, table, column_types)
    findings += _check_files(fs, root, where, table, column_types)
    if value.get("num_sequences") not in (None, table.num_rows):
        findings.append(f"{where}: num_sequences {value['num_sequences']} but the table holds {table.num_rows}")
    timesteps = pc.sum(table.column("length")).as_py() if "length" in table.column_names else None
    if value.get("num_timesteps") not in (None, timesteps):
        findings.append(f"{where}: num_timesteps {value['num_timesteps']} but the table holds {timesteps}")
    findings += _check_stats_file(fs, root, value.get("stats"), "the mixtrain property")
    return findings


def _check_schema(path: str, schema: pa.Schema, column_types: dict) -> list[str]:
    findings = []
    if schema.names[:1] != ["sequence_id"]:
        findings.append(f"{path}: first column must be sequence_id, found {schema.names[:1]}")
    for name, entry in column_types.items():
        if schema.get_field_index(name) < 0:
            findings.append(f"{path}: column {name!r} is in column_types but not in the shard")
            continue
        expected = _expected_type(entry)
        actual = schema.field(name).type
        if expected is not None and actual != expected:
            findings.append(f"{path}: column {name!r} is {actual}, column_types says {expected}")
        if entry.get("type") == "steps" and not pa.types.is_list(actual):
            findings.append(f"{path}: per-step column {name!r} is {actual}, expected a list")
    return findings


def _check_lengths(path: str, table: pa.Table, column_types: dict) -> list[str]:
    findings = []
    if "length" not in table.column_names:
        return [f"{path}: no length column"]
    lengths = table.column("length").combine_chunks()
    for name, entry in column_types.items():
        # Every list column column_types describes is per step (trajectories, flags, agents...).
        if (entry.get("type") == "video" or entry.get("file_reference") or name not in table.column_names
                or not (pa.types.is_list(table.schema.field(name).type) or array_layout.is_bytes(entry))):
            continue
        cells = array_layout.cell_steps(table.column(name).combine_chunks(), entry)
        mismatch = pc.not_equal(cells, lengths)
        if pc.any(mismatch).as_py():
            row = pc.index(mismatch, True).as_py()
            sequence_id = table.column("sequence_id")[row].as_py()
            findings.append(f"{path}: {sequence_id}: column {name!r} has {cells[row].as_py()} steps, length is {lengths[row].as_py()}")
    return findings


def _check_files(fs, root: str, path: str, table: pa.Table, column_types: dict) -> list[str]:
    findings = []
    for name, entry in column_types.items():
        if not entry.get("file_reference") or name not in table.column_names:
            continue
        for sequence_id, cell in zip(table.column("sequence_id").to_pylist(), table.column(name).to_pylist()):
            for relative in cell if isinstance(cell, list) else [cell] if cell else []:
                _existing_file(fs, root, path, sequence_id, name, relative, findings)
    for name, entry in column_types.items():
        if entry.get("type") != "video" or name not in table.column_names:
            continue
        for sequence_id, relative, length in zip(table.column("sequence_id").to_pylist(),
                                                 table.column(name).to_pylist(), table.column("length").to_pylist()):
            if relative is None:
                if not entry.get("optional"):  # a camera some episodes lack says so in column_types
                    findings.append(f"{path}: {sequence_id}: {name} has no file (null path)")
                continue
            file_path = _existing_file(fs, root, path, sequence_id, name, relative, findings)
            if file_path is None:
                continue
            try:
                with storage.open_input(fs, file_path) as handle:
                    info = video.probe(handle)
                frames = info.frames
                findings += _check_video_info(file_path, sequence_id, info, {**entry, **(entry.get("not_copied") or {}).get(sequence_id, {})})
            except ConversionError as error:
                findings.append(f"{file_path}: {sequence_id}: {error}")
                continue
            if frames != length:
                findings.append(f"{file_path}: {sequence_id}: {frames} frames, length is {length}")
    return findings


def _existing_file(fs, root: str, shard: str, sequence_id: str, column: str, relative: str, findings: list[str]) -> str | None:
    """The file a row's cell names when it is inside the dataset and exists; otherwise a finding
    (appended to `findings`) and None."""
    try:
        file_path = cell_path(fs, root, relative, f"{column} file")
    except FormatError as error:
        findings.append(f"{shard}: {sequence_id}: {error}")
        return None
    if not fs.exists(file_path):
        findings.append(f"{shard}: {sequence_id}: {column} file {relative} is missing")
        return None
    return file_path


def _check_video_info(file_path: str, sequence_id: str, info: video.VideoInfo, entry: dict) -> list[str]:
    findings = []
    if entry.get("codec") and info.codec != entry["codec"]:
        findings.append(f"{file_path}: {sequence_id}: codec {info.codec}, column_types says {entry['codec']}")
    # An encode's pixel format is ours to state; a copy repeats the source's own metadata.
    if entry.get("written_as") == "encode" and entry.get("pix_fmt") and info.pix_fmt != entry["pix_fmt"]:
        findings.append(f"{file_path}: {sequence_id}: pixel format {info.pix_fmt}, column_types says {entry['pix_fmt']}")
    resolution = entry.get("resolution") or {}
    if resolution.get("width") and (info.width, info.height) != (resolution["width"], resolution["height"]):
        findings.append(f"{file_path}: {sequence_id}: {info.width}x{info.height}, column_types says "
                        f"{resolution['width']}x{resolution['height']}")
    return findings


def reach(url: str) -> None:
    """The dataset's store answers (`storage.open_reachable`), or one ConversionError naming the URL."""
    try:
        storage.open_reachable(url)
    except ConversionError:
        raise
    except (ImportError, ValueError) as error:  # a missing package (storage.MissingPackageError), an unknown protocol
        raise ConversionError(f"{url}: {error}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=command_name("validate"), description="Check a Mixtrain dataset.")
    parser.add_argument("dataset", help="Mixtrain dataset root (path or fsspec URL)")
    parser.add_argument("--deep", action="store_true", help="decode every video and compare it with the source")
    parser.add_argument("--source", default=None,
                        help="source dataset root for --deep (default: the URI in mixtrain.json when it is a path on this machine; "
                             "a URL there is fetched only when named here)")
    parser.add_argument("--min_psnr", type=float, default=35.0, help="lowest luma PSNR (dB) a lossy encode may have")
    parser.add_argument("--quality", action="store_true", help="also report the data-quality findings (docs/quality.md): those the "
                                                                "conversion recorded, or computed now from the rows")
    parser.add_argument("--recompute", action="store_true", help="with --quality: compute the findings from the rows even where the "
                                                                  "dataset records them (a received dataset's file is its author's word)")
    parser.add_argument("--fail_on", choices=("error", "warning"), default=None,
                        help="with --quality: exit 1 when a finding of this level (warning: or an error) is found (default error)")
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exit_:
        return 2 if exit_.code else 0
    for name in ("fail_on", "recompute"):
        if getattr(args, name) and not args.quality:
            print(f"error: --{name} has no effect without --quality", file=sys.stderr)
            return 2
    verdict = ""
    try:
        reach(args.dataset)  # an unreachable store: one line within seconds, not the client's retries and traceback
        if args.deep and args.source:
            reach(args.source)
        findings = validate(args.dataset)
        summary = deep_check(args.dataset, args.source, args.min_psnr) if args.deep and not findings else None
    except ConversionError as error:  # the dataset cannot be checked at all (its metadata unusable)
        print(f"error: {for_terminal(error)}", file=sys.stderr)
        return 1
    if summary is not None:
        deep_findings, summary = summary
        findings += deep_findings
        for line in summary:
            print(for_terminal(line))
        if summary == [NO_VIDEO]:
            verdict = " (deep: no video columns to compare)"
        elif summary and summary[0].endswith(NOT_COMPARED):
            verdict = " (deep: statistics and videos not compared with the source)"
        elif not any("not reachable" in line or "not fetched" in line for line in summary):
            verdict = " (deep: videos match the source)"
    for finding in findings:
        print(for_terminal(finding))
    if findings:
        print(f"{len(findings)} finding(s): {args.dataset} is not a valid Mixtrain dataset", file=sys.stderr)
        return 1
    print(f"ok: {args.dataset} is a valid Mixtrain dataset{verdict}")
    return _quality_verdict(args.dataset, args.fail_on or "error", args.recompute) if args.quality else 0


def _quality_verdict(url: str, fail_on: str, recompute: bool = False) -> int:
    """Print the data-quality summary; 1 when a finding at `fail_on` or above was found (for CI)."""
    from formats.mixtrain import quality
    from formats.read import reader, report

    try:
        found = report.quality_summary(reader.open_dataset(url), quality.Thresholds() if recompute else None)
    except ConversionError as error:
        print(f"error: {for_terminal(error)}", file=sys.stderr)
        return 1
    for line in report.quality_lines({"quality": found}):
        print(for_terminal(line))
    levels = (quality.ERROR,) if fail_on == quality.ERROR else (quality.ERROR, quality.WARNING)
    failing = sum(int(entry["findings"]) for entry in found["checks"].values() if entry["level"] in levels)
    if failing:
        print(f"quality: {failing} finding(s) at --fail_on={fail_on} or above in {url}", file=sys.stderr)
        return 1
    print(f"quality: no finding at --fail_on={fail_on} or above")
    return 0


def entry() -> None:
    """The process entry (`exit_without_teardown`: see why there)."""
    exit_without_teardown(main())


if __name__ == "__main__":
    entry()
