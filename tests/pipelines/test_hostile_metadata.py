"""Hostile variants of ORTF, RLDS and L5Kit metadata and clocks: one `error:` line naming the file, exit 1.

Wrong JSON and Parquet types, missing keys, absurd sizes, paths out of the root, FIFOs, bad clocks
and flipped bits in checksummed Parquet pages. Each recipe corrupts a fresh copy of a small
synthetic dataset and converts it end to end.
"""

import json
import os
import re
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from formats.sources.l5kit.sample import SyntheticL5Kit
from formats.sources.l5kit.sample import write_dataset as write_l5kit
from formats.sources.l5kit.zarr_v2 import write_array
from formats.sources.ortf.sample import SyntheticORTF
from formats.sources.ortf.sample import write_dataset as write_ortf
from formats.sources.rlds.sample import SyntheticRLDS
from formats.sources.rlds.sample import write_dataset as write_rlds
from pipelines import convert

WRITERS = {
    "ortf": lambda p: write_ortf(str(p), SyntheticORTF(lengths=(4, 3, 5), cameras=("cam_wrist",), slow_camera=None, depth_format=None,
                                                       audio=False, annotations=False, urdf=False, episodes_per_chunk=2)),
    "rlds": lambda p: write_rlds(str(p), SyntheticRLDS(splits={"train": (3, 4)}, shards={"train": 1})),
    "l5kit": lambda p: write_l5kit(str(p), SyntheticL5Kit(scene_lengths=(5, 4), frames_chunk=4, agents_chunk=20)),
}


@pytest.fixture(scope="module")
def originals(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    for name, write in WRITERS.items():
        write(root / name)
    return root


# --- small editors -------------------------------------------------------------------------------

def _json(relative, change):
    def edit(src):
        path = src / relative
        value = json.loads(path.read_text())
        change(value)
        path.write_text(json.dumps(value))
    return edit


def _episodes(change):
    """Rewrite meta/episodes.parquet as a table: change(table) -> table."""
    def edit(src):
        path = src / "meta/episodes.parquet"
        pq.write_table(change(pq.read_table(path)), path)
    return edit


def _set_column(name, array):
    def change(table):
        return table.set_column(table.schema.get_field_index(name), name, array(table))
    return change


def _steps(change):
    def edit(src):
        for path in sorted(src.glob("data/chunk-*/steps.parquet")):
            pq.write_table(change(pq.read_table(path)), path)
    return edit


def _timestamps(values):
    """The first episode's step timestamps replaced (chunk 0 holds episodes 0 and 1: 4 + 3 steps)."""
    def change(table):
        column = table.column("timestamp").to_numpy().copy()
        column[: len(values)] = values
        return table.set_column(table.schema.get_field_index("timestamp"), "timestamp", pa.array(column))

    def edit(src):
        path = src / "data/chunk-000/steps.parquet"
        pq.write_table(change(pq.read_table(path)), path)
    return edit


def _video_files(first_path):
    def change(table):
        rows = table.column("video_files").to_pylist()
        rows[0] = {**rows[0], "cam_wrist": first_path}
        return table.set_column(table.schema.get_field_index("video_files"), "video_files", pa.array(rows))
    return _episodes(change)


def _fifo_video(src):
    target = src / "videos/cam_wrist/chunk-000/episode_000000.mp4"
    target.unlink()
    os.mkfifo(target)


def _outside_video(src):
    outside = src.parent / "outside.mp4"
    shutil.copy(src / "videos/cam_wrist/chunk-000/episode_000000.mp4", outside)
    _video_files(str(outside))(src)


def _flip_page_byte(relative, column):
    """Rewrite a Parquet file with page checksums, then flip one byte inside `column`'s first data page."""
    def edit(src):
        path = src / relative
        pq.write_table(pq.read_table(path), path, write_page_checksum=True, compression="none", use_dictionary=False)
        metadata = pq.ParquetFile(path).metadata
        index = next(i for i in range(metadata.num_columns) if metadata.schema.column(i).path.startswith(column))
        chunk = metadata.row_group(0).column(index)
        data = bytearray(path.read_bytes())
        data[chunk.data_page_offset + chunk.total_compressed_size - 3] ^= 0x10  # inside the page's values
        path.write_bytes(bytes(data))
    return edit


def _info(change):
    return _json("dataset_info.json", change)


def _first_split(change):
    return _info(lambda info: change(info["splits"][0]))


def _zarray(name, change):
    return _json(f"{name}/.zarray", change)


def _frames(change):
    """Rewrite the frames array (chunks of 4) after change(frames)."""
    from formats import storage
    from formats.sources.l5kit.zarr_v2 import ZarrArray

    def edit(src):
        fs, root = storage.open_root(str(src))
        frames = ZarrArray(fs, f"{root}/frames").read(0, 9)
        change(frames)
        shutil.rmtree(src / "frames")
        write_array(fs, f"{root}/frames", frames, 4)
    return edit


def _timestamp_frames(values):
    def change(frames):
        frames["timestamp"][: len(values)] = values
    return _frames(change)


def _symlinked_chunk(src):
    outside = src.parent / "outside_chunk"
    shutil.move(src / "agents/0", outside)
    os.symlink(outside, src / "agents/0")


RECIPES = [
    # ORTF: episodes.parquet of the wrong types
    ("ortf", "chunk_id_string", _episodes(_set_column("chunk_id", lambda t: t.column("chunk_id").cast(pa.string()))),
     "meta/episodes.parquet", r"column 'chunk_id' is string, expected an integer"),
    ("ortf", "chunk_id_float", _episodes(_set_column("chunk_id", lambda t: pa.array([0.5] * t.num_rows))),
     "meta/episodes.parquet", r"column 'chunk_id' is double, expected an integer"),
    ("ortf", "chunk_id_null", _episodes(_set_column("chunk_id", lambda t: pa.array([None] + [0] * (t.num_rows - 1), pa.int64()))),
     "meta/episodes.parquet", r"column 'chunk_id' is null in row 0"),
    ("ortf", "chunk_id_negative", _episodes(_set_column("chunk_id", lambda t: pa.array([-1] * t.num_rows))),
     "meta/episodes.parquet", r"chunk_id -1 in row 0 is negative"),
    ("ortf", "length_string", _episodes(_set_column("length", lambda t: t.column("length").cast(pa.string()))),
     "meta/episodes.parquet", r"column 'length' is string, expected an integer"),
    ("ortf", "length_absurd", _episodes(lambda t: t.set_column(t.schema.get_field_index("length"), "length", pa.array([10**12] * t.num_rows))
                                        .set_column(t.schema.get_field_index("end_step"), "end_step",
                                                    pa.compute.add(t.column("start_step"), pa.scalar(10**12)))),
     "meta/episodes.parquet", r"length 1000000000000 .*not plausible"),
    ("ortf", "episode_id_float", _episodes(_set_column("episode_id", lambda t: pa.array([0.5, 1.5, 2.5]))),
     "meta/episodes.parquet", r"column 'episode_id' is double, expected a string or an integer"),
    ("ortf", "duration_string", _episodes(_set_column("duration_seconds", lambda t: pa.array(["long"] * t.num_rows))),
     "meta/episodes.parquet", r"column 'duration_seconds' is string, expected a number"),
    ("ortf", "video_files_string", _episodes(_set_column("video_files", lambda t: pa.array(["videos/x.mp4"] * t.num_rows))),
     "meta/episodes.parquet", r"column 'video_files' is string, expected a struct of paths"),
    ("ortf", "video_file_absolute", _outside_video, "meta/episodes.parquet",
     r"video file '.*outside.mp4' is absolute; paths in metadata must be inside the dataset"),
    ("ortf", "video_file_escapes", _video_files("../outside.mp4"), "meta/episodes.parquet", r"video file '../outside.mp4' escapes the dataset root"),
    ("ortf", "video_file_fifo", _fifo_video, "meta/episodes.parquet",
     r"video file 'videos/cam_wrist/chunk-000/episode_000000.mp4' is a FIFO, not a regular file; refused without opening it"),
    ("ortf", "tasks_not_utf8", lambda src: (src / "meta/tasks.jsonl").write_bytes(b'{"task_id": 0, "instruction": "\xff\xfe"}\n'),
     "meta/tasks.jsonl", r"not UTF-8 text"),
    # ORTF: manifest of the wrong types
    ("ortf", "images_list", _json("meta/manifest.json", lambda m: m["observation_space"].update(images=["cam_wrist"])),
     "meta/manifest.json", r"observation_space.images must be an object, found list"),
    ("ortf", "state_list", _json("meta/manifest.json", lambda m: m["observation_space"].update(state=["joint_positions"])),
     "meta/manifest.json", r"observation_space.state must be an object, found list"),
    ("ortf", "state_dim_string", _json("meta/manifest.json", lambda m: m["observation_space"]["state"]["ee_position"].update(dim="three")),
     "meta/manifest.json", r"observation_space.state.ee_position.dim must be a positive integer, found 'three'"),
    ("ortf", "state_dim_huge", _json("meta/manifest.json", lambda m: m["observation_space"]["state"]["ee_position"].update(dim=10**12)),
     "meta/manifest.json", r"observation_space.state.ee_position.dim 1000000000000 is not plausible"),
    ("ortf", "sensor_fps_string", _json("meta/manifest.json", lambda m: m["sensors"][0].update(fps="fast")),
     "meta/manifest.json", r"sensors\[0\].fps must be a positive number, found 'fast'"),
    ("ortf", "joint_index_string", _json("meta/manifest.json", lambda m: m["robot"]["joints"][3].update(index="four")),
     "meta/manifest.json", r"robot.joints\[3\].index must be an integer, found 'four'"),
    ("ortf", "action_dims_not_list", _json("meta/manifest.json", lambda m: m["action_space"].update(dimensions={"x": 1})),
     "meta/manifest.json", r"action_space.dimensions must be a list, found dict"),
    ("ortf", "rate_absurd", _json("meta/manifest.json", lambda m: m["action_space"].update(control_frequency_hz=1e300)),
     "meta/manifest.json", r"control_frequency_hz 1e\+300 is not plausible"),
    # ORTF: clocks
    ("ortf", "nan_first_timestamp", _timestamps([np.nan]), "data/chunk-000/steps.parquet",
     r"ep-0000_kitchen_0: timestamp: non-finite value nan at step 0$"),
    ("ortf", "reversed_timestamps", _timestamps([0.3, 0.2, 0.1, 0.0]), "data/chunk-000/steps.parquet",
     r"timestamp: not strictly increasing at step 1 \(value 0.3 then 0.2\)$"),
    ("ortf", "fps_contradicted", _timestamps([0.0, 0.5, 1.0, 1.5]), "data/chunk-000/steps.parquet",
     r"timestamp: median step 0.5 s contradicts the declared 15 fps"),
    ("ortf", "timestamp_string", _steps(_set_column("timestamp", lambda t: t.column("timestamp").cast(pa.string()))),
     "data/chunk-000/steps.parquet", r"step column 'timestamp' is string, expected a number"),
    # ORTF: a flipped bit in a checksummed page
    ("ortf", "steps_page_checksum", _flip_page_byte("data/chunk-000/steps.parquet", "action"), "data/chunk-000/steps.parquet",
     r"CRC checksum verification failed"),
    ("ortf", "episodes_page_checksum", _flip_page_byte("meta/episodes.parquet", "operator_notes"), "meta/episodes.parquet",
     r"CRC checksum verification failed"),
    # RLDS: dataset_info.json and features.json
    ("rlds", "splits_string", _info(lambda i: i.update(splits="train")), "dataset_info.json", r"splits must be a list of objects, found 'train'"),
    ("rlds", "split_without_name", _first_split(lambda s: s.pop("name")), "dataset_info.json", r"splits\[0\] has no name"),
    ("rlds", "shard_lengths_words", _first_split(lambda s: s.update(shardLengths=["three"])), "dataset_info.json",
     r"splits\[0\].shardLengths must be a list of non-negative integers, found \['three'\]"),
    ("rlds", "shard_lengths_absurd", _first_split(lambda s: s.update(shardLengths=[str(10**12)])), "dataset_info.json",
     r"shardLengths .*1000000000000.* not plausible"),
    ("rlds", "num_shards_absurd", _first_split(lambda s: s.pop("shardLengths") and s.update(numShards=10**12)), "dataset_info.json",
     r"numShards 1000000000000 is not plausible"),
    ("rlds", "template_placeholder", _first_split(lambda s: s.update(filepathTemplate="{DATASET}-{NOPE}")), "dataset_info.json",
     r"filepathTemplate '\{DATASET\}-\{NOPE\}' has an unknown placeholder 'NOPE'"),
    ("rlds", "template_not_string", _first_split(lambda s: s.update(filepathTemplate=7)), "dataset_info.json",
     r"filepathTemplate must be a string, found 7"),
    ("rlds", "template_escapes", _first_split(lambda s: s.update(filepathTemplate="../{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}")),
     "dataset_info.json", r"shard '../synthetic_rlds-train.tfrecord-00000-of-00001' escapes the dataset root"),
    ("rlds", "name_list", _info(lambda i: i.update(name=["x"])), "dataset_info.json", r"name must be a string, found \['x'\]"),
    ("rlds", "tensor_shape_huge", _json("features.json", lambda f: _feature(f, "joint_torques")["tensor"].update(
        shape={"dimensions": ["1000000", "1000000"]})), "features.json", r"steps/joint_torques has shape \[1000000, 1000000\]: .*not plausible"),
    ("rlds", "tensor_shape_string", _json("features.json", lambda f: _feature(f, "joint_torques")["tensor"].update(shape="2x3")),
     "features.json", r"not a TFDS FeaturesDict"),
    # L5Kit: .zarray, .zattrs and clocks
    ("l5kit", "shape_string", _zarray("agents", lambda m: m.update(shape="5")), "agents/.zarray",
     r"shape '5' / chunks \[20\] must be lists of integers"),
    ("l5kit", "shape_absurd", _zarray("frames", lambda m: m.update(shape=[10**12])), "frames/.zarray", r"are not plausible sizes"),
    ("l5kit", "chunks_huge", _zarray("agents", lambda m: m.update(chunks=[10**9])), "agents/.zarray", r"are larger than 268435456 bytes"),
    ("l5kit", "compressor_string", _zarray("agents", lambda m: m.update(compressor="blosc")), "agents/.zarray",
     r"codec 'blosc' is not an object with an 'id'"),
    ("l5kit", "dtype_number", _zarray("scenes", lambda m: m.update(dtype=7)), "scenes/.zarray", r"scenes/.zarray: "),
    ("l5kit", "attrs_version_string", _json(".zattrs", lambda a: a.update(format_version="2")), ".zattrs", r"format_version '2' is not supported"),
    ("l5kit", "nan_free_reversed_clock", _timestamp_frames([5 * 10**8, 4 * 10**8, 3 * 10**8]), "frames",
     r"scene_000000: frames.timestamp: not strictly increasing at step 1 \(value 500000000 then 400000000\)$"),
    ("l5kit", "clock_at_20hz", _timestamp_frames(np.arange(5) * 5 * 10**7), "frames",
     r"scene_000000: frames.timestamp: median step 0.05 s contradicts the declared 10 fps"),
    ("l5kit", "timestamp_float", _zarray("frames", lambda m: m["dtype"].__setitem__(0, ["timestamp", "<f8"])), "frames/.zarray",
     r"field 'timestamp' is float64, the L5Kit format defines an integer"),
    ("l5kit", "start_time_text", _zarray("scenes", lambda m: m["dtype"].__setitem__(2, ["start_time", "<U8"])), "scenes/.zarray",
     r"field 'start_time' is <U8, the L5Kit format defines an integer"),
    ("l5kit", "field_shape_string", _zarray("agents", lambda m: m["dtype"].__setitem__(0, ["centroid", "<f8", "2"])), "agents/.zarray",
     r"invalid shape"),
    ("l5kit", "agent_interval_absurd", _frames(lambda f: f["agent_index_interval"].__setitem__(0, (0, 10**12))), "agents",
     r"agent_index_interval reaches \[0, 1000000000000\), outside"),
    ("l5kit", "chunk_symlink_out", _symlinked_chunk, "agents", r"zarr file 'agents/0' is a symlink to .*outside_chunk, outside the dataset root"),
]


def _feature(features, name):
    return features["featuresDict"]["features"]["steps"]["sequence"]["feature"]["featuresDict"]["features"][name]


@pytest.mark.parametrize("source, name, corrupt, blamed, message", RECIPES, ids=[f"{r[0]}-{r[1]}" for r in RECIPES])
def test_hostile_input_is_one_error_line_naming_the_file(originals, tmp_path, capsys, source, name, corrupt, blamed, message):
    src = tmp_path / source
    shutil.copytree(originals / source, src, symlinks=True)
    corrupt(src)
    status = convert.run([f"--input={src}", f"--output={tmp_path / 'out'}", "--progress=off", *(["--fps=10"] if source == "rlds" else [])])
    lines = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert status == convert.EXIT_FAILED and len(errors) == 1, lines
    assert "Traceback" not in "\n".join(lines)
    line = errors[0]
    assert f"{src}/{blamed}" in line, line
    assert re.search(message, line), line
    assert not (tmp_path / "out").exists()


def test_an_all_null_video_path_typed_null_still_converts(originals, tmp_path):
    """pandas/pyarrow type a struct field that is null in every row as `null`: legal, not a wrong type."""
    src = tmp_path / "ortf"
    shutil.copytree(originals / "ortf", src)
    _episodes(_set_column("video_files", lambda t: pa.array([{"cam_wrist": None}] * t.num_rows)))(src)
    assert pq.read_schema(src / "meta/episodes.parquet").field("video_files").type.field(0).type == pa.null()
    assert convert.run([f"--input={src}", f"--output={tmp_path / 'out'}", "--progress=off"]) == convert.EXIT_OK
    assert pq.read_table(tmp_path / "out/data").num_rows == 3
