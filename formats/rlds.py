"""RLDS reader: TFDS-prepared datasets of TFRecord shards, one episode per record, no TensorFlow.

Layout (a TFDS version directory, e.g. gs://gresearch/robotics/bridge/0.1.0):
  dataset_info.json   splits, each with `shardLengths` (records per shard) and `filepathTemplate`
                      (default "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"; never assumed)
  features.json       the TFDS FeaturesDict: `steps` (a Dataset of per-step features) and
                      episode-level features such as `episode_metadata`
  <files>             TFRecord shards of serialized `tf.train.Example`s

The features are rebuilt with tfds' own pure-Python FeatureConnector classes and each record is
parsed with tfds' `ExampleParserNp` (protobuf + numpy): TensorFlow is never imported. Images are
kept as their encoded JPEG/PNG bytes and go straight to the video encoder. TFRecord shards are not
splittable: `plan` yields one ShardRef per shard, `expand_ref` (on a worker) reads the shard's
record headers into RecordRefs, and `load` reads one record by its byte range.

Quirks handled: `tf.train.Example` has no float64 list, so tfds stores float64 tensors as float32
and the parser casts back (kept float64 here, with float32 precision, exactly as tfds returns
them); OXE datasets whose `is_last` is never true (truncated episodes: `truncated` column);
BGR-stored images (`bgr_cameras` option); an instruction that changes within an episode.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import zlib
from collections.abc import Iterator
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa

from formats import sources, storage, tfrecord
from formats.errors import ConversionError, FormatError, in_context
from formats.sequence import (
    FROM_IMAGES,
    SCALAR,
    ColumnSpec,
    DatasetMeta,
    ImageFrames,
    Sequence,
    base_columns,
    check_unique_columns,
    column_name,
)
from formats.source import Source, SourceOption, SourceReader, SourceRef

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


@dataclasses.dataclass(frozen=True)
class ShardRef(SourceRef):
    """One TFRecord shard of a split: expanded into RecordRefs on a worker."""

    split: str
    position: int  # in the split's shard list
    path: str  # relative to the root
    records: int | None  # from shardLengths, checked when the shard is read
    # The shard's share of its split's numBytes (sizes the output; not part of its identity: no repr).
    nbytes: float = dataclasses.field(default=0.0, repr=False)

    @property
    def sequence_id(self) -> None:
        return None  # a shard holds many episodes

    @property
    def sequence_count(self) -> int | None:
        """The episodes this shard holds, if dataset_info.json says (`sources.sequence_count`)."""
        return self.records

    @property
    def estimated_bytes(self) -> float:
        return self.nbytes

    @property
    def unit_key(self) -> str:
        return self.path

    @property
    def unit_files(self) -> tuple[str, ...]:
        return (self.path,)

    @property
    def unit_prefix(self) -> str:
        return f"{self.split}_{self.position:05d}_"


@dataclasses.dataclass(frozen=True)
class RecordRef(SourceRef):
    """One episode: a byte range of a shard."""

    split: str
    position: int
    index: int  # record index inside the shard
    path: str
    offset: int
    nbytes: int
    sequence_id: str


def detect(fs: fsspec.AbstractFileSystem, root: str) -> bool:
    return fs.exists(storage.join(root, "dataset_info.json")) and fs.exists(storage.join(root, "features.json"))


@functools.lru_cache(maxsize=8)
def _features(features_json: str):
    """The TFDS FeaturesDict and an ExampleParserNp for it; built once per worker."""
    from tensorflow_datasets.core import example_parser
    from tensorflow_datasets.core.features import feature as feature_lib

    features = feature_lib.FeatureConnector.from_json(json.loads(features_json))
    return features, example_parser.ExampleParserNp(features.get_serialized_info())


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
    if file_format != "tfrecord":
        raise FormatError(f"{info_path}: fileFormat {file_format!r} is not supported (only tfrecord)")
    try:
        features, _ = _features(json.dumps(features_json, sort_keys=True))
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
    check_unique_columns(columns)
    meta = DatasetMeta(
        format=FORMAT,
        uri=storage.url_for(fs, root),
        fps=float(fps),
        columns=columns,
        source={
            "format": FORMAT,
            "uri": storage.url_for(fs, root),
            "name": name,
            "version": info.get("version"),
            "description": info.get("description"),
            "citation": info.get("citation"),
            "splits": {split["name"]: [_count(n) for n in split.get("shardLengths", [])] for split in info.get("splits", [])},
            "selected_splits": splits,
            "fps": float(fps),
            "fps_source": "--fps" if options.get("fps") else "known Open X-Embodiment control rate",
            "features": features_json,
        },
        private={"layout": layout},  # how `load` fills each column: the reader's, not published
    )
    return meta, refs


def _count(value: Any) -> int | None:
    """A TFDS count (JSON integer, or the decimal string protobuf's JSON writes for int64)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def _check_info(info: dict, path: str) -> None:
    """The dataset_info.json fields this reader interprets, with their JSON types and plausible sizes."""
    if info.get("name") is not None and not isinstance(info["name"], str):
        raise FormatError(f"{path}: name must be a string, found {info['name']!r}")
    splits = info.get("splits", [])
    if not isinstance(splits, list) or not all(isinstance(split, dict) for split in splits):
        raise FormatError(f"{path}: splits must be a list of objects, found {splits!r}"[:300])
    for number, split in enumerate(splits):
        where = f"splits[{number}]"
        if not isinstance(split.get("name"), str) or not split["name"]:
            raise FormatError(f"{path}: {where} has no name")
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
            try:
                template.format(**{field: "0" for field in TEMPLATE_FIELDS})
            except KeyError as error:
                raise FormatError(f"{path}: {where}.filepathTemplate {template!r} has an unknown placeholder {error.args[0]!r} "
                                  f"(known: {', '.join(TEMPLATE_FIELDS)})") from error
            except (ValueError, IndexError) as error:
                raise FormatError(f"{path}: {where}.filepathTemplate {template!r} is not a valid template: {error}") from error


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
        for position in range(count):
            file_name = template.format(
                DATASET=name, SPLIT=split["name"], FILEFORMAT=info.get("fileFormat", "tfrecord"),
                SHARD_INDEX=f"{position:05d}", NUM_SHARDS=f"{count:05d}", SHARD_X_OF_Y=f"{position:05d}-of-{count:05d}",
            )
            try:
                shard_path = storage.resolve_inside(root, file_name, what="shard", fs=fs)
            except FormatError as error:
                raise in_context(error, file=info_path, sequence=f"split {split['name']!r} shard {position}") from error
            found = fs.exists(shard_path) if "/" in file_name else file_name in present
            if not found:
                raise FormatError(f"{storage.join(root, file_name)}: shard {position} of split {split['name']!r} not found "
                                  f"(from filepathTemplate {template!r})")
            refs.append(ShardRef(split["name"], position, file_name, lengths[position] if lengths else None,
                                 float(_count(split.get("numBytes", 0))) / count))
    return refs


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


def expand_ref(fs: fsspec.AbstractFileSystem, root: str, ref: ShardRef, meta: DatasetMeta) -> Iterator[RecordRef]:
    """Index one shard: read its record headers (not the records) into RecordRefs.

    Every error names the shard file (`error.file`): under --on_error=skip the record of a shard
    that cannot be indexed must say which unit failed, or --incremental would keep its fingerprint
    and never convert its episodes again."""
    path = storage.join(root, ref.path)
    try:
        path = storage.resolve_inside(root, ref.path, what="shard", fs=fs)
        size = fs.size(path)
        with storage.open_input(fs, path) as handle:
            records = list(tfrecord.scan(handle, size))
    except ConversionError as error:
        raise in_context(error, file=path, sequence=f"{ref.split} shard {ref.position}") from error
    except OSError as error:
        raise in_context(FormatError(f"{path}: cannot read shard: {error}"), file=path) from error
    if ref.records is not None and len(records) != ref.records:
        raise in_context(FormatError(f"{path}: {len(records)} records, dataset_info.json shardLengths says {ref.records}"), file=path)
    for index, (offset, nbytes) in enumerate(records):
        yield RecordRef(ref.split, ref.position, index, ref.path, offset, nbytes, f"{ref.split}_{ref.position:05d}_{index:06d}")


def _flatten(values: dict, prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}/"))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def load(fs: fsspec.AbstractFileSystem, root: str, ref: RecordRef, meta: DatasetMeta) -> Sequence:
    """Read and parse one record (one episode) into a Sequence; images stay encoded."""
    return Reader(fs, root, meta).load(ref)


class Reader(SourceReader):
    """Opened once per worker: the features are rebuilt into one example parser."""

    def __init__(self, fs: fsspec.AbstractFileSystem, root: str, meta: DatasetMeta):
        super().__init__(fs, root, meta)
        self._parser = None

    def expand(self, ref: ShardRef) -> Iterator[RecordRef]:
        return expand_ref(self.fs, self.root, ref, self.meta)

    def load(self, ref: RecordRef) -> Sequence:
        if self._parser is None:
            _, self._parser = _features(json.dumps(self.meta.source["features"], sort_keys=True))
        return _load(self.fs, self.root, ref, self.meta, self._parser)


def _load(fs, root: str, ref: RecordRef, meta: DatasetMeta, parser) -> Sequence:
    path = storage.resolve_inside(root, ref.path, what="shard", fs=fs)
    try:
        with storage.open_input(fs, path) as handle:
            data = tfrecord.read_record(handle, ref.offset, ref.nbytes)
        try:
            example = parser.parse_example(data)
        except Exception as error:  # noqa: BLE001 - protobuf/numpy errors on a corrupt record
            raise FormatError(f"record {ref.index}: cannot parse tf.train.Example: {error}") from error
        try:
            return _to_sequence(example, ref, meta, path)
        except (zlib.error, ValueError, TypeError, KeyError) as error:
            raise FormatError(f"record {ref.index}: features do not match features.json ({type(error).__name__}: {error})") from error
    except ConversionError as error:
        raise in_context(error, file=path, sequence=ref.sequence_id) from error


def _to_sequence(example: dict, ref: RecordRef, meta: DatasetMeta, path: str) -> Sequence:
    steps = _flatten(example.get("steps", {}))
    episode = _flatten({k: v for k, v in example.items() if k != "steps"})
    lengths = {key: len(value) for key, value in steps.items()}
    if not lengths:
        raise FormatError(f"record {ref.index}: no steps")
    length = next(iter(lengths.values()))
    uneven = {key: n for key, n in lengths.items() if n != length}
    if uneven:
        raise FormatError(f"record {ref.index}: step features disagree on the episode length: {dict(list(lengths.items())[:3])} ...")
    if length == 0:
        raise FormatError(f"record {ref.index}: episode has no steps")
    fps = meta.fps
    sequence = Sequence(ref.sequence_id, length, np.arange(length, dtype=np.float64) / fps)
    sequence.scalars.update(length=length, duration_seconds=length / fps, split=ref.split)
    layout = meta.private["layout"]
    for spec in meta.columns:
        entry = layout.get(spec.name)
        if entry is None:
            continue
        kind = entry["kind"]
        if kind == "image":
            sequence.videos[spec.name] = _images(steps[entry["path"]], entry["bgr"], path)
        elif kind == "numeric":
            values = _numeric(steps[entry["path"]], entry, length, ref)
            if spec.kind == "trajectory":
                sequence.trajectories[spec.name] = values.reshape(length, entry["dim"])
            else:
                sequence.steps[spec.name] = values.reshape(length)
        elif kind == "text":
            sequence.steps[spec.name] = pa.array(_texts(steps[entry["path"]]), pa.string())
        elif kind == "instruction":
            texts = _code_texts(steps[entry["path"]], length) if entry.get("codes") else _texts(steps[entry["path"]])
            constant = all(text == texts[0] for text in texts)
            sequence.scalars["task"] = texts[0] if constant else None
            sequence.steps[spec.name] = None if constant else pa.array(texts, pa.string())
        elif kind == "episode_text":
            value = episode.get(entry["path"])
            sequence.scalars[spec.name] = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        elif kind == "episode_value":
            raw = episode.get(entry["path"])
            if entry.get("encoding") in ("zlib", "bytes"):
                raw = _numeric([raw], entry, 1, ref)
            value = np.asarray(raw)
            sequence.scalars[spec.name] = value.item() if value.ndim == 0 else value.reshape(-1).tolist()
    if "is_last" in steps and any(spec.name == "truncated" for spec in meta.columns):
        is_last = np.asarray(steps["is_last"]).astype(bool)
        terminal = bool(np.asarray(steps["is_terminal"])[-1]) if "is_terminal" in steps else False
        sequence.scalars["truncated"] = not (is_last.any() and terminal)
    return sequence


def _code_texts(values, length: int) -> list[str]:
    codes = np.asarray(values).reshape(length, -1)
    return [bytes(row[row != 0].astype(np.uint8)).decode("utf-8", "replace") for row in codes]


def _texts(values) -> list[str]:
    return [value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value) for value in values]


def _numeric(values, entry: dict, length: int, ref: RecordRef) -> np.ndarray:
    dtype = np.dtype(entry["dtype"])
    if entry.get("encoding") in ("zlib", "bytes"):
        shape = tuple(entry["shape"])
        decoded = []
        for step, blob in enumerate(values):
            raw = _inflate(blob, int(np.prod(shape)) * dtype.itemsize, f"record {ref.index}: steps/{entry['path']} step {step}") \
                if entry["encoding"] == "zlib" else blob
            array = np.frombuffer(raw, dtype)
            if array.size != int(np.prod(shape)):
                raise FormatError(f"record {ref.index}: steps/{entry['path']} step {step} holds {array.size} values, "
                                  f"shape {list(shape)} needs {int(np.prod(shape))}")
            decoded.append(array)
        return np.stack(decoded).astype(dtype, copy=False)
    array = np.asarray(values)
    expected = length * int(np.prod(entry.get("shape") or [1]))
    if array.size != expected:
        raise FormatError(f"record {ref.index}: steps/{entry['path']} holds {array.size} values, expected {expected}")
    return np.ascontiguousarray(array.astype(dtype, copy=False))


def _inflate(blob: bytes, expected: int, where: str) -> bytes:
    """zlib-decode a tensor stored with `encoding="zlib"`, never past one byte more than its shape
    needs: a few kB that inflate to gigabytes are refused, not decoded."""
    stream = zlib.decompressobj()
    raw = stream.decompress(blob, expected + 1)
    if len(raw) > expected:
        raise FormatError(f"{where} inflates to more than the {expected} bytes its shape needs")
    if not stream.eof:
        raise FormatError(f"{where}: zlib stream ends early ({len(raw)} bytes)")
    return raw


def _images(values, bgr: bool, path: str) -> ImageFrames:
    frames = list(values)
    if bgr:
        from formats import video

        decoder = video.ImageDecoder()
        frames = [np.ascontiguousarray(decoder.decode(blob, i).to_ndarray(format="rgb24")[..., ::-1]) for i, blob in enumerate(frames)]
    return ImageFrames(frames, source=path)


def _split_names(value: str) -> list[str]:
    return [name for name in value.split(",") if name]


def _rate(value: float | None) -> float | None:
    return value or None


class RLDS(Source):
    id = FORMAT
    expects = "RLDS a TFDS version folder with dataset_info.json and features.json"
    options = (SourceOption("split", "splits", _split_names), SourceOption("fps", "fps", _rate),
               SourceOption("bgr_cameras", "bgr_cameras", _split_names))
    expands_refs = True
    shared_files = ("features.json",)

    def detect(self, fs: fsspec.AbstractFileSystem, root: str) -> bool:
        return detect(fs, root)

    def plan(self, fs: fsspec.AbstractFileSystem, root: str, options: dict) -> tuple[DatasetMeta, list[ShardRef]]:
        return plan(fs, root, options)

    def open(self, fs: fsspec.AbstractFileSystem, root: str, meta: DatasetMeta) -> Reader:
        return Reader(fs, root, meta)


SOURCE = sources.register(RLDS())
