"""The reader on a Lance dataset (`--table_format=lance`): one pseudo-shard (the dataset), rows
read with Lance's scanner (filters pushed down), blob videos read with `take_blobs`."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from formats import storage
from formats.errors import FormatError
from formats.mixtrain import quality
from formats.mixtrain.schema import check_sidecar, check_stats
from formats.mixtrain.tables.lance import open_dataset, read_metadata, read_quality
from formats.read.dataset import Dataset, error_records

__all__ = ["open_rows", "BLOB_CELL"]

BLOB_CELL = "lance-blob://"  # what a blob video cell reads as: lance-blob://<column>/<row address>


def open_rows(fs, root: str, version: int | None = None):
    """The reader's Dataset over the Lance dataset at `root` (see `LanceRows`)."""
    try:
        dataset = open_dataset(fs, root, version)
    except (ValueError, OSError) as error:
        raise FormatError(f"{storage.url_for(fs, root)}: {str(error).splitlines()[0]}") from error
    class LanceRows(Dataset):
        """The reader on a Lance dataset: one pseudo-shard (the dataset), rows read with Lance's
        scanner (filters pushed down), blob videos read with `take_blobs`."""

        def __init__(self) -> None:
            sidecar, self._stats, self._errors = read_metadata(dataset)
            where = f"{storage.url_for(fs, root)} (Lance version {dataset.version} metadata)"
            check_sidecar(sidecar, where)
            check_stats(self._stats, f"{where} stats")
            super().__init__(fs, root, sidecar, where)
            self.lance = dataset
            self.version: int = dataset.version
            self.shards = [""]
            self._by_hash = False
            self._blobs = {name for name, entry in self.column_types.items() if entry.get("stored_as") == "blob"}

        @property
        def schema(self) -> pa.Schema:
            fields = [pa.field(f.name, pa.string()) if f.name in self._blobs else f for f in dataset.schema]
            return pa.schema(fields)

        def stats(self) -> dict:
            return self._stats

        def errors(self) -> list[dict]:
            return error_records(self._errors, f"{self.where} errors")

        def _batches(self, shard: str, columns: list[str], batch_rows: int):
            try:
                for batch in dataset.to_batches(columns=columns, batch_size=batch_rows):
                    yield pa.Table.from_batches([batch])
            except (ValueError, OSError, pa.ArrowException) as error:
                raise FormatError(f"{storage.url_for(fs, root)}: {str(error).splitlines()[0]}") from error

        def quality(self) -> tuple[dict, list[dict]] | None:
            text = read_quality(dataset)
            if not self.metadata.get("quality"):
                return None
            if text is None:
                raise FormatError(f"{self.where}: mixtrain.json names quality findings the Lance metadata does not hold")
            return quality.decode(text.splitlines(), f"{self.where} quality findings")

        def _read(self, shard: str, columns: list[str], where, *, coalesce: bool = True) -> pa.Table:
            blobs = [name for name in columns if name in self._blobs]
            plain = [name for name in columns if name not in self._blobs]
            if where is not None and not isinstance(where, pc.Expression):
                where = pq.filters_to_expression(where)
            try:
                table = dataset.to_table(columns=plain + blobs, filter=where, with_row_address=bool(blobs))  # blobs: descriptors only
            except (ValueError, OSError, pa.ArrowException) as error:
                raise FormatError(f"{storage.url_for(fs, root)}: {str(error).splitlines()[0]}") from error
            if blobs:
                addresses = table.column("_rowaddr").to_pylist()
                for name in blobs:  # a token per row with a video, opened by _video_source
                    present = table.column(name).is_valid().to_pylist()
                    tokens = pa.array([f"{BLOB_CELL}{name}/{a}" if ok else None for a, ok in zip(addresses, present)], pa.string())
                    table = table.set_column(table.schema.get_field_index(name), name, tokens)
                table = table.drop_columns(["_rowaddr"])
            return table.select(columns)

        def video_sizes(self, column: str) -> dict[str, int]:
            if column not in self._blobs:
                return super().video_sizes(column)
            try:  # the blob descriptors (position, size), not the videos
                table = dataset.to_table(columns=["sequence_id", column])
            except (ValueError, OSError, pa.ArrowException) as error:
                raise FormatError(f"{storage.url_for(fs, root)}: {str(error).splitlines()[0]}") from error
            sizes = table.column(column).combine_chunks().field("size").to_pylist()
            return {sequence_id: int(size) for sequence_id, size in zip(table.column("sequence_id").to_pylist(), sizes)
                    if size is not None}

        def _video_source(self, relative: str, column: str):
            if not relative.startswith(BLOB_CELL):
                return super()._video_source(relative, column)
            name, address = relative[len(BLOB_CELL):].rsplit("/", 1)
            where = f"{storage.url_for(fs, root)} ({name}, row address {address})"
            blob = dataset.take_blobs(name, addresses=[int(address)])[0]
            if blob is None:
                raise FormatError(f"{where}: no video blob there")
            return blob, where

    return LanceRows()
