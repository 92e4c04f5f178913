"""RLDS reader: TFDS-prepared datasets of TFRecord or ArrayRecord shards, one episode per record, no TensorFlow.

Layout (a TFDS version directory, e.g. gs://gresearch/robotics/bridge/0.1.0):
  dataset_info.json   `fileFormat` ("tfrecord", the default, or "array_record"), splits, each with
                      `shardLengths` (records per shard) and `filepathTemplate`
                      (default "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"; never assumed)
  features.json       the TFDS FeaturesDict: `steps` (a Dataset of per-step features) and
                      episode-level features such as `episode_metadata`
  <files>             shards of serialized `tf.train.Example`s, in the container `fileFormat` names

The features are rebuilt with tfds' own pure-Python FeatureConnector classes and each record is
parsed with tfds' `ExampleParserNp` (protobuf + numpy): TensorFlow is never imported. Images are
kept as their encoded JPEG/PNG bytes and go straight to the video encoder. `plan` yields one
ShardRef per shard, the reader's `expand` (on a worker) indexes the shard into RecordRefs (a TFRecord
shard's record headers; an ArrayRecord shard's footer), and `load` reads one record (by byte range;
by index) and parses it the same way whatever the container (records.py).

Quirks handled: `tf.train.Example` has no float64 list, so tfds stores float64 tensors as float32
and the parser casts back (kept float64 here, with float32 precision, exactly as tfds returns
them); OXE datasets whose `is_last` is never true (truncated episodes: `truncated` column);
BGR-stored images (`bgr_cameras` option); an instruction that changes within an episode.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa

from formats import sources, storage
from formats.errors import FormatError, in_context
from formats.sequence import (
    FROM_IMAGES,
    SCALAR,
    ColumnSpec,
    DatasetMeta,
    Sequence,
    base_columns,
    check_unique_columns,
    column_name,
    int64_text,
    is_int,
    path_component,
    quoted,
)
from formats.sources import Source, SourceOption
from formats.sources.rlds.records import CONTAINERS, Reader, RecordRef, ShardRef, expand_ref, features_and_parser

__all__ = ["FORMAT", "ShardRef", "RecordRef", "detect", "plan", "expand_ref", "load", "KNOWN_FPS"]

FORMAT = "rlds"
DEFAULT_TEMPLATE = "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"
TEMPLATE_FIELDS = ("DATASET", "SPLIT", "FILEFORMAT", "SHARD_INDEX", "NUM_SHARDS", "SHARD_X_OF_Y")
# Sizes no real dataset has (a corrupt dataset_info.json / features.json), refused at plan.
MAX_SHARDS = 10**6
MAX_RECORDS_PER_SHARD = 10**9
MAX_VALUES_PER_STEP = 10**8
INSTRUCTION_KEYS = ("language_instruction", "natural_language_instruction", "instruction")
# Control rates of Open X-Embodiment datasets (Hz), from the "Control Frequency" column of the
# OXE dataset overview (https://robotics-transformer-x.github.io/, "Dataset Overview" sheet);
# RT-1 (fractal) is 3 Hz per the RT-1 paper. Anything else needs --fps.
KNOWN_FPS = {
    "fractal20220817_data": 3.0,
    "bridge": 5.0,
    "bridge_dataset": 5.0,
    "bridge_data_v2": 5.0,
    "droid": 15.0,
    "taco_play": 15.0,
    "jaco_play": 10.0,
    "toto": 30.0,
    "language_table": 10.0,
    "stanford_hydra_dataset_converted_externally_to_rlds": 10.0,
    "robo_net": 1.0,
    "stanford_robocook_converted_externally_to_rlds": 5.0,
    "cmu_play_fusion": 5.0,
    "cmu_stretch": 10.0,
}


def detect(fs: fsspec.AbstractFileSystem, root: str) -> bool:
    return fs.exists(storage.join(root, "dataset_info.json")) and fs.exists(storage.join(root, "features.json"))


def _leaves(feature, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(path, feature) for every leaf of nested FeaturesDicts, paths joined with '/', keys sorted
    at every level: a FeaturesDict rebuilt from features.json iterates a protobuf map, whose order
    changes with PYTHONHASHSEED (and with it the column order, the bytes, --incremental reuse)."""
    import tensorflow_datasets.core.features as tff

    if isinstance(feature, tff.FeaturesDict):
        for key in sorted(feature.keys()):
            yield from _leaves(feature[key], f"{prefix}{key}/")
    else:
        yield prefix.rstrip("/"), feature


def _instruction_path(step_leaves: list) -> str | None:
    """The step feature holding the language instruction: a known name, top level first."""
    for key in INSTRUCTION_KEYS:
        for path, feature in sorted(step_leaves, key=lambda leaf: leaf[0].count("/")):
            if path.rsplit("/", 1)[-1] == key and (_kind(feature) == "text" or (
                    _kind(feature) == "tensor" and np.dtype(feature.np_dtype).kind in "iu" and len(feature.shape) == 1)):
                return path
    return None


def _kind(feature) -> str:
    import tensorflow_datasets.core.features as tff

    if isinstance(feature, tff.Image):
        return "image"
    if isinstance(feature, tff.Text):
        return "text"
    if isinstance(feature, tff.Tensor) and np.dtype(feature.np_dtype).kind in "OSU" and tuple(feature.shape) == ():
        return "text"  # a scalar string Tensor (taco_play, fractal ... store instructions so)
    if isinstance(feature, tff.ClassLabel):
        return "label"
    if isinstance(feature, tff.Dataset):
        return "dataset"
    if isinstance(feature, tff.Tensor):
        return "tensor"
    return type(feature).__name__


def plan(fs: fsspec.AbstractFileSystem, root: str, options: dict | None = None) -> tuple[DatasetMeta, list[ShardRef]]:
    """Read dataset_info.json and features.json; one ShardRef per shard of the selected splits."""
    options = options or {}
    info_path, features_path = storage.join(root, "dataset_info.json"), storage.join(root, "features.json")
    missing = "not found; an RLDS dataset root (a TFDS version folder) has dataset_info.json and features.json"
    info_path = storage.resolve_inside(root, "dataset_info.json", what="metadata file", fs=fs)
    features_path = storage.resolve_inside(root, "features.json", what="metadata file", fs=fs)
    info = storage.read_json(fs, info_path, missing=missing)
    features_json = storage.read_json(fs, features_path, missing=missing)
    _check_info(info, info_path)
    name = info.get("name") or root.rstrip("/").split("/")[-2]
    file_format = info.get("fileFormat", "tfrecord")
    if file_format not in CONTAINERS:
        raise FormatError(f"{info_path}: fileFormat {file_format!r} is not supported (only {' and '.join(CONTAINERS)})"[:300])
    try:
        features, _ = features_and_parser(json.dumps(features_json, sort_keys=True))
    except Exception as error:  # noqa: BLE001 - tfds raises many kinds on a bad features.json
        raise FormatError(f"{features_path}: not a TFDS FeaturesDict: {error}") from error
    fps = options.get("fps") or KNOWN_FPS.get(name)
    if not fps:
        raise FormatError(f"{info_path}: {name!r}: RLDS does not record a frame rate and {name!r} is not in the table of "
                          "known Open X-Embodiment control rates; pass --fps=<Hz>")
    splits = _splits(info, info_path, options.get("splits"))
    refs = _shard_refs(fs, root, info, info_path, name, splits)
    bgr = set(options.get("bgr_cameras") or ())
    columns, layout = _columns(features, features_path, float(fps), bgr)
    check_unique_columns(columns, features_path)
    meta = DatasetMeta.planned(
        FORMAT, storage.url_for(fs, root), float(fps), columns,
        {
            "name": name,
            "version": info.get("version"),
            "description": info.get("description"),
            "citation": info.get("citation"),
            "splits": {split["name"]: [_count(n) for n in split.get("shardLengths", [])] for split in info.get("splits", [])},
            "selected_splits": splits,
            "fps": float(fps),
            "fps_source": "--fps" if options.get("fps") else "known Open X-Embodiment control rate",
            "file_format": file_format,  # the shards' container: the reader picks its Container by it
            "features": features_json,
        },
        private={"layout": layout},  # how `load` fills each column: the reader's, not published
    )
    return meta, refs


def _count(value: Any) -> int | None:
    """A TFDS count (JSON integer, or the decimal string protobuf's JSON writes for int64); None
    for anything else, a negative count and one past int64 included (JSON integers have no size,
    and 10**400 bytes overflowed the float a shard's size estimate is)."""
    if isinstance(value, str):
        return int64_text(value)
    return value if is_int(value) and 0 <= value < 1 << 63 else None


def _check_info(info: dict, path: str) -> None:
    """The dataset_info.json fields this reader interprets, with their JSON types and plausible sizes."""
    for key in ("name", "fileFormat"):
        if info.get(key) is not None and not isinstance(info[key], str):
            raise FormatError(f"{path}: {key} must be a string, found {info[key]!r}"[:300])
    splits = info.get("splits", [])
    if not isinstance(splits, list) or not all(isinstance(split, dict) for split in splits):
        raise FormatError(f"{path}: splits must be a list of objects, found {splits!r}"[:300])
    for number, split in enumerate(splits):
        where = f"splits[{number}]"
        if not isinstance(split.get("name"), str) or not split["name"]:
            raise FormatError(f"{path}: {where} has no name")
        try:  # the split begins every sequence id, which names the sequence's files
            path_component(split["name"], f"{where}.name")
        except FormatError as error:
            raise FormatError(f"{path}: {error}") from None
        if any(other.get("name") == split["name"] for other in splits[:number]):
            raise FormatError(f"{path}: {where}.name {split['name']!r} names an earlier split too (its sequence ids would repeat)")
        lengths = split.get("shardLengths")
        if lengths is not None:
            counts = [_count(n) for n in lengths] if isinstance(lengths, list) else [None]
            if None in counts or any(n < 0 for n in counts):
                raise FormatError(f"{path}: {where}.shardLengths must be a list of non-negative integers, found {lengths!r}"[:300])
            if len(counts) > MAX_SHARDS or any(n > MAX_RECORDS_PER_SHARD for n in counts):
                raise FormatError(f"{path}: {where}.shardLengths ({len(counts)} shards, up to {max(counts, default=0)} records) "
                                  f"is not plausible (at most {MAX_SHARDS:.0e} shards of {MAX_RECORDS_PER_SHARD:.0e} records)")
        for key, limit in (("numShards", MAX_SHARDS), ("numBytes", None)):
            if split.get(key) is None:
                continue
            count = _count(split[key])
            if count is None:
                raise FormatError(f"{path}: {where}.{key} must be a non-negative integer, found {split[key]!r}")
            if limit is not None and count > limit:
                raise FormatError(f"{path}: {where}.{key} {count} is not plausible (more than {limit:.0e})")
        template = split.get("filepathTemplate")
        if template is not None:
            if not isinstance(template, str):
                raise FormatError(f"{path}: {where}.filepathTemplate must be a string, found {template!r}")
            if (problem := storage.template_problem(template)) is not None:
                raise FormatError(f"{path}: {where}.filepathTemplate {quoted(template)} is not a valid template: {problem}")
            try:
                template.format(**{field: "0" for field in TEMPLATE_FIELDS})
            except KeyError as error:
                raise FormatError(f"{path}: {where}.filepathTemplate {template!r} has an unknown placeholder {error.args[0]!r} "
                                  f"(known: {', '.join(TEMPLATE_FIELDS)})") from error
            except (ValueError, IndexError, AttributeError, TypeError) as error:  # "{split.LIFE}": an attribute of a str
                raise FormatError(f"{path}: {where}.filepathTemplate {quoted(template)} is not a valid template: {error}") from error


def _splits(info: dict, info_path: str, wanted) -> list[str]:
    available = [split.get("name") for split in info.get("splits", [])]
    if not available:
        raise FormatError(f"{info_path}: no splits")
    if not wanted:
        return available
    unknown = [split for split in wanted if split not in available]
    if unknown:
        raise FormatError(f"{info_path}: split(s) {unknown} not in the dataset (it has {available})")
    return list(wanted)


def _shard_refs(fs, root: str, info: dict, info_path: str, name: str, splits: list[str]) -> list[ShardRef]:
    present = {entry.rstrip("/").rsplit("/", 1)[-1] for entry in fs.ls(root, detail=False)}
    refs = []
    for split in info["splits"]:
        if split.get("name") not in splits:
            continue
        lengths = [_count(n) for n in split.get("shardLengths") or []]
        count = len(lengths) or _count(split.get("numShards", 0))
        if not count:
            raise FormatError(f"{info_path}: split {split['name']!r} lists no shards (shardLengths)")
        template = split.get("filepathTemplate") or DEFAULT_TEMPLATE
        digits = max(5, len(str(count)))  # tfds naming._num_digits_needed
        for position in range(count):
            file_name = template.format(
                DATASET=name, SPLIT=split["name"], FILEFORMAT=info.get("fileFormat", "tfrecord"),
                SHARD_INDEX=f"{position:0{digits}d}", NUM_SHARDS=f"{count:0{digits}d}",
                SHARD_X_OF_Y=f"{position:0{digits}d}-of-{count:0{digits}d}",
            )
            try:
                shard_path = storage.resolve_inside(root, file_name, what="shard", fs=fs)
            except FormatError as error:
                raise in_context(error, file=info_path, sequence=f"split {split['name']!r} shard {position}") from error
            found = fs.exists(shard_path) if "/" in file_name else file_name in present
            if not found:
                raise FormatError(f"{storage.join(root, file_name)}: shard {position} of split {split['name']!r} not found "
                                  f"(from filepathTemplate {template!r}){_other_container(fs, root, info, file_name, present)}")
            refs.append(ShardRef(split["name"], position, file_name, lengths[position] if lengths else None,
                                 float(_count(split.get("numBytes") or 0)) / count))  # null: unknown, as _check_info reads it
    return refs


def _other_container(fs, root: str, info: dict, file_name: str, present: set) -> str:
    """A hint when the missing shard exists in the other container: dataset_info.json's fileFormat
    (and so the file names) disagree with the files, which are not guessed at."""
    file_format = info.get("fileFormat", "tfrecord")
    for other in CONTAINERS:
        if other == file_format or f".{file_format}" not in file_name:
            continue
        candidate = file_name.replace(f".{file_format}", f".{other}", 1)
        if (fs.exists(storage.join(root, candidate)) if "/" in candidate else candidate in present):
            return f"; {candidate} exists, but dataset_info.json says fileFormat {file_format!r}"
    return ""


def _columns(features, features_path: str, fps: float, bgr: set) -> tuple[list[ColumnSpec], dict]:
    """Output columns, and `layout`: column -> how load() fills it (kind, source path, details)."""
    import tensorflow_datasets.core.features as tff

    if "steps" not in features.keys() or not isinstance(features["steps"], tff.Dataset):
        raise FormatError(f"{features_path}: no 'steps' Dataset feature: not an RLDS dataset")
    columns = base_columns() + [ColumnSpec("split", SCALAR, pa.string())]
    layout: dict[str, dict] = {}
    bgr_found: set = set()
    step_leaves = list(_leaves(features["steps"].feature))
    instruction = _instruction_path(step_leaves)
    if instruction:
        columns.append(ColumnSpec("task", SCALAR, pa.string(), {"source": instruction}))
    if "is_last" in {path for path, _ in step_leaves}:
        columns.append(ColumnSpec("truncated", SCALAR, pa.bool_(),
                                  {"description": "the episode did not end in a terminal state: is_last never set, "
                                                  "or the last step is not is_terminal (RLDS)"}))
    for path, feature in step_leaves:
        kind = _kind(feature)
        source = path
        if kind == "image":
            name = column_name(path, camera=True)
            height, width = feature.shape[0], feature.shape[1]
            channels = feature.shape[2] if len(feature.shape) > 2 else 1
            deep = np.dtype(feature.np_dtype).itemsize > 1
            asked = name in bgr or path in bgr
            if asked and (deep or channels != 3):
                raise FormatError(f"{features_path}: --bgr_cameras names {path!r}, which is not an 8-bit colour camera")
            swap = asked or ("all" in bgr and not deep and channels == 3)
            bgr_found.update({name, path} & bgr)
            pix_fmt = ("gray16le" if deep else "gray") if channels == 1 else ("rgb48le" if deep else "rgb24")
            columns.append(ColumnSpec(name, "video", pa.string(), {
                "fps": fps, "resolution": {"width": width, "height": height}, "pix_fmt": pix_fmt,
                "is_depth_map": deep or "depth" in path, "source": source, "encoded_from": FROM_IMAGES,
                "image_format": getattr(feature, "_encoding_format", None),
                "channel_order": "bgr (swapped to rgb)" if swap else "rgb",
            }))
            layout[name] = {"kind": "image", "path": path, "bgr": swap}
        elif path == instruction and kind == "tensor":  # language_table: UTF-8 codes in an int tensor
            name = column_name(path)
            columns.append(ColumnSpec.steps(name, pa.string(), source=source, encoding="utf-8 codes decoded to text",
                                            description="per step, only where it changes within the episode (else see task)"))
            layout[name] = {"kind": "instruction", "path": path, "codes": True}
        elif kind == "text":
            name = column_name(path)
            columns.append(ColumnSpec.steps(name, pa.string(), source=source,
                                            **({"description": "per step, only where it changes within the episode (else see task)"}
                                               if path == instruction else {})))
            layout[name] = {"kind": "instruction" if path == instruction else "text", "path": path}
        elif kind == "label":
            name = column_name(path)
            columns.append(ColumnSpec.steps(name, pa.int64(), source=source, names=list(feature.names)))
            layout[name] = {"kind": "numeric", "path": path, "dtype": "int64"}
        elif kind == "tensor":
            name = column_name(path)
            shape = tuple(feature.shape)
            dtype = np.dtype(feature.np_dtype)
            encoding = str(getattr(feature, "_encoding", "none")).lower().rsplit(".", 1)[-1]
            if any(d is None or d < 0 for d in shape):
                raise FormatError(f"{features_path}: steps/{path} has shape {list(shape)} with unknown dimensions "
                                  "(ragged per step), which this version does not convert")
            if dtype.kind in "OSU":
                raise FormatError(f"{features_path}: steps/{path} is a string tensor of shape {list(shape)}; not supported")
            _check_values(shape, f"steps/{path}", features_path)
            entry = {"kind": "numeric", "path": path, "dtype": dtype.name, "shape": list(shape), "encoding": encoding}
            meta = {"source": source, "description": getattr(feature, "_doc", None) and feature._doc.desc}
            meta = {k: v for k, v in meta.items() if v}
            if shape == ():
                columns.append(ColumnSpec.steps(name, pa.from_numpy_dtype(dtype), **meta))
            else:
                dim = int(np.prod(shape))
                if len(shape) > 1:
                    meta["shape"] = list(shape)
                columns.append(ColumnSpec.trajectory(name, dtype, dim, **meta))
                entry["dim"] = dim
            layout[name] = entry
        else:
            raise FormatError(f"{features_path}: steps/{path} is a {type(feature).__name__} feature, which this version does not convert")
    unknown = bgr - bgr_found - {"all"}
    if unknown:
        cameras = [spec.name for spec in columns if spec.kind == "video"]
        raise FormatError(f"{features_path}: --bgr_cameras names {sorted(unknown)}, which are not cameras (cameras: {cameras})")
    for key in sorted(features.keys()):  # sorted: see _leaves
        if key == "steps":
            continue
        for path, feature in _leaves(features[key], f"{key}/"):
            name = column_name(path)
            kind = _kind(feature)
            if kind == "text":
                columns.append(ColumnSpec(name, SCALAR, pa.string(), {"source": path}))
                layout[name] = {"kind": "episode_text", "path": path}
            elif kind in ("tensor", "label"):
                dtype = np.dtype("int64" if kind == "label" else feature.np_dtype)
                shape = tuple(feature.shape)
                if dtype.kind in "OSU" or any(d is None or d < 0 for d in shape):
                    raise FormatError(f"{features_path}: {path} is a {dtype.name} tensor of shape {list(shape)}; "
                                      "only fixed-shape numeric episode tensors are converted")
                _check_values(shape, path, features_path)
                arrow = pa.from_numpy_dtype(dtype) if shape == () else pa.list_(pa.from_numpy_dtype(dtype))
                columns.append(ColumnSpec(name, SCALAR, arrow, {"source": path, **({"shape": list(shape)} if shape else {})}))
                encoding = str(getattr(feature, "_encoding", "none")).lower().rsplit(".", 1)[-1]
                layout[name] = {"kind": "episode_value", "path": path, "dtype": dtype.name, "shape": list(shape), "encoding": encoding}
            else:
                raise FormatError(f"{features_path}: {path} is a {type(feature).__name__} episode feature, which this version does not convert")
    return columns, layout


def _check_values(shape: tuple, path: str, features_path: str) -> None:
    values = math.prod(int(d) for d in shape)
    if values > MAX_VALUES_PER_STEP:
        raise FormatError(f"{features_path}: {path} has shape {list(shape)}: {values} values a step is not plausible "
                          f"(more than {MAX_VALUES_PER_STEP:.0e})")


def load(fs: fsspec.AbstractFileSystem, root: str, ref: RecordRef, meta: DatasetMeta) -> Sequence:
    """Read and parse one record (one episode) into a Sequence; images stay encoded."""
    return Reader(fs, root, meta).load(ref)


def _split_names(value: str) -> list[str]:
    return [name for name in value.split(",") if name]


def _rate(value: float | None) -> float | None:
    return value or None


class RLDS(Source):
    id = FORMAT
    expects = "RLDS a TFDS version folder with dataset_info.json and features.json"
    marker = "dataset_info.json"
    options = (SourceOption("split", "splits", _split_names), SourceOption("fps", "fps", _rate),
               SourceOption("bgr_cameras", "bgr_cameras", _split_names))
    expands_refs = True
    shared_files = ("features.json",)
    reader = Reader
    detect = staticmethod(detect)
    plan = staticmethod(plan)


SOURCE = sources.register(RLDS())
