"""RLDS episodes read on a worker: a shard's record index (`Reader.expand`), then one record parsed
into a Sequence. The metadata side (dataset_info.json, features.json, the columns and the layout
that says how each column is filled) is formats/sources/rlds/__init__.py.

The shard's container is the dataset's `fileFormat`: TFRecord (`tfrecord.py`: records found by
scanning their headers, read by byte range) or ArrayRecord (`arrayrecord.py`: counted from the
footer, read by index). A `Container` gives the raw record bytes; everything after them (the
`tf.train.Example` parse, the columns) is one code path for both.
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from collections.abc import Iterator
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa

from formats import storage
from formats.errors import ConversionError, FormatError, in_context
from formats.sequence import DatasetMeta, ImageFrames, Sequence
from formats.sources import SourceReader, SourceRef
from formats.sources.rlds import arrayrecord, tfrecord

__all__ = ["RecordRef", "Reader", "expand_ref", "features_and_parser", "CONTAINERS", "Container"]


@dataclasses.dataclass(frozen=True)
class ShardRef(SourceRef):
    """One shard (a TFRecord or ArrayRecord file) of a split: expanded into RecordRefs on a worker."""

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
    """One episode: a record of a shard, by index (ArrayRecord) or byte range (TFRecord)."""

    split: str
    position: int
    index: int  # record index inside the shard
    path: str
    offset: int  # TFRecord: the record's data begins here; ArrayRecord: 0 (read by index)
    nbytes: int  # TFRecord: its length; ArrayRecord: 0
    sequence_id: str


class Container:
    """How a shard holds its records: the only part of reading that differs between fileFormats."""

    def index(self, fs: fsspec.AbstractFileSystem, path: str, cache: dict) -> list[tuple[int, int]]:
        """(offset, nbytes) for every record of the shard, in order (what RecordRef carries)."""
        raise NotImplementedError

    def read(self, fs: fsspec.AbstractFileSystem, path: str, ref: RecordRef, cache: dict) -> bytes:
        """The raw record `ref` addresses (checksums or hashes verified)."""
        raise NotImplementedError


class _TFRecord(Container):
    def index(self, fs, path, cache):
        with storage.open_input(fs, path) as handle:
            return list(tfrecord.scan(handle, fs.size(path)))

    def read(self, fs, path, ref, cache):
        with storage.open_input(fs, path) as handle:
            return tfrecord.read_record(handle, ref.offset, ref.nbytes)


class _ArrayRecord(Container):
    def index(self, fs, path, cache):
        return [(0, 0)] * arrayrecord.count(fs, path, cache)

    def read(self, fs, path, ref, cache):
        return arrayrecord.read_record(fs, path, ref.index, cache)


# dataset_info.json `fileFormat` -> its container (tensorflow_datasets/core/file_adapters.py FileFormat values).
CONTAINERS: dict[str, Container] = {"tfrecord": _TFRecord(), "array_record": _ArrayRecord()}


def features_and_parser(features_json: str):
    """The TFDS FeaturesDict and an ExampleParserNp for it (a reader builds it once per worker)."""
    from tensorflow_datasets.core import example_parser
    from tensorflow_datasets.core.features import feature as feature_lib

    features = feature_lib.FeatureConnector.from_json(json.loads(features_json))
    return features, example_parser.ExampleParserNp(features.get_serialized_info())


def expand_ref(fs: fsspec.AbstractFileSystem, root: str, ref: ShardRef, meta: DatasetMeta,
               cache: dict | None = None) -> Iterator[RecordRef]:
    """Index one shard into RecordRefs without reading its records: a TFRecord shard's record
    headers, an ArrayRecord shard's footer.

    Every error names the shard file (`error.file`): under --on_error=skip the record of a shard
    that cannot be indexed must say which unit failed, or --incremental would keep its fingerprint
    and never convert its episodes again."""
    path = storage.join(root, ref.path)
    try:
        path = storage.resolve_inside(root, ref.path, what="shard", fs=fs)
        records = _container(meta).index(fs, path, {} if cache is None else cache)
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


def _container(meta: DatasetMeta) -> Container:
    return CONTAINERS[meta.source.get("file_format", "tfrecord")]


class Reader(SourceReader):
    """Opened once per worker: the features are rebuilt into one example parser; the container
    keeps what it found about remote ArrayRecord shards (their footers) in `_shards`."""

    def __init__(self, fs: fsspec.AbstractFileSystem, root: str, meta: DatasetMeta):
        super().__init__(fs, root, meta)
        self._parser = None
        self._shards: dict = {}

    def expand(self, ref: ShardRef) -> Iterator[RecordRef]:
        return expand_ref(self.fs, self.root, ref, self.meta, self._shards)

    def load(self, ref: RecordRef) -> Sequence:
        if self._parser is None:
            _, self._parser = features_and_parser(json.dumps(self.meta.source["features"], sort_keys=True))
        return _load(self.fs, self.root, ref, self.meta, self._parser, self._shards)


def _load(fs, root: str, ref: RecordRef, meta: DatasetMeta, parser, cache: dict | None = None) -> Sequence:
    path = storage.resolve_inside(root, ref.path, what="shard", fs=fs)
    try:
        data = _container(meta).read(fs, path, ref, {} if cache is None else cache)
        try:
            example = parser.parse_example(data)
        except Exception as error:  # noqa: BLE001 - protobuf/numpy errors on a corrupt record
            raise FormatError(f"record {ref.index}: cannot parse tf.train.Example: {error}") from error
        try:
            return _to_sequence(example, ref, meta, path)
        except ConversionError:
            raise  # already worded (a FormatError is a ValueError: it was wrapped in a second message)
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
