"""L5Kit zarr: the real single_scene fixture, multi-scene datasets we write, and bad input."""

import json
import pathlib
import shutil

import numcodecs
import numpy as np
import pytest

from formats import storage
from formats.errors import FormatError
from formats.sources import l5kit
from formats.sources.l5kit.sample import SyntheticL5Kit, write_dataset
from formats.sources.l5kit.zarr_v2 import ZarrArray, parse_dtype

FIXTURE = pathlib.Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "l5kit" / "single_scene.zarr"


@pytest.fixture(scope="module")
def single_scene():
    if not FIXTURE.is_dir():
        pytest.skip(f"real fixture not found at {FIXTURE} (../shared/fixtures is absent in a plain clone)")
    return FIXTURE


def _raw(path: pathlib.Path) -> np.ndarray:
    """The whole array decoded straight from its chunk files with numcodecs: an independent reference."""
    meta = json.loads((path / ".zarray").read_text())
    dtype = parse_dtype(meta["dtype"])
    codec = numcodecs.get_codec(meta["compressor"])
    chunks = [np.frombuffer(codec.decode((path / str(i)).read_bytes()), dtype)
              for i in range(-(-meta["shape"][0] // meta["chunks"][0]))]
    return np.concatenate(chunks)[: meta["shape"][0]]


def _load_all(path):
    fs, root = storage.open_root(str(path))
    meta, refs = l5kit.plan(fs, root)
    return meta, refs, [l5kit.load(fs, root, ref, meta) for ref in refs]


def _check_scene(sequence, frames, agents, faces):
    assert sequence.length == len(frames)
    assert sequence.trajectories["ego_translation"].tobytes() == np.ascontiguousarray(frames["ego_translation"]).tobytes()
    assert sequence.trajectories["ego_rotation"].tobytes() == np.ascontiguousarray(frames["ego_rotation"]).tobytes()
    assert np.array_equal(sequence.steps["timestamp_ns"], frames["timestamp"])
    assert np.allclose(sequence.timestamp, (frames["timestamp"] - frames["timestamp"][0]) / 1e9)
    for column, array, interval in (("agents", agents, "agent_index_interval"),
                                    ("traffic_light_faces", faces, "traffic_light_faces_index_interval")):
        if array is None:
            assert column not in sequence.steps
            continue
        cells = sequence.steps[column]
        counts = frames[interval][:, 1] - frames[interval][:, 0]
        assert cells.value_lengths().to_numpy().tolist() == counts.tolist()
        expected = array[frames[interval][0, 0]: frames[interval][-1, 1]]
        flat = cells.flatten()
        for name in array.dtype.names:
            got = flat.field(name)
            if array.dtype[name].kind == "U":
                assert got.to_pylist() == expected[name].tolist()
            else:
                values = got.flatten().to_numpy() if hasattr(got.type, "list_size") else got.to_numpy()
                assert values.dtype == expected[name].dtype.base  # source dtype kept (float32 stays float32)
                assert values.tobytes() == np.ascontiguousarray(expected[name]).tobytes(), (column, name)


def test_real_fixture_one_row_with_every_agent_and_face(single_scene):
    meta, refs, sequences = _load_all(single_scene)
    assert [(r.sequence_id, r.length, r.host) for r in refs] == [("scene_000000", 248, "host-a101")]
    frames, agents, faces = (_raw(single_scene / name) for name in ("frames", "agents", "traffic_light_faces"))
    _check_scene(sequences[0], frames, agents, faces)
    assert len(sequences[0].steps["agents"].flatten()) == 20_802
    assert len(sequences[0].steps["traffic_light_faces"].flatten()) == 3_216
    labels = meta.column("agents").meta["labels"]
    assert len(labels) == 17 and labels[3] == "PERCEPTION_LABEL_CAR"
    # The scene's own times are kept as given, although they do not match the frames.
    scene = _raw(single_scene / "scenes")[0]
    assert sequences[0].scalars["start_time"] == int(scene["start_time"]) != int(frames["timestamp"][0])
    yaw = sequences[0].trajectories["ego_yaw"][:, 0]
    rotation = frames["ego_rotation"]
    assert np.allclose(np.cos(yaw), rotation[:, 0, 0] / np.hypot(rotation[:, 0, 0], rotation[:, 1, 0]))


@pytest.mark.parametrize("spec", [
    SyntheticL5Kit(),
    SyntheticL5Kit(scene_lengths=(5, 64, 1, 33), frames_chunk=7, agents_chunk=13, faces_chunk=4, scenes_chunk=3, seed=3),
    SyntheticL5Kit(scene_lengths=(9, 9), with_faces=False, seed=5),
], ids=["default", "tiny-chunks", "v1-no-faces"])
def test_written_datasets_round_trip_exactly(tmp_path, spec):
    truth = write_dataset(str(tmp_path / "ds.zarr"), spec)
    meta, refs, sequences = _load_all(tmp_path / "ds.zarr")
    assert [r.sequence_id for r in refs] == [f"scene_{i:06d}" for i in range(len(spec.scene_lengths))]
    assert any(f["agent_index_interval"][0] == f["agent_index_interval"][1] for f in truth["frames"])  # empty frames exist
    for scene, sequence in zip(truth["scenes"], sequences):
        start, end = scene["frame_index_interval"]
        _check_scene(sequence, truth["frames"][start:end], truth["agents"],
                     truth["traffic_light_faces"] if spec.with_faces else None)
        assert np.allclose(sequence.trajectories["ego_yaw"][:, 0], truth["yaw"][start:end])
    assert (any(s.name == "traffic_light_faces" for s in meta.columns)) == spec.with_faces


def test_plan_reads_scenes_only_and_load_reads_only_its_chunks(tmp_path, monkeypatch):
    spec = SyntheticL5Kit(scene_lengths=(40, 40, 40), agents_chunk=20, frames_chunk=10, seed=1)
    truth = write_dataset(str(tmp_path / "ds.zarr"), spec)
    fs, root = storage.open_root(str(tmp_path / "ds.zarr"))
    read = []
    original = type(fs).cat_file
    monkeypatch.setattr(type(fs), "cat_file", lambda self, path, *a, **k: read.append(path[len(root) + 1:]) or original(self, path, *a, **k))
    meta, refs = l5kit.plan(fs, root)
    assert sorted(p for p in read if not p.endswith((".zarray", ".zattrs"))) == ["scenes/0", "scenes/1"]
    read.clear()
    l5kit.load(fs, root, refs[1], meta)
    read = [p for p in read if not p.endswith((".zarray", ".zattrs"))]  # a reader opens its arrays once (metadata)
    frames = truth["frames"][40:80]
    first, last = frames["agent_index_interval"][0, 0], frames["agent_index_interval"][-1, 1]
    agent_chunks = sorted(int(p.split("/")[1]) for p in read if p.startswith("agents/"))
    assert agent_chunks == list(range(first // 20, (last - 1) // 20 + 1)) and len(agent_chunks) < -(-len(truth["agents"]) // 20)
    assert sorted(int(p.split("/")[1]) for p in read if p.startswith("frames/")) == [4, 5, 6, 7]


def test_memory_filesystem_like_any_remote_store():
    truth = write_dataset("memory://l5kit_test/ds.zarr", SyntheticL5Kit(scene_lengths=(6, 4)))
    meta, refs, sequences = _load_all("memory://l5kit_test/ds.zarr")
    assert [s.length for s in sequences] == [6, 4]
    assert sequences[1].trajectories["ego_translation"].tobytes() == np.ascontiguousarray(truth["frames"]["ego_translation"][6:]).tobytes()


def _written(tmp_path, **kwargs):
    path = tmp_path / "ds.zarr"
    truth = write_dataset(str(path), SyntheticL5Kit(**kwargs))
    return path, truth


def _edit_zarray(path, name, change):
    meta = json.loads((path / name / ".zarray").read_text())
    change(meta)
    (path / name / ".zarray").write_text(json.dumps(meta))


def test_missing_chunk_names_chunk_and_scene(tmp_path):
    path, _ = _written(tmp_path, agents_chunk=50)
    (path / "agents" / "1").unlink()
    fs, root = storage.open_root(str(path))
    meta, refs = l5kit.plan(fs, root)
    message = r"^scene_0000\d\d: .*/ds.zarr/agents/1: chunk 1 of .*agents is missing \(zarr would read it as fill values\)$"
    with pytest.raises(FormatError, match=message):
        for ref in refs:
            l5kit.load(fs, root, ref, meta)


def test_corrupt_chunk_is_a_clear_error(tmp_path):
    path, _ = _written(tmp_path)
    (path / "frames" / "0").write_bytes(b"\x02\x01garbage")
    fs, root = storage.open_root(str(path))
    meta, refs = l5kit.plan(fs, root)
    with pytest.raises(FormatError, match=r"^scene_000000: .*/ds.zarr/frames/0: cannot decode chunk 0 \("):
        l5kit.load(fs, root, refs[0], meta)


def test_scene_pointing_past_the_frames_is_refused_at_plan(tmp_path):
    path, truth = _written(tmp_path, scenes_chunk=10)
    scenes = truth["scenes"].copy()
    scenes[2]["frame_index_interval"] = (80, 500)
    codec = numcodecs.get_codec(json.loads((path / "scenes/.zarray").read_text())["compressor"])
    padded = np.zeros(10, scenes.dtype)
    padded[:3] = scenes
    (path / "scenes/0").write_bytes(bytes(codec.encode(padded.tobytes())))
    fs, root = storage.open_root(str(path))
    with pytest.raises(FormatError, match=r"scenes: scene_000002: frame_index_interval \[80, 500\) outside frames \(87 rows\)"):
        l5kit.plan(fs, root)


def test_zero_length_scene_is_refused(tmp_path):
    path, _ = _written(tmp_path, scene_lengths=(4, 0, 3))
    fs, root = storage.open_root(str(path))
    with pytest.raises(FormatError, match="scene_000001: scene has no frames"):
        l5kit.plan(fs, root)


@pytest.mark.parametrize("change, message", [
    (lambda m: m.update(shape=[10**13]), r"shape \[10000000000000\] / chunks \[100\] are not plausible sizes"),
    (lambda m: m.update(zarr_format=3), "zarr_format 3 \\(only 2 is supported\\)"),
    (lambda m: m.pop("dtype"), "missing key 'dtype'"),
    (lambda m: m.update(dtype=[["centroid", "<f8", [2]]]), r"dtype lacks field\(s\) \['extent'"),
])
def test_bad_array_metadata(tmp_path, change, message):
    path, _ = _written(tmp_path)
    _edit_zarray(path, "agents", change)
    fs, root = storage.open_root(str(path))
    with pytest.raises(FormatError, match=message):
        l5kit.plan(fs, root)


def test_bad_attributes(tmp_path):
    path, _ = _written(tmp_path)
    fs, root = storage.open_root(str(path))
    (path / ".zattrs").write_text(json.dumps({"format_version": 9}))
    with pytest.raises(FormatError, match=r"\.zattrs: format_version 9 is not supported"):
        l5kit.plan(fs, root)
    (path / ".zattrs").write_text(json.dumps({"format_version": 2, "labels": ["a", "b"]}))
    with pytest.raises(FormatError, match="2 labels but agents carry 17 label_probabilities"):
        l5kit.plan(fs, root)
    (path / ".zattrs").write_text("{not json")
    with pytest.raises(FormatError, match=r"\.zattrs: malformed JSON"):
        l5kit.plan(fs, root)


def test_zarr_reader_slices_across_partial_chunks(tmp_path):
    from formats.sources.l5kit.zarr_v2 import write_array

    fs, root = storage.open_root(str(tmp_path))
    values = np.arange(1003, dtype=np.int64)
    write_array(fs, f"{root}/a", values, 100)
    array = ZarrArray(fs, f"{root}/a")
    assert array.chunk_count == 11 and len(array) == 1003
    for start, stop in ((0, 1003), (99, 101), (1000, 1003), (250, 250), (0, 1)):
        assert np.array_equal(array.read(start, stop), values[start:stop])
    with pytest.raises(FormatError, match=r"rows \[1000, 1004\) outside the array's 1003 rows"):
        array.read(1000, 1004)


def _rewrite_scenes(path, change):
    meta = json.loads((path / "scenes/.zarray").read_text())
    codec = numcodecs.get_codec(meta["compressor"])
    scenes = np.frombuffer(codec.decode((path / "scenes/0").read_bytes()), parse_dtype(meta["dtype"])).copy()
    change(scenes)
    (path / "scenes/0").write_bytes(bytes(codec.encode(scenes.tobytes())))


def test_frames_outside_every_scene_are_refused_not_dropped(tmp_path):
    path, _ = _written(tmp_path, scenes_chunk=10)

    def shorten(scenes):
        scenes[1]["frame_index_interval"] = (30, 70)  # frames 70..74 belonged to scene 1

    _rewrite_scenes(path, shorten)
    fs, root = storage.open_root(str(path))
    with pytest.raises(FormatError, match=r"scenes: frames \[70, 75\) belong to no scene; they would be dropped"):
        l5kit.plan(fs, root)


@pytest.mark.parametrize("change, message", [
    (lambda m: m.update(dtype=[f if f[0] != "ego_rotation" else ["ego_rotation", "<f8", [4]] for f in m["dtype"]]),
     r"frames/.zarray: field 'ego_rotation' has shape \[4\], the L5Kit format defines \[3, 3\]"),
    (lambda m: m.update(dtype=[f if f[0] != "agent_index_interval" else ["agent_index_interval", "<i8"] for f in m["dtype"]]),
     r"field 'agent_index_interval' has shape \[\], the L5Kit format defines \[2\]"),
])
def test_frame_fields_of_the_wrong_shape_are_refused(tmp_path, change, message):
    path, _ = _written(tmp_path)
    _edit_zarray(path, "frames", change)
    fs, root = storage.open_root(str(path))
    with pytest.raises(FormatError, match=message):
        l5kit.plan(fs, root)


def test_labels_must_be_strings(tmp_path):
    path, _ = _written(tmp_path)
    (path / ".zattrs").write_text(json.dumps({"format_version": 2, "labels": 17}))
    fs, root = storage.open_root(str(path))
    with pytest.raises(FormatError, match=r"\.zattrs: labels must be a list of strings, found 17"):
        l5kit.plan(fs, root)


def test_face_intervals_without_a_faces_array_are_an_error(tmp_path):
    path, _ = _written(tmp_path)
    shutil.rmtree(path / "traffic_light_faces")
    fs, root = storage.open_root(str(path))
    meta, refs = l5kit.plan(fs, root)
    with pytest.raises(FormatError, match="scene_000000: frames point at traffic-light faces but the dataset has no traffic_light_faces array"):
        l5kit.load(fs, root, refs[0], meta)


def test_extra_fields_are_carried_not_dropped(tmp_path):
    from formats.sources.l5kit.sample import FRAME_DTYPE, SCENE_DTYPE
    from formats.sources.l5kit.zarr_v2 import write_array

    path, truth = _written(tmp_path, scene_lengths=(4, 3))
    fs, root = storage.open_root(str(path))
    scenes = np.zeros(2, np.dtype(SCENE_DTYPE.descr + [("weather", "<U8"), ("quality", "<f4", (2,))]))
    for name in SCENE_DTYPE.names:
        scenes[name] = truth["scenes"][name]
    scenes["weather"] = ["rain", "sun"]
    scenes["quality"] = [[0.5, 1.0], [0.25, 0.75]]
    write_array(fs, f"{root}/scenes", scenes, 10)
    frames = np.zeros(7, np.dtype(FRAME_DTYPE.descr + [("speed", "<f4"), ("imu", "<f8", (2, 3))]))
    for name in FRAME_DTYPE.names:
        frames[name] = truth["frames"][name]
    frames["speed"] = np.arange(7)
    frames["imu"] = np.arange(42).reshape(7, 2, 3)
    write_array(fs, f"{root}/frames", frames, 5)
    meta, refs = l5kit.plan(fs, root)
    sequence = l5kit.load(fs, root, refs[1], meta)
    assert sequence.scalars["weather"] == "sun" and sequence.scalars["quality"] == [0.25, 0.75]
    assert sequence.steps["speed"].tolist() == [4.0, 5.0, 6.0]
    assert sequence.trajectories["imu"].tolist() == np.arange(24, 42).reshape(3, 6).tolist()
    assert meta.column("imu").meta["shape"] == [2, 3]


def test_a_dataset_rewritten_in_place_is_read_afresh(tmp_path):
    path, _ = _written(tmp_path, scene_lengths=(5, 5))
    fs, root = storage.open_root(str(path))
    assert len(l5kit.plan(fs, root)[1]) == 2
    shutil.rmtree(path)
    write_dataset(str(path), SyntheticL5Kit(scene_lengths=(4, 4, 4, 4), seed=9))
    meta, refs = l5kit.plan(fs, root)
    assert len(refs) == 4 and l5kit.load(fs, root, refs[3], meta).length == 4


def test_loads_from_several_threads_share_the_chunk_cache_safely(tmp_path):
    import concurrent.futures
    import sys

    path, truth = _written(tmp_path, scene_lengths=(20,) * 12, agents_chunk=16, frames_chunk=8)
    fs, root = storage.open_root(str(path))
    meta, refs = l5kit.plan(fs, root)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            sequences = list(pool.map(lambda ref: l5kit.load(fs, root, ref, meta), refs * 4))
    finally:
        sys.setswitchinterval(interval)
    for ref, sequence in zip(refs * 4, sequences):
        frames = truth["frames"][ref.frame_start:ref.frame_end]
        assert sequence.trajectories["ego_translation"].tobytes() == np.ascontiguousarray(frames["ego_translation"]).tobytes()
