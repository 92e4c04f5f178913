"""The README's reader example runs as written against the sample `./run_local.sh` converts."""

from __future__ import annotations

import contextlib
import io
import pathlib
import re
import sys

import pytest

from pipelines import convert, make_sample

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def _example() -> str:
    text = README.read_text()
    section = text[text.index("## Reading a converted dataset"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_reader_example_runs(tmp_path, monkeypatch):
    assert make_sample.main([str(tmp_path / "sample/lerobot_v3")]) == 0
    assert convert.run([f"--input={tmp_path / 'sample/lerobot_v3'}", f"--output={tmp_path / 'sample/mixtrain'}", "--progress=off"]) == 0
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(_example(), "README.md", "exec"), namespace)  # noqa: S102 (the documented example itself)
    lines = out.getvalue().splitlines()
    assert lines[0] == f"<Mixtrain dataset file://{tmp_path}/sample/mixtrain: 12 sequences, 1 shard>"
    assert lines[1] == "['obs_state', 'action'] ['video_front', 'video_wrist']"
    assert lines[2] == "(37, 6) float32 Open the drawer. files/video_front/episode_000001.mp4"
    assert namespace["ids"] == [f"episode_{i:06d}" for i in (1, 3, 5, 7, 9, 11)]
    assert namespace["long_ones"].column("length").to_pylist() == [51, 49, 47]
    assert namespace["frames"].shape == (8, 48, 64, 3)
    assert namespace["observation"].shape == (2, 6) and namespace["actions"].shape == (8, 6)
    assert lines[3] == f"{namespace['ds'].count_windows(2, 8, 4)} windows per epoch" and namespace["ds"].count_windows(2, 8, 4) > 0


def _torch_example() -> str:
    text = (README.parent / "docs/reading.md").read_text()
    return re.search(r"```python\n(.*?)```", text[text.index("**PyTorch**"):], re.S).group(1)


def _stand_in_torch():
    """A minimal torch: IterableDataset, get_worker_info, from_numpy, and a DataLoader that runs
    each of its `num_workers` parts in turn (as worker processes would) in lists of batch_size."""
    import types

    info: dict = {"value": None}

    class DataLoader:
        def __init__(self, dataset, batch_size=1, num_workers=0):
            self.dataset, self.batch_size, self.num_workers = dataset, batch_size, num_workers

        def __iter__(self):
            for worker in range(max(self.num_workers, 1)):
                info["value"] = types.SimpleNamespace(id=worker, num_workers=self.num_workers) if self.num_workers else None
                items = list(self.dataset)
                info["value"] = None
                yield from (items[i:i + self.batch_size] for i in range(0, len(items), self.batch_size))

    data = types.SimpleNamespace(IterableDataset=object, Dataset=object, DataLoader=DataLoader, get_worker_info=lambda: info["value"])
    return types.SimpleNamespace(utils=types.SimpleNamespace(data=data), from_numpy=lambda array: array, Tensor=object)


@pytest.fixture(params=["stand-in torch", "torch"])
def torch_module(request, monkeypatch):
    """The docs' torch example runs against a stand-in everywhere, and against real torch where
    it is installed (never in CI: docs/reading.md "PyTorch" says what that leaves untested)."""
    if request.param == "torch":
        return pytest.importorskip("torch", reason="torch is not installed (not a dependency; docs/reading.md 'PyTorch')")
    fake = _stand_in_torch()
    monkeypatch.setitem(sys.modules, "torch", fake)
    return fake


def test_documented_torch_example_runs(tmp_path, monkeypatch, torch_module):
    """The documented DataLoader loop: its imports and calls as written, every window of the
    epoch exactly once over the two workers, in batches of at most 32, each column sliced [2 + 8, 6]."""
    assert make_sample.main([str(tmp_path / "sample/lerobot_v3")]) == 0
    assert convert.run([f"--input={tmp_path / 'sample/lerobot_v3'}", f"--output={tmp_path / 'sample/mixtrain'}", "--progress=off"]) == 0
    monkeypatch.chdir(tmp_path)
    batches: list = []
    loader = torch_module.utils.data.DataLoader

    class Recording(loader):
        def __iter__(self):
            for batch in super().__iter__():
                batches.append(batch)
                yield batch

    monkeypatch.setattr(torch_module.utils.data, "DataLoader", Recording)
    namespace: dict = {}
    exec(compile(_torch_example(), "docs/reading.md", "exec"), namespace)  # noqa: S102 (the documented example itself)
    ds = namespace["windows"]
    from formats.read import reader

    expected = reader.open_dataset("sample/mixtrain").count_windows(2, 8, 4)
    assert len(ds) == expected > 32
    if isinstance(batches[0], list):  # the stand-in: lists of window dicts
        starts = [(w["sequence_id"], int(w["start"])) for batch in batches for w in batch]
        assert all(w["obs_state"].shape == w["action"].shape == (10, 6) for batch in batches for w in batch)
    else:  # torch: collated dicts of batched tensors
        starts = [pair for batch in batches for pair in zip(batch["sequence_id"], batch["start"].tolist())]
        assert all(batch["obs_state"].shape[1:] == batch["action"].shape[1:] == (10, 6) for batch in batches)
    assert len(starts) == len(set(starts)) == expected
    assert max(len(batch["start"]) if isinstance(batch, dict) else len(batch) for batch in batches) == 32
