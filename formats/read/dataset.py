"""The reader's `Dataset`: one opened Mixtrain dataset, metadata in memory, rows and videos read
on demand (`formats.read.reader.open_dataset` opens one; a Lance dataset is `lance_rows.LanceRows`).

Why it exists: the rows are one Parquet row per sequence with array columns and videos as
separate files, so opening an episode by hand takes pyarrow offsets plus PyAV; scans of scalar
columns must not read the trajectories next to them (column projection, and row-group pruning by
the Parquet statistics of the filter's columns).
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, BinaryIO

import av
import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from formats import mixtrain, storage, video
from formats.errors import FormatError
from formats.mixtrain import array_layout, quality
from formats.mixtrain.schema import check_sidecar, check_stats

__all__ = ["Dataset", "Filter", "error_records", "TIMESTAMPS", "TRAJECTORY", "STEPS", "VIDEO", "PER_STEP", "check_sidecar"]

# A filter: a pyarrow.compute Expression (pc.field("length") > 100), or pyarrow's list of
# (column, op, value) tuples, ANDed (or a list of such lists, ORed): [("split", "=", "train")].
Filter = Any

# column_types kinds with one value per timestep (sliced by windows()).
TIMESTAMPS, TRAJECTORY, STEPS, VIDEO = "timestamps", "trajectory", "steps", "video"
PER_STEP = (TIMESTAMPS, TRAJECTORY, STEPS)


class Dataset:
    """One opened dataset: metadata in memory, rows and videos read on demand."""

    def __init__(self, fs: fsspec.AbstractFileSystem, root: str, sidecar: dict, where: str | None = None) -> None:
        self.fs, self.root, self.metadata = fs, root, sidecar
        self.where = where or storage.join(root, mixtrain.SIDECAR)  # where the metadata is, for messages
        self.column_types: dict[str, dict] = sidecar["column_types"]
        self.shards: list[str] = list(sidecar.get("shards") or [])
        self._schema: pa.Schema | None = None
        self._footers_checked: set[str] = set()  # shards whose footer length was seen to fit (storage.check_parquet_footer)
        # Rows go to shard md5(id) mod N (formats/mixtrain/__init__.py): a point lookup opens one shard.
        n = len(self.shards)
        self._by_hash = n > 0 and self.shards == [mixtrain.shard_path(i) for i in range(n)]

    def __repr__(self) -> str:
        shards = len(self.shards)
        return f"<Mixtrain dataset {storage.url_for(self.fs, self.root)}: {len(self)} sequences, {shards} shard{'s' * (shards != 1)}>"

    def __len__(self) -> int:
        return int(self.metadata.get("num_sequences", 0))

    # --- metadata -----------------------------------------------------------------------------

    @property
    def schema(self) -> pa.Schema:
        """The Arrow schema of the rows (from the first shard's footer)."""
        if self._schema is None:
            if not self.shards:
                raise FormatError(f"{self.root}: the dataset has no shards")
            with self._open(self.shards[0]) as handle:
                storage.check_parquet_footer(handle, storage.join(self.root, self.shards[0]))
                try:
                    self._schema = pq.ParquetFile(handle).schema_arrow
                except (pa.ArrowInvalid, OSError) as error:
                    raise FormatError(f"{storage.join(self.root, self.shards[0])}: {error}") from error
        return self._schema

    def kind(self, column: str) -> str:
        """A column's kind: scalar, timestamps, trajectory, steps, video, or a file kind."""
        entry = self.column_types.get(column) or {}
        return str(entry.get("type", "scalar")) if entry.get("type") != "json" else "scalar"

    def columns(self, kind: str | None = None) -> list[str]:
        """Column names in schema order, optionally only those of one kind."""
        return [name for name in self.schema.names if kind is None or self.kind(name) == kind]

    @property
    def scalar_columns(self) -> list[str]:
        """The columns with one value per sequence that can be filtered and listed cheaply."""
        return self.columns("scalar")

    @property
    def video_columns(self) -> list[str]:
        return self.columns(VIDEO)

    def stats(self) -> dict:
        """stats.json: per column mean/std/min/max/count/q01..q99, lists of D values."""
        name = self.metadata.get("stats") or mixtrain.STATS_FILE
        path = storage.resolve_inside(self.root, str(name), what="stats", fs=self.fs)
        stats = storage.read_json(self.fs, path, want_object=False)
        check_stats(stats or {}, path)
        return stats or {}

    def errors(self) -> list[dict]:
        """The sequences the conversion skipped (_errors.jsonl; empty when none were)."""
        path = storage.join(self.root, mixtrain.ERRORS_FILE)
        if not self.fs.exists(path):
            return []
        return error_records((line.decode(errors="replace") for _, line in storage.text_lines(self.fs, path)), path)

    def quality(self) -> tuple[dict, list[dict]] | None:
        """The data-quality findings the conversion recorded (_quality.jsonl: its header and
        findings, checked as untrusted input), or None where it recorded none (`compute_quality`)."""
        name = self.metadata.get("quality")
        if not name:
            return None
        path = storage.resolve_inside(self.root, str(name), what="quality findings", fs=self.fs)
        if not self.fs.exists(path):
            raise FormatError(f"{path}: listed in mixtrain.json but missing")
        return quality.decode((line.decode(errors="replace") for _, line in storage.text_lines(self.fs, path)), path)

    def compute_quality(self, thresholds: quality.Thresholds | None = None, batch_rows: int = 1024) -> tuple[dict, list[dict]]:
        """The data-quality findings computed now from the rows, as the conversion computes them
        (for a dataset written without them, or with other thresholds). What only the conversion's
        pass sees (the source clock's start, decoded frames) is not checked."""
        thresholds = thresholds or quality.Thresholds()
        columns = mixtrain.column_specs(self.schema, self.column_types)
        wanted = [spec.name for spec in columns if spec.name in ("sequence_id", "length", "task") or spec.kind in PER_STEP]
        fps = (self.metadata.get("source") or {}).get("fps")
        fps = float(fps) if isinstance(fps, numbers.Real) and not isinstance(fps, bool) and fps > 0 else None
        found = quality.Partial()
        for shard in self.shards:
            for table in self._batches(shard, wanted, batch_rows):  # a bounded batch of rows in memory at a time
                found.merge(quality.group_partial(table, columns, fps, thresholds))
        return quality.finish(found, columns, thresholds)

    def _batches(self, shard: str, columns: list[str], batch_rows: int) -> Iterator[pa.Table]:
        """A shard's rows `batch_rows` at a time (`columns` only), each batch one chunk per column."""
        path = storage.join(self.root, shard)
        with self._open(shard) as handle:
            if shard not in self._footers_checked:
                storage.check_parquet_footer(handle, path)
                self._footers_checked.add(shard)
            try:
                for batch in pq.ParquetFile(handle).iter_batches(batch_size=batch_rows, columns=columns):
                    yield pa.Table.from_batches([batch])
            except (pa.ArrowInvalid, pa.ArrowTypeError, OSError, KeyError) as error:
                raise FormatError(f"{path}: {error}") from error

    # --- rows -----------------------------------------------------------------------------------

    def _open(self, relative: str):
        """A shard for Arrow (`storage.arrow_input`). Given a plain Python file object, Arrow's
        scan threads hold Python buffers, and the last one released after read_table returned
        takes the GIL; during interpreter exit that thread is ended inside a C++ destructor
        (std::terminate: SIGABRT, exit status 134, in 1-4 % of short reading scripts on a loaded
        machine): a local shard reaches Arrow as its own file, a remote one as a file that the
        script's exit waits for."""
        path = storage.resolve_inside(self.root, relative, what="shard", fs=self.fs)
        try:
            return storage.arrow_input(self.fs, path)
        except FileNotFoundError:
            raise FormatError(f"{path}: listed in mixtrain.json but missing") from None
        except OSError as error:  # unreadable, a name the file system refuses: one line, not a traceback
            raise FormatError(f"{path}: cannot open the shard: {error.strerror or error}") from None

    def _read(self, shard: str, columns: list[str], where: Filter | None, *, coalesce: bool = True) -> pa.Table:
        # coalesce (Arrow's pre_buffer): nearby column chunks in one request, fewer round trips on
        # object stores; off for scans of scalar columns, where it would also fetch the
        # trajectories lying between two projected columns.
        with self._open(shard) as handle:
            if shard not in self._footers_checked:  # once per shard: on an object store each check is a request
                storage.check_parquet_footer(handle, storage.join(self.root, shard))
                self._footers_checked.add(shard)
            try:
                return pq.read_table(handle, columns=columns, filters=where, pre_buffer=coalesce)
            except (pa.ArrowInvalid, pa.ArrowTypeError, KeyError) as error:
                raise FormatError(f"{storage.join(self.root, shard)}: {error}") from error

    def read_shard(self, shard: str, columns: Sequence[str]) -> pa.Table:
        """One shard's rows, `columns` only (a pipeline's unit of reading: one shard per worker task)."""
        if shard not in self.shards:
            raise KeyError(f"{shard!r} is not a shard of {self.root}")
        return self._read(shard, list(columns), None)

    def scan(self, columns: Sequence[str] | None = None, where: Filter | None = None) -> pa.Table:
        """The rows matching `where`, only `columns` read (default: the scalar columns).

        Only the column chunks of `columns` and of the filter's columns are fetched, and row
        groups whose statistics exclude the filter are skipped."""
        wanted = list(self.scalar_columns if columns is None else columns)
        unknown = [name for name in wanted if name not in self.schema.names]
        if unknown:
            raise KeyError(f"no column {unknown[0]!r} in {self.root}; columns: {', '.join(self.schema.names)}")
        heavy = any(self.kind(name) != "scalar" for name in wanted)
        tables = [self._read(shard, wanted, where, coalesce=heavy) for shard in self.shards]
        if not tables:
            return self.schema.empty_table().select(wanted)
        table = pa.concat_tables(tables)
        return table.take(pc.sort_indices(table, [("sequence_id", "ascending")])) if "sequence_id" in wanted else table

    def sequence_ids(self, where: Filter | None = None) -> list[str]:
        """The ids of the sequences matching `where` (all by default), sorted; reads no trajectory."""
        return self.scan(["sequence_id"], where).column("sequence_id").to_pylist()

    def _shards_of(self, sequence_id: str) -> list[str]:
        if self._by_hash:
            return [self.shards[mixtrain.shard_of(sequence_id, len(self.shards))]]
        return self.shards

    def shards_holding(self, sequence_ids: Iterable[str]) -> list[str]:
        """The shards that may hold these sequences, in the dataset's order (every shard where rows
        are not placed by their id's hash)."""
        if not self._by_hash:
            return list(self.shards)
        wanted = {shard for sequence_id in sequence_ids for shard in self._shards_of(sequence_id)}
        return [shard for shard in self.shards if shard in wanted]

    def sequence(self, sequence_id: str, columns: Sequence[str] | None = None) -> dict[str, Any]:
        """One sequence: trajectories as [T, D] numpy arrays in their stored dtype, timestamps and
        numeric per-step columns as [T] arrays (other per-step values as lists), scalars as Python
        values, video and file columns as their paths relative to the root."""
        wanted = list(self.schema.names if columns is None else columns)
        if "sequence_id" not in wanted:
            wanted.insert(0, "sequence_id")
        for shard in self._shards_of(sequence_id):
            table = self._read(shard, self._with_length(wanted), pc.field("sequence_id") == sequence_id)
            if table.num_rows:
                return self._row(table, 0, wanted)
        raise KeyError(f"no sequence {sequence_id!r} in {storage.url_for(self.fs, self.root)}")

    def _with_length(self, wanted: list[str]) -> list[str]:
        """`wanted`, and `length` where a bytes trajectory is among them (its cells are checked against it)."""
        if "length" in wanted or not any(array_layout.is_bytes(self.column_types.get(name) or {}) for name in wanted):
            return wanted
        return [*wanted, "length"] if "length" in self.schema.names else wanted

    def _row(self, table: pa.Table, index: int = 0, names: Sequence[str] | None = None) -> dict[str, Any]:
        row: dict[str, Any] = {}
        length = table.column("length")[index].as_py() if "length" in table.column_names else None
        sequence_id = table.column("sequence_id")[index].as_py() if "sequence_id" in table.column_names else f"row {index}"
        for name in table.column_names if names is None else names:
            cell = table.column(name).slice(index, 1).combine_chunks()
            row[name] = self._cell(name, cell, length, sequence_id)
        return row

    def _cell(self, name: str, cell: pa.Array, length: int | None = None, sequence_id: str = "") -> Any:
        """One cell (a length-1 Arrow array) as numpy or Python."""
        kind = self.kind(name)
        entry = self.column_types.get(name) or {}
        if kind == TRAJECTORY and array_layout.is_bytes(entry):  # a view of the row's buffer, no copy
            return self._bytes_cell(name, cell, entry, length, sequence_id)
        if kind in PER_STEP and pa.types.is_list(cell.type):
            if cell.null_count:
                return None
            values = cell.flatten()
            if kind == TRAJECTORY and pa.types.is_fixed_size_list(values.type):
                dim = values.type.list_size
                return values.flatten().to_numpy(zero_copy_only=False).reshape(-1, dim)
            if _is_numeric(values.type):
                return values.to_numpy(zero_copy_only=False)
            return values.to_pylist()
        return cell[0].as_py()

    def _bytes_cell(self, name: str, cell: pa.Array, entry: dict, length: int | None, sequence_id: str) -> np.ndarray | None:
        """A bytes-layout cell as [T, D], its size checked against `length` x dim x itemsize: a
        column_types entry edited (another dim or a wider dtype) would otherwise give arrays of
        another shape without a word. (A dtype of the same width is only caught by validate --deep.)"""
        described = f"column_types says {entry['dim']} x {entry['dtype']} a step"
        try:
            values = array_layout.decode(cell, 0, entry["dtype"], int(entry["dim"]))
        except ValueError as error:
            raise FormatError(f"{self.where}: {sequence_id}: column {name!r}: {error} ({described})") from None
        if values is not None and length is not None and len(values) != length:
            raise FormatError(f"{self.where}: {sequence_id}: column {name!r}: a cell of {values.nbytes} bytes holds {len(values)} "
                              f"steps as {described}, but the sequence has {length} timesteps")
        return values

    def trajectories(self, sequence_id: str, columns: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """One sequence's trajectories (default: every trajectory column) as numpy [T, D] arrays in
        their stored dtype, for training loops. Zero-copy views of the read buffers where the layout
        allows it: always for `--array_layout=bytes`, and for `lists` when the
        cell has no nulls (Arrow's fixed-size-list values are contiguous)."""
        wanted = list(self.columns(TRAJECTORY) if columns is None else columns)
        for name in wanted:
            if self.kind(name) != TRAJECTORY:
                raise KeyError(f"{name!r} is not a trajectory column of {self.root}; trajectory columns: "
                               f"{', '.join(self.columns(TRAJECTORY)) or 'none'}")
        row = self.sequence(sequence_id, ["sequence_id", *wanted])
        return {name: row[name] for name in wanted}

    def video_file(self, sequence_id: str, column: str) -> BinaryIO:
        """One sequence's video in `column` as a binary file-like object (seekable; hand it to PyAV,
        torchcodec or `open` it yourself): the MP4 file itself, opened read-only. Close it after use."""
        relative = self._video_cell(sequence_id, column)
        if relative is None:
            raise KeyError(f"sequence {sequence_id!r} has no video in column {column!r}")
        return self.open_video(relative, column)

    def open_video(self, cell: str, column: str) -> BinaryIO:
        """The video a cell of `column` names, opened read-only (seekable): a file of the dataset,
        or, in a Lance dataset, a blob of its table. Close it after use."""
        source, _ = self._video_source(cell, column)
        return open(source, "rb") if isinstance(source, str) else source

    def video_sizes(self, column: str) -> dict[str, int]:
        """Each sequence's video size in bytes in a camera column, where the layout tells it without
        reading the videos (the standalone layout's `files/<column>/<sequence_id>.mp4`: one listing)."""
        folder = storage.join(self.root, "files", column)
        try:
            listing = self.fs.find(folder, detail=True)
        except (FileNotFoundError, OSError):
            return {}
        sizes = {}
        for path, info in listing.items():
            name = path.rsplit("/", 1)[-1]
            if name.endswith(".mp4"):
                sizes[name[:-4]] = int(info.get("size") or 0)
        return sizes

    def rows(self, columns: Sequence[str] | None = None, where: Filter | None = None) -> Iterator[dict[str, Any]]:
        """Every matching sequence as `sequence()` gives it, one shard read at a time."""
        wanted = list(self.schema.names if columns is None else columns)
        for shard in self.shards:
            table = self._read(shard, self._with_length(wanted), where)
            for index in range(table.num_rows):
                yield self._row(table, index, wanted)

    # --- videos ---------------------------------------------------------------------------------

    def video_url(self, sequence_id: str, column: str) -> str | None:
        """The URL of a sequence's video (None when the sequence has none in that column)."""
        relative = self._video_cell(sequence_id, column)
        return None if relative is None else storage.url_for(self.fs, self._resolve(relative))

    def _video_cell(self, sequence_id: str, column: str) -> str | None:
        return self._video_row(sequence_id, column)[column]

    def _video_row(self, sequence_id: str, column: str) -> dict[str, Any]:
        if self.kind(column) != VIDEO:
            raise KeyError(f"{column!r} is not a video column of {self.root}; video columns: {', '.join(self.video_columns) or 'none'}")
        return self.sequence(sequence_id, ["sequence_id", "length", column] if "length" in self.schema.names else ["sequence_id", column])

    def _resolve(self, relative: str) -> str:
        if "://" in relative:
            return relative
        return storage.resolve_inside(self.root, relative, what="video file", fs=self.fs)

    def frames(self, sequence_id: str, column: str, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Timesteps [start, stop) of a camera, decoded with PyAV: [N, H, W, 3] uint8 RGB (depth
        cameras: [N, H, W, 1] uint16 or uint8 gray). Frame i of the file is timestep i; all of them
        (no `stop`) must be the sequence's `length` timesteps."""
        row = self._video_row(sequence_id, column)
        if row[column] is None:
            raise KeyError(f"sequence {sequence_id!r} has no video in column {column!r}")
        return self.decode(row[column], column, start, stop, length=row.get("length"))

    def decode(self, relative: str, column: str, start: int = 0, stop: int | None = None, *, length: int | None = None) -> np.ndarray:
        """Frames [start, stop) of the video file at `relative` (a cell of `column`); with no
        `stop`, a file that does not hold `length` frames (when given) is a FormatError."""
        out = list(self.iter_decoded(relative, column, start, stop, length=length))
        return np.stack(out) if out else np.zeros((0, 0, 0, 3), np.uint8)

    def iter_decoded(self, relative: str, column: str, start: int = 0, stop: int | None = None, *,
                     length: int | None = None, gray: bool | None = None) -> Iterator[np.ndarray]:
        """`decode`, one frame at a time (a long episode is never held whole); the frame count is
        checked when the file ends. `gray`: frames as their gray values ([H, W, 1], 8 or 16 bits),
        not RGB; by default for depth cameras only."""
        entry = self.column_types.get(column) or {}
        if not entry.get("fps"):
            raise FormatError(f"{storage.join(self.root, mixtrain.SIDECAR)}: column {column!r} is not a video column with an fps")
        fps = float(entry["fps"])  # checked positive when the dataset was opened
        if start < 0 or (stop is not None and stop < start):
            raise ValueError(f"frames [{start}, {stop}) is not a range of timesteps")
        depth = bool(entry.get("is_depth_map")) if gray is None else gray
        crop = entry.get("source_resolution")  # an encode padded odd sizes: give back the source's
        where = relative
        source: Any = None
        count = 0
        try:
            source, where = self._video_source(relative, column)
            for frame in video.iter_frames(source, start=start / fps if start else None,
                                           end=None if stop is None else stop / fps, fps=fps):
                array = video.image_array(frame) if depth else frame.to_ndarray(format="rgb24")
                if array.ndim == 2:
                    array = array[..., None]
                if crop:
                    array = array[: int(crop["height"]), : int(crop["width"])]
                count += 1
                if stop is not None and count > stop - start:
                    break
                yield array
        except FileNotFoundError:
            raise FormatError(f"{where}: video file not found") from None
        except (video.VideoError, av.FFmpegError, OSError) as error:
            raise FormatError(f"{where}: {error}") from error
        finally:
            if source is not None and not isinstance(source, str):
                source.close()
        if stop is not None and count != stop - start:
            raise FormatError(f"{where}: timesteps [{start}, {stop}) asked, {count} frames decoded")
        if stop is None and length is not None and count != max(0, length - start):
            raise FormatError(f"{where}: {count} frames decoded from timestep {start}, but the sequence has {length} timesteps")

    def _video_source(self, relative: str, column: str) -> tuple[str | BinaryIO, str]:
        """A video cell's file for decoding (a local path, or an open file to close) and its URL for messages."""
        fs, path = storage.open_root(relative) if "://" in relative else (self.fs, self._resolve(relative))
        where = storage.url_for(fs, path)
        local = storage.local_path(fs, path)
        try:
            if local is not None and not os.path.isfile(local):
                raise FileNotFoundError(local)
            return local or storage.open_input(fs, path), where
        except FileNotFoundError:
            raise FormatError(f"{where}: video file not found") from None

    # --- training windows -----------------------------------------------------------------------

    def windows(self, observation_horizon: int, action_horizon: int = 0, stride: int = 1, *,
                columns: Sequence[str] | None = None, sequence_ids: Sequence[str] | None = None,
                where: Filter | None = None, cameras: Sequence[str] = (), shuffle: bool = True,
                seed: int = 0, epoch: int = 0, worker: int = 0, num_workers: int = 1) -> Iterator[dict[str, Any]]:
        """Fixed-length windows of H = observation_horizon + action_horizon timesteps, starting
        at every multiple of `stride` with start + H <= T, each exactly once per epoch.

        Order (the spec's recommendation): shards in a shuffled order, each read whole, its
        sequences shuffled, then each sequence's windows in shuffled order; seeded by (seed,
        epoch), so an epoch replays identically and epochs differ. `worker`/`num_workers` split
        the epoch into disjoint parts (by shard when there are enough shards, else by
        sequence). A window holds `sequence_id`, `start`, each per-step column sliced [H, ...]
        (default: timestamps, trajectories and numeric per-step columns) and, for `cameras`, the
        observation frames [observation_horizon, H, W, 3].
        """
        horizon = _window_horizon(observation_horizon, action_horizon, stride)
        if not 0 <= worker < num_workers:
            raise ValueError(f"worker {worker} is not in [0, {num_workers})")
        wanted = list(columns) if columns is not None else [
            name for name in self.schema.names
            if self.kind(name) in (TIMESTAMPS, TRAJECTORY) or (self.kind(name) == STEPS and _is_numeric(self.schema.field(name).type.value_type))]
        for camera in cameras:
            if self.kind(camera) != VIDEO:
                raise KeyError(f"{camera!r} is not a video column of {self.root}")
        read = ["sequence_id", "length", *wanted, *cameras]
        chosen = set(sequence_ids) if sequence_ids is not None else None
        order = np.random.default_rng([seed, epoch]).permutation(len(self.shards)) if shuffle else np.arange(len(self.shards))
        by_shard = len(self.shards) >= num_workers
        position = 0
        for rank, shard_index in enumerate(order):
            if by_shard and rank % num_workers != worker:
                continue
            table = self._read(self.shards[shard_index], read, where)
            ids = table.column("sequence_id").to_pylist()
            # Generators keyed by (seed, epoch, shard[, row]): every worker draws the same orders
            # whatever part of the epoch it yields.
            picks = np.random.default_rng([seed, epoch, int(shard_index)]).permutation(table.num_rows) if shuffle else np.arange(table.num_rows)
            for row_index in picks:
                if chosen is not None and ids[row_index] not in chosen:
                    continue
                mine = by_shard or position % num_workers == worker
                position += 1
                if not mine:
                    continue
                row = self._row(table, int(row_index))
                starts = np.arange(0, int(row["length"]) - horizon + 1, stride)
                if shuffle:
                    starts = np.random.default_rng([seed, epoch, int(shard_index), int(row_index)]).permutation(starts)
                for start in starts.tolist():
                    window = {"sequence_id": row["sequence_id"], "start": start}
                    for name in wanted:
                        window[name] = row[name][start:start + horizon] if row[name] is not None else None
                    for camera in cameras:
                        if row[camera] is not None:
                            window[camera] = self.decode(row[camera], camera, start, start + observation_horizon)
                    yield window

    def count_windows(self, observation_horizon: int, action_horizon: int = 0, stride: int = 1, *,
                      sequence_ids: Sequence[str] | None = None, where: Filter | None = None) -> int:
        """How many windows one epoch of `windows()` yields (reads only `sequence_id` and `length`)."""
        horizon = _window_horizon(observation_horizon, action_horizon, stride)
        table = self.scan(["sequence_id", "length"], where)
        if sequence_ids is not None:
            table = table.filter(pc.is_in(table.column("sequence_id"), pa.array(list(sequence_ids), pa.string())))
        lengths = table.column("length").to_numpy()
        return int(sum(max(0, (int(t) - horizon) // stride + 1) for t in lengths))


def _window_horizon(observation_horizon: int, action_horizon: int, stride: int) -> int:
    """H = observation_horizon + action_horizon, after checking each parameter (one ValueError
    naming it): whole numbers (not bool), observation_horizon >= 1, action_horizon >= 0, stride >= 1."""
    for name, value, least in (("observation_horizon", observation_horizon, 1), ("action_horizon", action_horizon, 0),
                               ("stride", stride, 1)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise ValueError(f"{name} must be a whole number, got {value!r}")
        if value < least:
            raise ValueError(f"{name} must be at least {least}, got {value}")
    return int(observation_horizon) + int(action_horizon)


def error_records(text: str | Iterable[str], where: str) -> list[dict]:
    """The records of an _errors.jsonl text (or its lines), one JSON object a line (blank lines
    skipped); any other line a FormatError naming `where` and the line: `inspect` shows each
    record's fields."""
    records = []
    for number, line in enumerate(text.splitlines() if isinstance(text, str) else text, 1):
        if not line.strip():
            continue
        record = storage.parse_json(line, f"{where}: line {number}")
        if not isinstance(record, dict):
            raise FormatError(f"{where}: line {number} is not a JSON object (found {type(record).__name__})")
        records.append(record)
    return records


def _is_numeric(kind: pa.DataType) -> bool:
    return pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)
