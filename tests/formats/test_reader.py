"""formats.read.reader on datasets this product converted from every source: values equal the
source's (trajectories bit for bit, copied frames pixel for pixel), windows cover every valid
start once per epoch, filters read only the column chunks they need, gs:// on the emulator."""

from __future__ import annotations

import collections
import json
import re
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from formats import mixtrain, video
from formats.errors import FormatError
from formats.read import reader
from formats.sequence import ImageFrames
from formats.sources.l5kit.sample import SyntheticL5Kit
from formats.sources.l5kit.sample import write_dataset as write_l5kit
from formats.sources.lerobot_v3.sample import SyntheticLeRobot
from formats.sources.lerobot_v3.sample import write_dataset as write_lerobot
from formats.sources.ortf.sample import SyntheticORTF
from formats.sources.ortf.sample import write_dataset as write_ortf
from formats.sources.rlds.sample import SyntheticRLDS
from formats.sources.rlds.sample import write_dataset as write_rlds
from pipelines import convert, validate_deep
from tests.conftest import SHARED_FIXTURES

LEROBOT_SPEC = SyntheticLeRobot(lengths=(20, 15, 33, 12, 9, 27), codec="h264", gop=None, episodes_per_video_file=3,
                                episodes_per_data_file=2, extra_step_features=True, multi_task_episodes=(1,))

SYNTHETIC = {
    "lerobot_v3": (lambda path: write_lerobot(str(path), LEROBOT_SPEC), ["--num_shards=3"]),
    "ortf": (lambda path: write_ortf(str(path), SyntheticORTF(lengths=(6, 5, 7))), []),
    "rlds": (lambda path: write_rlds(str(path), SyntheticRLDS(splits={"train": (6, 4, 5)}, shards={"train": 2})), ["--fps=10"]),
    "l5kit": (lambda path: write_l5kit(str(path), SyntheticL5Kit(scene_lengths=(10, 14))), []),
}
REAL = {
    "so100_tiny": (SHARED_FIXTURES / "lerobot_v3" / "so100_tiny", []),
    "multi_lerobot061": (SHARED_FIXTURES / "lerobot_v3" / "multi_lerobot061", []),
    "stream_lerobot061": (SHARED_FIXTURES / "lerobot_v3" / "stream_lerobot061", []),
    "bridge": (SHARED_FIXTURES / "rlds" / "bridge_dataset" / "1.0.0", []),
    "l5kit_single_scene": (SHARED_FIXTURES / "l5kit" / "single_scene.zarr", []),
}


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """name -> (source path, Mixtrain path, writer's truth or None), converted once per module."""
    done: dict = {}

    def get(name: str):
        if name not in done:
            base = tmp_path_factory.mktemp(name)
            if name in SYNTHETIC:
                writer, options = SYNTHETIC[name]
                src = base / "src"
                truth = writer(src)
            else:
                src, options = REAL[name]
                if not src.exists():
                    pytest.skip(f"real fixture not found at {src} (../shared/fixtures is absent in a plain clone)")
                truth = None
            dst = base / "mixtrain"
            assert convert.run([f"--input={src}", f"--output={dst}", "--progress=off", *options]) == 0
            done[name] = (src, dst, truth)
        return done[name]

    return get


def _pixels(frame, entry: dict) -> np.ndarray:
    """A source frame as the reader gives it: RGB, or depth gray [H, W, 1] at its bit depth."""
    if not entry.get("is_depth_map"):
        return frame.to_ndarray(format="rgb24")
    array = video.image_array(frame)
    return array[..., None] if array.ndim == 2 else array


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    error = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if error == 0 else 10 * np.log10(255.0**2 / error)


def _same_bits(got: np.ndarray, expected: np.ndarray) -> bool:
    expected = np.asarray(expected)
    return got.dtype == expected.dtype and got.shape == expected.shape and got.tobytes() == expected.tobytes()


@pytest.mark.parametrize("name", [*SYNTHETIC, *REAL])
def test_every_sequence_equals_what_the_source_holds(converted, name):
    """Each sequence read back equals the source sequence as the source's own reader gives it:
    timestamps and trajectories bit for bit, per-step values and scalars equal, and every
    copied camera pixel for pixel (frame i = timestep i); encoded cameras give T frames of the
    declared size."""
    src, dst, _ = converted(name)
    ds = reader.open_dataset(str(dst))
    sidecar = ds.metadata
    loader = validate_deep._source_loader(str(src), sidecar["source"]["format"], sidecar["converter"]["options"].get("source_options") or {})
    ids = ds.sequence_ids()
    assert len(ids) == sidecar["num_sequences"] > 0 and ids == sorted(ids)
    compared = collections.Counter()
    for sequence_id in ids:
        got = ds.sequence(sequence_id)
        source = loader(sequence_id)
        assert source is not None, sequence_id
        assert got["sequence_id"] == sequence_id and got["length"] == source.length
        assert _same_bits(got["timestamp"], source.timestamp.astype(np.float64))
        for column, values in source.trajectories.items():
            assert got[column].shape == (source.length, ds.column_types[column]["dim"])
            assert _same_bits(got[column], np.asarray(values).reshape(source.length, -1)), (sequence_id, column)
            compared["trajectory"] += 1
        for column, values in source.steps.items():
            if values is None:
                assert got[column] is None
                continue
            expected = values.to_pylist() if isinstance(values, pa.Array) else np.asarray(values).tolist()
            actual = got[column].tolist() if isinstance(got[column], np.ndarray) else got[column]
            assert actual == expected, (sequence_id, column)
            compared["steps"] += 1
        for column, value in source.scalars.items():  # every one of them: a dropped column is a KeyError here
            expected = value.item() if isinstance(value, np.generic) else value
            if isinstance(expected, np.ndarray):
                assert _same_bits(np.asarray(got[column]), expected), (sequence_id, column)
            else:  # JSON columns (ORTF scene_objects) are the source's JSON text, verbatim
                assert got[column] == expected and type(got[column]) is type(expected), (sequence_id, column)
            compared["scalar"] += 1
        for column in ds.video_columns:
            if got[column] is None:  # only where the source has no video for this sequence
                assert source.videos.get(column) is None, (sequence_id, column)
                continue
            entry = ds.column_types[column]
            frames = ds.frames(sequence_id, column)
            size = entry.get("source_resolution", entry["resolution"])
            height, width = size["height"], size["width"]
            assert frames.shape[:3] == (source.length, height, width), (sequence_id, column)
            item = source.videos.get(column)
            if entry.get("written_as") == "copy" and item is not None and not isinstance(item, ImageFrames):
                reference = [_pixels(frame, entry) for frame in validate_deep._reference_frames(loader, source, column, float(entry["fps"]))]
                assert len(reference) == source.length
                assert np.array_equal(frames, np.stack(reference)), (sequence_id, column)
                compared["copied camera"] += 1
                middle = source.length // 2
                assert np.array_equal(ds.frames(sequence_id, column, middle, middle + 2), frames[middle:middle + 2])
            elif isinstance(item, ImageFrames) and not entry.get("is_depth_map"):
                # Cameras stored as images are encoded (lossy): close to the source images.
                decoder = video.ImageDecoder()
                images = np.stack([decoder.to_frame(image, i).to_ndarray(format="rgb24") for i, image in enumerate(item.frames)])
                assert images.shape == frames.shape
                assert _psnr(frames, images) >= 30, (sequence_id, column, _psnr(frames, images))
                compared["encoded camera"] += 1
            else:
                compared["other camera"] += 1
    assert compared["trajectory"] >= len(ids)
    assert compared["scalar"] >= 4 * len(ids)  # length, duration_seconds and the source's own (task, ids, flags)
    if name in ("lerobot_v3", "so100_tiny", "multi_lerobot061", "ortf"):
        assert compared["copied camera"] > 0
    if name in ("rlds", "bridge"):
        assert compared["encoded camera"] > 0


def test_lerobot_values_equal_the_writers_truth(converted):
    """Independent of the converter's source reader: the arrays the synthetic writer wrote."""
    _, dst, truth = converted("lerobot_v3")
    ds = reader.open_dataset(str(dst))
    for episode, sequence_id in enumerate(ds.sequence_ids()):
        got = ds.sequence(sequence_id, ["action", "obs_state", "next_reward", "length"])
        assert set(got) == {"sequence_id", "action", "obs_state", "next_reward", "length"}
        assert _same_bits(got["action"], truth["action"][episode])
        assert _same_bits(got["obs_state"], truth["state"][episode])
        assert got["next_reward"].tolist() == np.asarray(truth["reward"][episode]).reshape(-1).tolist()


def test_so100_actions_equal_the_source_parquet_bit_for_bit(converted):
    src, dst, _ = converted("so100_tiny")
    source = pa.concat_tables([pq.read_table(path, columns=["episode_index", "action"]) for path in sorted(src.glob("data/*/*.parquet"))])
    ds = reader.open_dataset(str(dst))
    rows = ds.scan(["sequence_id", "episode_index", "length"])
    assert rows.column("length").to_pylist() == [51, 54, 25, 44, 23]
    for sequence_id, episode in zip(rows.column("sequence_id").to_pylist(), rows.column("episode_index").to_pylist()):
        mask = source.column("episode_index").to_numpy() == episode
        expected = np.stack(source.filter(pa.array(mask)).column("action").to_numpy(zero_copy_only=False))
        assert _same_bits(ds.sequence(sequence_id)["action"], expected.astype(np.float32))


class _Recorder:
    """A file wrapper noting every byte range read."""

    def __init__(self, handle, ranges):
        self._handle, self._ranges = handle, ranges

    def read(self, size=-1):
        position = self._handle.tell()
        data = self._handle.read(size)
        self._ranges.append((position, position + len(data)))
        return data

    def read_buffer(self, size=-1):  # what Arrow calls on a native file (a local shard is a pa.OSFile)
        position = self._handle.tell()
        data = self._handle.read_buffer(size)
        self._ranges.append((position, position + len(data)))
        return data

    def readinto(self, buffer):
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def __getattr__(self, name):
        return getattr(self._handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._handle.close()


def _column_chunks(path) -> dict[str, list[tuple[int, int]]]:
    """Top-level column -> the byte ranges of its column chunks, from the footer."""
    metadata = pq.ParquetFile(path).metadata
    out = collections.defaultdict(list)
    for group in range(metadata.num_row_groups):
        for index in range(metadata.num_columns):
            chunk = metadata.row_group(group).column(index)
            start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
            out[chunk.path_in_schema.split(".")[0]].append((start, start + chunk.total_compressed_size))
    return out


def test_filters_read_only_the_scalar_column_chunks(tmp_path, monkeypatch):
    """Listing and filtering by scalar columns fetches no byte of a trajectory, timestamp,
    per-step or video column chunk beyond the footer read Arrow makes at the file's end."""
    spec = SyntheticLeRobot(lengths=(2400, 2000, 2800, 1800), state_dim=32, action_dim=32, cameras=(), extra_step_features=True)
    write_lerobot(str(tmp_path / "src"), spec)
    dst = tmp_path / "mixtrain"
    assert convert.run([f"--input={tmp_path / 'src'}", f"--output={dst}", "--progress=off", "--num_shards=2"]) == 0
    ds = reader.open_dataset(str(dst))
    ds.schema  # noqa: B018 (the first shard's footer, read once before recording)
    opened = collections.defaultdict(list)
    original = reader.Dataset._open

    def recording(self, relative):
        return _Recorder(original(self, relative), opened[relative])

    monkeypatch.setattr(reader.Dataset, "_open", recording)
    ids = ds.sequence_ids(where=[("task", "=", "Open the drawer.")])
    assert ids == ["episode_000001", "episode_000003"]
    long_ones = ds.scan(["sequence_id", "length"], where=pc.field("length") > 2200)
    assert long_ones.to_pylist() == [{"sequence_id": "episode_000000", "length": 2400}, {"sequence_id": "episode_000002", "length": 2800}]
    assert sorted(opened) == ds.shards
    heavy = [name for name in ds.schema.names if ds.kind(name) in ("trajectory", "timestamps", "steps")]
    assert {"action", "obs_state", "timestamp", "next_reward"} <= set(heavy)
    for shard, ranges in opened.items():
        size = (dst / shard).stat().st_size
        chunks = _column_chunks(dst / shard)
        body = [(a, b) for a, b in ranges if b < size and b > a]  # not the footer read at the end
        assert body, shard
        touched = {name for name, spans in chunks.items() for low, high in spans for a, b in body if a < high and low < b}
        assert touched <= {"sequence_id", "task", "length"} and "sequence_id" in touched, touched
        heavy_bytes = sum(high - low for name in heavy for low, high in chunks[name])
        assert heavy_bytes > 0.8 * size
        assert sum(b - a for a, b in body) < 0.05 * size, (shard, body, size)
        assert all(b - a <= 64 << 10 for a, b in ranges if b == size)  # Arrow's speculative footer read


def test_a_sequence_lookup_opens_only_its_shard(converted, monkeypatch):
    _, dst, _ = converted("lerobot_v3")
    ds = reader.open_dataset(str(dst))
    opened = []
    original = reader.Dataset._open
    monkeypatch.setattr(reader.Dataset, "_open", lambda self, relative: (opened.append(relative), original(self, relative))[1])
    ds.schema  # noqa: B018 (the footer of the first shard, once)
    opened.clear()
    ds.sequence("episode_000004")
    assert opened == [mixtrain.shard_path(mixtrain.shard_of("episode_000004", 3))]
    with pytest.raises(KeyError, match="no sequence 'nope'"):
        ds.sequence("nope")


def _expected_starts(ds, horizon, stride, ids=None):
    rows = ds.scan(["sequence_id", "length"]).to_pylist()
    return {(row["sequence_id"], start) for row in rows if ids is None or row["sequence_id"] in ids
            for start in range(0, row["length"] - horizon + 1, stride)}


def test_windows_cover_every_valid_start_exactly_once_per_epoch(converted):
    _, dst, _ = converted("lerobot_v3")
    ds = reader.open_dataset(str(dst))
    assert len(ds.shards) == 3
    expected = _expected_starts(ds, 5, 2)
    epochs = []
    for epoch in (0, 1):
        windows = list(ds.windows(observation_horizon=2, action_horizon=3, stride=2, seed=7, epoch=epoch))
        keys = [(w["sequence_id"], w["start"]) for w in windows]
        assert len(keys) == len(set(keys)) == len(expected) == ds.count_windows(2, 3, 2)
        assert set(keys) == expected
        epochs.append(keys)
        # Shard-level order: each shard's windows come in one run.
        shard_runs = [mixtrain.shard_of(sequence_id, 3) for sequence_id, _ in keys]
        runs = [shard for index, shard in enumerate(shard_runs) if index == 0 or shard != shard_runs[index - 1]]
        assert len(runs) == len(set(runs))
        full = {sequence_id: ds.sequence(sequence_id) for sequence_id in {k[0] for k in keys}}
        for window in windows[:10]:
            row, start = full[window["sequence_id"]], window["start"]
            assert window["action"].shape == (5, 6) and _same_bits(window["action"], row["action"][start:start + 5])
            assert _same_bits(window["timestamp"], row["timestamp"][start:start + 5])
            assert window["next_done"].dtype == np.bool_
    assert epochs[0] != epochs[1]
    assert [(w["sequence_id"], w["start"]) for w in ds.windows(2, 3, 2, seed=7, epoch=0)] == epochs[0]


@pytest.mark.parametrize("num_workers", [2, 3, 5])
def test_worker_parts_are_disjoint_and_cover_the_epoch(converted, num_workers):
    _, dst, _ = converted("lerobot_v3")
    ds = reader.open_dataset(str(dst))
    expected = _expected_starts(ds, 4, 1)
    parts = [[(w["sequence_id"], w["start"]) for w in ds.windows(4, stride=1, columns=["action"], worker=i, num_workers=num_workers)]
             for i in range(num_workers)]
    assert sum(len(p) for p in parts) == len(expected) and set().union(*map(set, parts)) == expected
    assert sum(1 for p in parts if p) >= min(num_workers, 2)


def test_windows_over_chosen_sequences_with_frames(converted):
    _, dst, _ = converted("lerobot_v3")
    ds = reader.open_dataset(str(dst))
    chosen = ds.sequence_ids(where=[("task", "=", "Pick up the cube.")])
    windows = list(ds.windows(2, 1, 3, sequence_ids=chosen, cameras=["video_front"], shuffle=False))
    assert {(w["sequence_id"], w["start"]) for w in windows} == _expected_starts(ds, 3, 3, set(chosen))
    window = windows[1]
    assert window["video_front"].shape == (2, 48, 64, 3)
    assert np.array_equal(window["video_front"], ds.frames(window["sequence_id"], "video_front", window["start"], window["start"] + 2))
    with pytest.raises(ValueError, match="stride must be at least 1"):
        next(ds.windows(2, 0, 0))


def test_open_refuses_what_it_cannot_read(tmp_path, converted):
    with pytest.raises(FormatError, match="no mixtrain.json"):
        reader.open_dataset(str(tmp_path))
    _, dst, _ = converted("l5kit")
    copy = tmp_path / "future"
    copy.mkdir()
    sidecar = json.loads((dst / "mixtrain.json").read_text())
    (copy / "mixtrain.json").write_text(json.dumps({**sidecar, "mixtrain": "2.0"}))
    with pytest.raises(FormatError, match="format version '2.0' is not one this reader knows"):
        reader.open_dataset(str(copy))
    ds = reader.open_dataset(str(dst))
    with pytest.raises(KeyError, match="is not a video column"):
        ds.frames(ds.sequence_ids()[0], "length")
    with pytest.raises(KeyError, match="no column 'nope'"):
        ds.scan(["nope"])


def test_a_missing_video_is_one_error_naming_it(converted, tmp_path):
    _, dst, _ = converted("lerobot_v3")
    copy = tmp_path / "copy"
    shutil.copytree(dst, copy)
    (copy / "files/video_front/episode_000002.mp4").unlink()
    ds = reader.open_dataset(str(copy))
    with pytest.raises(FormatError) as caught:
        ds.frames("episode_000002", "video_front", 0, 2)
    assert str(caught.value) == f"file://{copy}/files/video_front/episode_000002.mp4: video file not found"
    with pytest.raises(FormatError, match=r"timesteps \[30, 40\) asked, 3 frames decoded"):
        ds.frames("episode_000002", "video_wrist", 30, 40)


def test_torch_wrappers(converted):
    torch = pytest.importorskip("torch", reason="torch is not installed (not a dependency; docs/reading.md 'PyTorch' says what is then untested)")
    _, dst, _ = converted("lerobot_v3")
    ds = reader.open_dataset(str(dst))
    windows = reader.torch_windows(ds, 2, 3, 2, columns=["action"])
    items = list(torch.utils.data.DataLoader(windows, batch_size=None, num_workers=2))
    assert len(items) == len(windows) == ds.count_windows(2, 3, 2)
    assert {(i["sequence_id"], i["start"]) for i in items} == _expected_starts(ds, 5, 2)
    sequences = reader.torch_sequences(ds, columns=["action"])
    assert torch.equal(sequences[0]["action"], torch.from_numpy(ds.sequence(ds.sequence_ids()[0])["action"]))


def test_a_point_lookup_skips_row_groups_its_id_is_not_in(tmp_path, monkeypatch):
    """Predicate pushdown: rows are sorted by sequence_id and row groups close at 8 MB, so the
    min/max statistics of sequence_id let a lookup fetch one row group, not the shard."""
    write_lerobot(str(tmp_path / "src"), SyntheticLeRobot(lengths=(17000, 16000, 18000), state_dim=64, action_dim=64, cameras=()))
    dst = tmp_path / "mixtrain"
    assert convert.run([f"--input={tmp_path / 'src'}", f"--output={dst}", "--progress=off"]) == 0
    shard = dst / "data/part-00000.parquet"
    metadata = pq.ParquetFile(shard).metadata
    groups = [metadata.row_group(i) for i in range(metadata.num_row_groups)]
    assert [g.num_rows for g in groups] == [1, 2]
    spans = [(min(_chunk_start(g.column(c)) for c in range(g.num_columns)),
              max(_chunk_start(g.column(c)) + g.column(c).total_compressed_size for c in range(g.num_columns))) for g in groups]
    ds = reader.open_dataset(str(dst))
    ds.schema  # noqa: B018
    size = shard.stat().st_size
    original = reader.Dataset._open
    for sequence_id, wanted, other in (("episode_000000", 0, 1), ("episode_000002", 1, 0)):
        ranges: list = []
        monkeypatch.setattr(reader.Dataset, "_open", lambda self, relative, ranges=ranges: _Recorder(original(self, relative), ranges))
        row = ds.sequence(sequence_id)
        assert row["sequence_id"] == sequence_id and row["action"].shape == (row["length"], 64)
        body = [(a, b) for a, b in ranges if b < size and b > a]
        low, high = spans[other]
        assert not [(a, b) for a, b in body if a < high and low < b], f"{sequence_id}: read row group {other}"
        assert sum(b - a for a, b in body) >= 0.9 * (spans[wanted][1] - spans[wanted][0])  # its row group, whole


def _chunk_start(chunk) -> int:
    return chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset


def test_torch_wrappers_against_a_stand_in_torch(converted, monkeypatch):
    """Where torch is absent: the wrappers' own logic (DataLoader workers each take their part of
    the epoch via get_worker_info, set_epoch, len) run against a minimal stand-in module."""
    import sys
    import types

    info = {"value": None}
    data = types.SimpleNamespace(IterableDataset=object, Dataset=object, get_worker_info=lambda: info["value"])
    fake = types.SimpleNamespace(utils=types.SimpleNamespace(data=data), from_numpy=lambda array: ("tensor", array))
    monkeypatch.setitem(sys.modules, "torch", fake)
    _, dst, _ = converted("lerobot_v3")
    ds = reader.open_dataset(str(dst))
    chosen = ds.sequence_ids()[:4]
    windows = reader.torch_windows(ds, 2, 3, 2, columns=["action"], sequence_ids=chosen)
    expected = _expected_starts(ds, 5, 2, set(chosen))
    assert len(windows) == len(expected)
    parts = []
    for worker in range(2):
        info["value"] = types.SimpleNamespace(id=worker, num_workers=2)
        parts.append([(w["sequence_id"], w["start"]) for w in windows])
    assert not set(parts[0]) & set(parts[1]) and set(parts[0]) | set(parts[1]) == expected
    info["value"] = None
    first = list(windows)
    assert first[0]["action"][0] == "tensor" and first[0]["action"][1].shape == (5, 6)
    # torch.from_numpy gets writable memory: real torch warns once per worker on read-only arrays
    assert all(w[column][1].flags.writeable for w in first for column in ("action",))
    windows.set_epoch(1)
    assert [(w["sequence_id"], w["start"]) for w in windows] != [(w["sequence_id"], w["start"]) for w in first]
    sequences = reader.torch_sequences(ds, where=[("task", "=", "Open the drawer.")], columns=["action"])
    assert len(sequences) == len(ds.sequence_ids(where=[("task", "=", "Open the drawer.")]))
    assert np.array_equal(sequences[0]["action"][1], ds.sequence(ds.sequence_ids(where=[("task", "=", "Open the drawer.")])[0])["action"])


def test_12_bit_depth_frames_are_the_codes_themselves(converted):
    """gray12le depth: frames() gives the 0..4095 codes depth_quantization describes, not codes x 16."""
    import av

    _, dst, _ = converted("stream_lerobot061")
    ds = reader.open_dataset(str(dst))
    column = next(name for name in ds.video_columns if ds.column_types[name].get("is_depth_map"))
    sequence_id = ds.sequence_ids()[0]
    frames = ds.frames(sequence_id, column)
    with av.open(str(dst / ds.sequence(sequence_id)[column])) as container:
        decoded = list(container.decode(video=0))
    assert {frame.format.name for frame in decoded} == {"gray12le"}
    native = np.stack([frame.to_ndarray() for frame in decoded])
    assert frames.dtype == np.uint16 and frames.shape == (*native.shape, 1)
    assert np.array_equal(frames[..., 0], native) and 0 < frames.max() <= 4095


@pytest.fixture
def without_s3fs(monkeypatch):
    """s3fs as if it were not installed (the `s3` extra, not a dependency of its own)."""
    import importlib
    import sys

    monkeypatch.setitem(sys.modules, "s3fs", None)
    monkeypatch.delitem(importlib.import_module("fsspec.registry")._registry, "s3", raising=False)  # no class imported before


@pytest.mark.parametrize("url", ["s3://bucket/datasets/so100", "filecache::s3://bucket/datasets/so100"])
def test_an_s3_url_without_s3fs_is_one_error_naming_the_package(without_s3fs, url):
    """README: the reader opens s3:// URLs; without s3fs that is one FormatError (an ImportError
    too) saying what to install, not fsspec's bare ImportError."""
    from formats.errors import MissingPackageError

    with pytest.raises(FormatError) as caught:
        reader.open_dataset(url)
    assert isinstance(caught.value, MissingPackageError) and isinstance(caught.value, ImportError)
    assert str(caught.value) == f"{url}: this protocol needs a package that is not installed: pip install 'mixtrain-convert[s3]'"


@pytest.mark.parametrize("command", ["convert --input", "convert --output", "validate", "inspect"])
def test_every_command_says_which_package_an_s3_url_needs(without_s3fs, tmp_path, capsys, command):
    from pipelines import inspect
    from pipelines import validate as validate_command

    url = "s3://bucket/datasets/so100"
    expected = f"{url}: this protocol needs a package that is not installed: pip install 'mixtrain-convert[s3]'"
    if command.startswith("convert"):
        src = tmp_path / "src"
        write_lerobot(str(src), SyntheticLeRobot(lengths=(3,), cameras=()))
        flags = {"--input": f"--input={url}", "--output": f"--output={url}"}
        argv = [flags["--input"] if command.endswith("--input") else f"--input={src}",
                flags["--output"] if command.endswith("--output") else f"--output={tmp_path / 'out'}", "--progress=off"]
        assert convert.run(argv) == 2
        expected = f"{command.split()[1]}={expected}"
    else:
        assert (validate_command if command == "validate" else inspect).main([url]) == 1
    assert capsys.readouterr().err.splitlines()[0] == f"error: {expected}"


@pytest.mark.parametrize(("arguments", "message"), [
    ((2, 8, 0), "stride must be at least 1, got 0"),
    ((2, -3, 1), "action_horizon must be at least 0, got -3"),
    ((0, 2, 1), "observation_horizon must be at least 1, got 0"),
    ((2, 2, 1.5), "stride must be a whole number, got 1.5"),
    ((2, "8", 1), "action_horizon must be a whole number, got '8'"),
    ((True, 2, 1), "observation_horizon must be a whole number, got True"),
])
def test_bad_window_parameters_are_one_value_error_naming_the_parameter(converted, arguments, message):
    _, dst, _ = converted("lerobot_v3")
    ds = reader.open_dataset(str(dst))
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        ds.count_windows(*arguments)
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        next(ds.windows(*arguments))


@pytest.mark.parametrize("arguments", [(1, 0, 1), (2, 3, 2), (5, 40, 7), (1, 400, 1), (3, 4, 1000), (np.int64(2), 3, np.int32(2))])
def test_count_windows_always_equals_what_windows_yields(converted, arguments):
    _, dst, _ = converted("lerobot_v3")
    ds = reader.open_dataset(str(dst))
    assert ds.count_windows(*arguments) == sum(1 for _ in ds.windows(*arguments, columns=["timestamp"]))
