"""ORTF episodes read on a worker: one episode's steps out of its chunk file, its camera segments,
audio and annotation files, as a Sequence. The metadata side (manifest, episode index, columns)
is formats/ortf.py; this module only reads what a planned EpisodeRef points at.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from formats import parquet_rows, storage
from formats.errors import ConversionError, FormatError, in_context
from formats.sequence import DatasetMeta, FileRef, Sequence, VideoSegment, rebased_timestamps
from formats.source import SourceRef

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
    def unit_files(self) -> tuple[str, ...]:
        files = [self.steps_file, *(camera.path for camera in self.cameras if camera is not None)]
        return tuple(files + [path for path in (self.audio, self.annotations) if path])


class Reader(parquet_rows.ParquetSourceReader):
    """Opened once per worker: a chunk's steps footer is read once for all its episodes."""

    def load(self, ref: EpisodeRef) -> Sequence:
        return _load(self.fs, self.root, ref, self.meta, self.footers)


def _load(fs, root: str, ref: EpisodeRef, meta: DatasetMeta, footers: storage.ParquetFooters) -> Sequence:
    path = storage.resolve_inside(root, ref.steps_file, what="steps file", fs=fs)
    try:
        table = _episode_rows(fs, path, ref, footers)
        return _to_sequence(fs, root, table, ref, meta)
    except ConversionError as error:
        raise in_context(error, file=path, sequence=ref.sequence_id) from error
    except (OSError, pa.ArrowException) as error:
        raise FormatError(f"{path}: {ref.sequence_id}: cannot read steps: {error}") from error


def _episode_rows(fs, path: str, ref: EpisodeRef, footers: storage.ParquetFooters) -> pa.Table:
    metadata = footers.footer(path)
    if not any(metadata.schema.column(i).path == "episode_id" for i in range(metadata.num_columns)):
        raise FormatError("steps have no episode_id column")
    starts = np.cumsum([0] + [metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)]).tolist()
    groups = parquet_rows.row_groups_holding(footers, path, "episode_id", ref.episode_key, ref.episode_key)
    offsets = [starts[group] for group in groups]
    with storage.open_input(fs, path) as handle:
        parquet = storage.parquet_file(handle, metadata=metadata)
        parts = []
        for group, group_offset in zip(groups, offsets):
            part = parquet.read_row_group(group)
            column = part.column("episode_id")
            key = ref.episode_key if _comparable(ref.episode_key, column.type) else ref.episode_id
            mask = pc.equal(column if key is ref.episode_key else column.cast(pa.string()), key)
            rows = np.flatnonzero(mask.to_numpy(zero_copy_only=False))
            if len(rows):
                parts.append((group_offset + rows, part.filter(mask)))
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
            text = fs.cat_file(objects).decode("utf-8")
            json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise FormatError(f"{folder}/scene_objects.json: malformed JSON: {error}") from error
        sequence.scalars["scene_objects"] = text
    others = [name for name in names if name != "scene_objects.json"]
    sequence.files["annotation_files"] = [FileRef(f"{ref.annotations}/{name}", name=name) for name in others] if others else None
