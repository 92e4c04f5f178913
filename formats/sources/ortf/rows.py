"""ORTF episodes read on a worker: one episode's steps out of its chunk file, its camera segments,
audio and annotation files, as a Sequence. The metadata side (manifest, episode index, columns)
is formats/sources/ortf/__init__.py; this module only reads what a planned EpisodeRef points at. The reader keeps
the row groups of the steps file it decoded for the last episode (with an index of where each
episode_id's rows are), so episodes of one read group decode each row group once.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pyarrow as pa

from formats import storage
from formats.errors import ConversionError, FormatError, in_context
from formats.sequence import DatasetMeta, FileRef, Sequence, VideoSegment, rebased_timestamps
from formats.sources import SourceRef, parquet_rows

__all__ = ["Reader"]


@dataclasses.dataclass(frozen=True)
class Camera:
    column: str
    key: str  # the camera key in observation_space.images / video_files
    path: str
    fps: float
    npz: bool


@dataclasses.dataclass(frozen=True)
class EpisodeRef(SourceRef):
    position: int  # row of meta/episodes.parquet
    episode_id: str
    episode_key: Any  # episode_id as stored (string or integer), what steps.parquet is matched on
    sequence_id: str
    length: int
    steps_file: str
    start_step: int
    end_step: int
    chunk_base: int  # smallest start_step of the chunk's episodes (global numbering)
    cameras: tuple[Camera | None, ...]  # None: this episode has no file for that camera
    audio: str | None
    annotations: str | None  # annotations/episode_XXXXXX when the dataset has annotations
    scalars: tuple[tuple[str, Any], ...]

    @property
    def estimated_steps(self) -> int:
        return self.length

    @property
    def read_group(self) -> str:
        """The chunk's steps file: its episodes, loaded one after another, decode each row group once."""
        return self.steps_file

    @property
    def unit_files(self) -> tuple[str, ...]:
        files = [self.steps_file, *(camera.path for camera in self.cameras if camera is not None)]
        return tuple(files + [path for path in (self.audio, self.annotations) if path])


class Reader(parquet_rows.ParquetSourceReader):
    """Opened once per worker: a chunk's steps footer is read once for all its episodes, and the
    row groups decoded for one episode serve the next ones that live in them."""

    def load(self, ref: EpisodeRef) -> Sequence:
        fs, root, meta, footers, decoded = self.fs, self.root, self.meta, self.footers, self.decoded
        path = self.inside(ref.steps_file, "steps file")
        try:
            table = _episode_rows(fs, path, ref, footers, decoded)
            return _to_sequence(fs, root, table, ref, meta)
        except ConversionError as error:
            raise in_context(error, file=path, sequence=ref.sequence_id) from error
        except (OSError, pa.ArrowException) as error:
            raise FormatError(f"{path}: {ref.sequence_id}: cannot read steps: {error}") from error


def _episode_rows(fs, path: str, ref: EpisodeRef, footers: storage.ParquetFooters, decoded: parquet_rows.DecodedRowGroups) -> pa.Table:
    metadata = footers.footer(path)
    if not any(metadata.schema.column(i).path == "episode_id" for i in range(metadata.num_columns)):
        raise FormatError("steps have no episode_id column")
    starts = footers.memo(("row group starts", path), lambda: np.cumsum(
        [0] + [metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)]).tolist())
    groups = parquet_rows.row_groups_holding(footers, path, "episode_id", ref.episode_key, ref.episode_key)
    row_groups = decoded.get(path, metadata, None, groups, lambda missing: _decode(fs, path, metadata, missing, decoded))
    parts = []
    for group, row_group in zip(groups, row_groups):
        rows, part = row_group.episode_rows(ref)
        if len(rows):
            parts.append((starts[group] + rows, part))
    if not parts:
        raise FormatError(f"episode {ref.episode_id!r} has no steps in this file (its chunk_id points here)")
    table = pa.concat_tables([part for _, part in parts])
    if table.num_rows != ref.length:
        raise FormatError(f"episodes.parquet says {ref.length} steps, the steps file holds {table.num_rows} for this episode")
    positions = np.concatenate([rows for rows, _ in parts])
    first_row = int(positions[0])
    contiguous = int(positions[-1]) - first_row + 1 == len(positions)
    # Accepted readings of start_step: global step index, row of the chunk file, or 0 (per episode).
    if contiguous and ref.start_step not in (first_row, ref.chunk_base + first_row, 0):
        raise FormatError(f"start_step {ref.start_step} does not match the episode's rows (row {first_row} of the file)")
    return table


def _decode(fs, path: str, metadata, groups: list[int], opened: parquet_rows.DecodedRowGroups) -> dict[int, _StepsRowGroup]:
    """Decode `groups` of the steps file, every column (the file kept open for the next episodes)."""
    return {group: _StepsRowGroup(table) for group, table in parquet_rows.read_row_groups(fs, path, metadata, groups,
                                                                                          opened=opened).items()}


class _StepsRowGroup:
    """One decoded row group of a steps file, and where each episode_id's rows are in it."""

    def __init__(self, table: pa.Table):
        self.table = table
        self._runs: dict[bool, dict[Any, list[tuple[int, int]]]] = {}  # as stored / as text -> id -> [start, stop) runs

    def episode_rows(self, ref: EpisodeRef) -> tuple[np.ndarray, pa.Table]:
        """The rows whose episode_id is the episode's (positions in the row group, and the rows:
        a zero-copy slice when they are one run, as writers leave them); ids that cannot be
        compared with the stored type (integer against string ids) are compared as text."""
        column = self.table.column("episode_id")
        as_text = not _comparable(ref.episode_key, column.type)
        if as_text not in self._runs:
            self._runs[as_text] = _runs(column.cast(pa.string()) if as_text else column)
        runs = self._runs[as_text].get(ref.episode_id if as_text else ref.episode_key, [])
        if len(runs) == 1:
            start, stop = runs[0]
            return np.arange(start, stop), self.table.slice(start, stop - start)
        rows = np.concatenate([np.arange(start, stop) for start, stop in runs]) if runs else np.zeros(0, np.int64)
        return rows, self.table.take(pa.array(rows, pa.int64()))


def _runs(column: pa.ChunkedArray) -> dict[Any, list[tuple[int, int]]]:
    """id -> the [start, stop) runs of rows holding it, in row order (nulls hold no id)."""
    values = column.to_numpy(zero_copy_only=False) if column.null_count == 0 else np.array(column.to_pylist(), dtype=object)
    if len(values) == 0:
        return {}
    changes = (np.flatnonzero(values[1:] != values[:-1]) + 1).tolist()
    starts, stops = [0, *changes], [*changes, len(values)]
    runs: dict[Any, list[tuple[int, int]]] = {}
    for start, stop, key in zip(starts, stops, values[starts].tolist()):
        if key is not None:
            runs.setdefault(key, []).append((start, stop))
    return runs


def _comparable(value, other) -> bool:
    """Whether an episode_id and a Parquet value/type can be compared (int ids vs string ids)."""
    if isinstance(other, pa.DataType):
        return isinstance(value, int) == pa.types.is_integer(other)
    return isinstance(value, (int, np.integer)) == isinstance(other, (int, np.integer))


def _to_sequence(fs, root: str, table: pa.Table, ref: EpisodeRef, meta: DatasetMeta) -> Sequence:
    length = ref.length
    if "step_index" in table.column_names:
        steps = table.column("step_index").to_numpy()
        if not np.array_equal(steps, np.arange(length)):
            order = np.argsort(steps, kind="stable")
            if not np.array_equal(steps[order], np.arange(length)):
                raise FormatError(f"step_index is not 0..{length - 1}")
            table = table.take(pa.array(order))
    if "timestamp" in table.column_names:
        raw = table.column("timestamp").to_numpy(zero_copy_only=False).astype(np.float64)
        timestamp = rebased_timestamps(raw, meta.fps)
    else:
        raw = timestamp = np.arange(length, dtype=np.float64) / meta.fps
    sequence = Sequence(ref.sequence_id, length, timestamp)
    sequence.scalars.update(dict(ref.scalars))
    for spec in meta.columns:
        source = spec.meta.get("source")
        if spec.name == "timestamp_s":
            sequence.steps[spec.name] = raw
            continue
        if spec.kind == "trajectory":
            column = table.column(source).combine_chunks()
            values = column.flatten().to_numpy(zero_copy_only=False)
            if values.size != length * spec.meta["dim"]:
                raise FormatError(f"{source}: {values.size} values for {length} steps x {spec.meta['dim']}")
            sequence.trajectories[spec.name] = values.astype(spec.meta["dtype"], copy=False).reshape(length, spec.meta["dim"])
        elif spec.kind == "steps":
            column = table.column(source).combine_chunks()
            if column.type != spec.arrow_type.value_type:
                column = column.cast(spec.arrow_type.value_type)
            sequence.steps[spec.name] = column
    for camera in ref.cameras:
        if camera is None:
            continue
        sequence_item = _camera(table, camera, length, meta.fps, timestamp)
        if camera.npz:
            sequence.files[camera.column] = sequence_item
        else:
            sequence.videos[camera.column] = sequence_item
    if ref.audio:
        sequence.files["audio"] = FileRef(ref.audio)
    if ref.annotations:
        _annotations(fs, root, ref, sequence)
    return sequence


def _camera(table: pa.Table, camera: Camera, length: int, fps: float, timestamp: np.ndarray):
    if camera.npz:
        return FileRef(camera.path)
    key = f"observation.images.{camera.key}.frame_index"
    if key not in table.column_names:
        if camera.fps and camera.fps != fps:  # no frame_index: the frame presented at each step's time
            indices = np.floor(timestamp * camera.fps + 0.25).astype(np.int64)  # a quarter frame of clock jitter
            return VideoSegment(camera.path, length, frame_indices=tuple(int(i) for i in indices))
        return VideoSegment(camera.path, length)
    indices = table.column(key).to_numpy()
    if (indices < 0).any():
        raise FormatError(f"{key} has negative values")
    if np.array_equal(indices, np.arange(length)):
        return VideoSegment(camera.path, length)  # the file is the episode: a byte copy (frame count checked)
    first = int(indices[0])
    if np.array_equal(indices, np.arange(first, first + length)) and camera.fps in (0.0, fps):
        return VideoSegment(camera.path, length, start=first / fps, end=(first + length) / fps)
    return VideoSegment(camera.path, length, frame_indices=tuple(int(i) for i in indices))


def _annotations(fs, root: str, ref: EpisodeRef, sequence: Sequence) -> None:
    folder = storage.resolve_inside(root, ref.annotations, what="annotations folder", fs=fs)
    names = sorted(p[len(folder) + 1:] for p in fs.find(folder)) if fs.exists(folder) else []  # files, subfolders included
    sequence.scalars["scene_objects"] = None
    if "scene_objects.json" in names:
        objects = storage.resolve_inside(root, f"{ref.annotations}/scene_objects.json", what="annotation file", fs=fs)
        try:
            text = storage.read_small(fs, objects, "scene_objects.json").decode("utf-8")
        except UnicodeDecodeError as error:
            raise FormatError(f"{folder}/scene_objects.json: malformed JSON: {error}") from error
        storage.parse_json(text, f"{folder}/scene_objects.json")  # kept as text, checked to parse
        sequence.scalars["scene_objects"] = text
    others = [name for name in names if name != "scene_objects.json"]
    sequence.files["annotation_files"] = [FileRef(f"{ref.annotations}/{name}", name=name) for name in others] if others else None
