"""Read a Mixtrain v1.0 dataset this product wrote (docs/format.md), without Beam.

    from formats.read.reader import open_dataset
    ds = open_dataset("/data/my_mixtrain")          # or gs://bucket/ds, memory://..., any fsspec URL
    ids = ds.sequence_ids(where=[("task", "=", "Open the drawer.")])
    episode = ds.sequence(ids[0])                   # {"action": [T, D] array, "timestamp": [T], "task": ...}
    frames = ds.frames(ids[0], "video_front", 0, 10)  # [10, H, W, 3] uint8 RGB, frame i = timestep i
    for window in ds.windows(observation_horizon=2, action_horizon=8, stride=4, seed=0, epoch=0): ...

The `Dataset` it returns is `formats.read.dataset.Dataset`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from formats import mixtrain, storage
from formats.errors import FormatError
from formats.read.dataset import PER_STEP, STEPS, TIMESTAMPS, TRAJECTORY, VIDEO, Dataset, Filter, check_sidecar

__all__ = ["open_dataset", "Dataset", "Filter", "torch_windows", "torch_sequences", "TIMESTAMPS", "TRAJECTORY", "STEPS", "VIDEO", "PER_STEP"]


def open_dataset(url: str, *, version: int | None = None) -> Dataset:
    """Open the dataset at a local path or fsspec URL (reads mixtrain.json only; a Lance dataset's
    metadata for `--table_format=lance`, its latest version unless `version` names an earlier one;
    an Iceberg / Delta table's current run for `--table_format=iceberg|delta`, embedded catalog)."""
    fs, root = storage.open_root(url)
    path = storage.join(root, mixtrain.SIDECAR)
    if not fs.exists(path) and fs.exists(storage.join(root, "_versions")):  # --table_format=lance
        from formats.mixtrain.tables import lance
        if lance.is_dataset(fs, root):
            from formats.read.lance_rows import open_rows
            return open_rows(fs, root, version)
    if not fs.exists(path) and version is None:
        lake_format = _lake_format(fs, root)
        if lake_format is not None:
            return _open_lake(fs, root, lake_format)
    if version is not None:
        raise ValueError(f"{url}: versions are a Lance dataset's (--table_format=lance); this is a standalone dataset")
    sidecar = storage.read_json(fs, path, missing="not found: not a finished Mixtrain dataset (no mixtrain.json)",
                                limit=storage.MAX_SIDECAR_BYTES)
    if sidecar.get("mixtrain") != mixtrain.VERSION:
        raise FormatError(f"{path}: format version {sidecar.get('mixtrain')!r} is not one this reader knows ({mixtrain.VERSION!r})")
    check_sidecar(sidecar, path)
    return Dataset(fs, root, sidecar)


def _lake_format(fs, root: str) -> str | None:
    from formats.mixtrain.tables import lake

    return lake.detect(fs, root)


def _open_lake(fs, root: str, table_format: str) -> Dataset:
    """An Iceberg / Delta table this converter wrote (embedded catalog): its current run. The
    `mixtrain` property names that run's shards, which hold exactly the current snapshot's rows
    (a kept shard is byte-identical to the committed one) with the types as written; file
    references are relative to the table location, the root here."""
    from formats.mixtrain.tables import TableSettings, lake

    name = {"iceberg": "an Iceberg", "delta": "a Delta"}[table_format]
    try:
        value = lake.current_property(storage.url_for(fs, root), TableSettings(format=table_format))
    except ImportError:
        value = None
    if not isinstance(value, dict) or value.get("mixtrain") != mixtrain.VERSION:
        raise FormatError(f"{root}: {name} table without a readable Mixtrain run: read it with "
                          f"{'pyiceberg' if table_format == 'iceberg' else 'deltalake'}/DuckDB (docs/lake.md)")
    where = f"{root} ({table_format} table, property {lake.PROPERTY!r})"
    check_sidecar(value, where)
    return Dataset(fs, root, value, where)



# --- PyTorch (optional: torch is not a dependency) ---------------------------------------------


def _torch():
    try:
        import torch
    except ImportError as error:
        raise ImportError("the PyTorch wrappers need torch (pip install torch); the reader itself does not") from error
    return torch


def _tensors(item: dict, torch) -> dict:
    """numpy arrays as tensors. Arrays the reader gives are views of Arrow's read-only buffers:
    torch.from_numpy warns once per DataLoader worker that writing to such a tensor is undefined,
    so those are copied (a tensor owns writable memory, as a training step expects)."""
    return {key: torch.from_numpy(_writable(value)) if isinstance(value, np.ndarray) else value for key, value in item.items()}


def _writable(array: np.ndarray) -> np.ndarray:
    array = np.ascontiguousarray(array)
    return array if array.flags.writeable else array.copy()


def torch_windows(dataset: Dataset, observation_horizon: int, action_horizon: int = 0, stride: int = 1, **options: Any):
    """A torch IterableDataset over `dataset.windows(...)`: each DataLoader worker reads its own
    part of the epoch; call `.set_epoch(n)` before each epoch for a new shuffle."""
    torch = _torch()

    class WindowDataset(torch.utils.data.IterableDataset):
        def __init__(self) -> None:
            self.epoch = int(options.pop("epoch", 0))

        def set_epoch(self, epoch: int) -> None:
            self.epoch = epoch

        def __len__(self) -> int:
            return dataset.count_windows(observation_horizon, action_horizon, stride, where=options.get("where"),
                                         sequence_ids=options.get("sequence_ids"))

        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            part = {} if info is None else {"worker": info.id, "num_workers": info.num_workers}
            for window in dataset.windows(observation_horizon, action_horizon, stride, epoch=self.epoch, **options, **part):
                yield _tensors(window, torch)

    return WindowDataset()


def torch_sequences(dataset: Dataset, where: Filter | None = None, columns: Sequence[str] | None = None):
    """A map-style torch Dataset: item i is the i-th matching sequence (sorted ids) as tensors."""
    torch = _torch()
    ids = dataset.sequence_ids(where)

    class SequenceDataset(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(ids)

        def __getitem__(self, index: int) -> dict:
            return _tensors(dataset.sequence(ids[index], columns), torch)

    return SequenceDataset()
