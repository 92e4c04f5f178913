"""Write synthetic LeRobot v3.0 datasets exactly as lerobot 0.4.4 and 0.6.1 lay them out.

Used by the tests (datasets with many data files, video files and chunk folders, H.264 with
B-frames, HEVC) and by `./run_local.sh` for its bundled sample. It reproduces what lerobot
really writes (see ../shared/fixtures/lerobot_v3/so100_tiny): each episode encoded on its own,
then joined into a camera's MP4 by stream copy, `from_timestamp` of an episode equal to the
previous one's `to_timestamp`; float32 `timestamp`; task text in the pandas index column of
meta/tasks.parquet; per-episode `stats/...` columns; episode-index files chunked like data.

With `lerobot_version="0.6.1"` and the options below, what lerobot 0.6 and its tools write (see
../shared/fixtures/lerobot_v3/*_lerobot061 and lerobot's datasets/dataset_tools.py): a `task`
column; `info.is_depth_map` and `video.g/crf/preset/fast_decode`; depth video as HEVC gray12le,
lossless, log-quantised 12-bit codes with B-frames; depth images as 16-bit TIFF; data files
rewritten through pandas (`list<float>` vectors) beside ones written later (`fixed_size_list`);
lerobot-annotate's language columns (`list<null>` in a file without annotations); and
convert_image_to_video_dataset's videos, many episodes in one encode (episodes start mid-GOP).

Why ~530 lines: one option per layout choice lerobot's writers make (files per chunk, codecs, depth,
images, annotations, pandas rewrites), each needing its part of the writer.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import pathlib
import posixpath
from collections.abc import Sequence as Seq
from fractions import Fraction

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from formats import samples, storage, video
from formats.errors import VideoError
from formats.video import encode_frames
from formats.video.policy import EncodeOptions, padded_size

__all__ = ["SyntheticLeRobot", "write_dataset", "synthetic_frames", "encode_image"]

encode_image = video.encode_image  # the samples' images are encoded where the export's are

DATA_TEMPLATE = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_TEMPLATE = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_TEMPLATE = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"


@dataclasses.dataclass
class SyntheticLeRobot:
    """What to write. Defaults mirror lerobot's (AV1, keyframe every 2 frames, 30 fps)."""

    lengths: Seq[int] = (40, 25, 31, 18)
    fps: int = 30
    state_dim: int = 6
    action_dim: int = 6
    cameras: Seq[str] = ("observation.images.front", "observation.images.wrist")
    image_cameras: Seq[str] = ()  # `image` features: frames as PNG/JPEG bytes inside the data Parquet
    image_format: str = "png"  # png | jpeg | png16 (16-bit gray depth images)
    depth_cameras: Seq[str] = ()  # video features with is_depth_map: uint16 depth, lossless FFV1 gray16le
    width: int = 64
    height: int = 48
    codec: str = "av1"
    gop: int | None = 2
    crf: int = 30
    preset: str | None = None  # None: SVT-AV1's fastest (12) for av1, the encoder default otherwise
    episodes_per_data_file: int = 1000
    episodes_per_video_file: int = 1000
    episodes_per_meta_file: int = 1000
    chunks_size: int = 1000
    tasks: Seq[str] = ("Pick up the cube.", "Open the drawer.")
    multi_task_episodes: Seq[int] = ()  # episodes whose second half switches to the next task
    extra_step_features: bool = False  # next.reward float32 [1], next.done bool [1], a float64 [2] sensor
    tasks_as_index: bool = True  # lerobot's pandas-index layout; False writes a `task` column
    splits: dict | None = None
    seed: int = 0
    # Benchmarks: > 0 encodes only this many distinct videos per camera and reuses them for the
    # other episodes (same length required), without keeping frames in the returned truth.
    video_variants: int = 0
    lerobot_version: str = "0.4.4"  # "0.6.1": `task` column, `info.is_depth_map`, video.g/crf/preset/fast_decode
    depth_codec: str = "ffv1"  # "hevc": lerobot 0.6's depth video (gray12le lossless, log-quantised codes, B-frames)
    depth_image_cameras: Seq[str] = ()  # `image` features: uint16 millimetres as TIFF bytes (lerobot 0.6)
    continuous_video: bool = False  # convert_image_to_video_dataset: a video file's episodes in one encode
    list_data_files: Seq[int] = ()  # data files rewritten through pandas (modify_tasks, merge_datasets): list<float>
    annotated_episodes: Seq[int] | None = None  # lerobot-annotate language columns (None: none); others hold []
    # None: one row group per episode (lerobot's streaming writer); N: data files as pandas' to_parquet
    # rewrites them (lerobot's merge and modify_tasks tools): row groups of N rows across episodes.
    data_row_group_rows: int | None = None


def synthetic_frames(episode: int, camera: int, length: int, height: int, width: int) -> np.ndarray:
    """[T, H, W, 3] uint8: a moving gradient whose colour depends on episode and camera."""
    y, x = np.mgrid[0:height, 0:width]
    frames = np.empty((length, height, width, 3), np.uint8)
    for t in range(length):
        frames[t, ..., 0] = (x * 4 + t * 3 + episode * 40) % 256
        frames[t, ..., 1] = (y * 5 + camera * 90 + t) % 256
        frames[t, ..., 2] = ((x + y) * 2 + episode * 17 + camera * 50) % 256
    return frames


def write_dataset(url: str, spec: SyntheticLeRobot | None = None) -> dict:
    """Write the dataset under `url` (any fsspec URL) and return the values written per episode.

    Returns {"state": [arrays], "action": [...], "frames": {camera: [arrays]}, ...} so tests can
    compare a conversion against the exact source values.
    """
    spec = spec or SyntheticLeRobot()
    fs, root = storage.open_root(url)
    rng = np.random.default_rng(spec.seed)
    truth = truth_lists(spec)
    episode_rows = []
    global_index = 0

    # Data rows, grouped into files of `episodes_per_data_file` episodes.
    data_files: dict[int, list[pa.Table]] = {}
    for episode, length in enumerate(spec.lengths):
        columns, task_index = episode_columns(spec, rng, episode, global_index, truth)
        if spec.annotated_episodes is not None:
            persistent, events = _annotations(episode, length, episode in spec.annotated_episodes, spec.fps)
            truth["language_persistent"].append(persistent)
            truth["language_events"].append(events)
        file_number = episode // spec.episodes_per_data_file
        data_files.setdefault(file_number, []).append(pa.table(columns))
        tasks = [spec.tasks[int(i)] for i in dict.fromkeys(task_index.tolist())]
        episode_rows.append({
            "episode_index": episode,
            "tasks": tasks,
            "length": length,
            "data/chunk_index": file_number // spec.chunks_size,
            "data/file_index": file_number % spec.chunks_size,
            "dataset_from_index": global_index,
            "dataset_to_index": global_index + length,
        })
        for name, values in (("observation.state", truth["state"][-1]), ("action", truth["action"][-1])):
            for stat, value in episode_stats(values).items():
                episode_rows[-1][f"stats/{name}/{stat}"] = value
        global_index += length
    for file_number, tables in data_files.items():
        path = storage.join(root, DATA_TEMPLATE.format(chunk_index=file_number // spec.chunks_size, file_index=file_number % spec.chunks_size))
        fs.makedirs(posixpath.dirname(path), exist_ok=True)
        if spec.annotated_episodes is not None:  # pyarrow infers the type per file, as lerobot-annotate lets it
            episodes = [e for e in range(len(spec.lengths)) if e // spec.episodes_per_data_file == file_number]
            for name in ("language_persistent", "language_events"):
                inferred = pa.array([row for e in episodes for row in truth[name][e]])
                bounds = np.cumsum([0] + [spec.lengths[e] for e in episodes])
                tables = [t.append_column(name, inferred.slice(int(a), int(b - a))) for t, a, b in zip(tables, bounds, bounds[1:])]
        if file_number in spec.list_data_files:  # pandas round trip: fixed-size vectors come back as list<float>
            tables = [t.cast(pa.schema([pa.field(f.name, pa.list_(f.type.value_type)) if pa.types.is_fixed_size_list(f.type) else f
                                        for f in t.schema])) for t in tables]
        with fs.open(path, "wb") as handle:
            with pq.ParquetWriter(handle, tables[0].schema, compression="snappy") as writer:
                if spec.data_row_group_rows:
                    writer.write_table(pa.concat_tables(tables), row_group_size=spec.data_row_group_rows)
                else:
                    for table in tables:  # one row group per episode, as lerobot's streaming writer does
                        writer.write_table(table)

    # Videos: each episode encoded alone, then joined per file by stream copy.
    for camera_number, camera in enumerate((*spec.cameras, *spec.depth_cameras)):
        depth = camera in spec.depth_cameras
        groups: dict[int, list[int]] = {}
        for episode in range(len(spec.lengths)):
            groups.setdefault(episode // spec.episodes_per_video_file, []).append(episode)
        variants: dict[int, bytes] = {}
        for file_number, episodes in groups.items():
            encoded = []
            if spec.continuous_video:
                chunk_index, file_index = file_number // spec.chunks_size, file_number % spec.chunks_size
                path = storage.join(root, VIDEO_TEMPLATE.format(video_key=camera, chunk_index=chunk_index, file_index=file_index))
                fs.makedirs(posixpath.dirname(path), exist_ok=True)
                clips = [camera_frames(spec, episode, camera_number, depth) for episode in episodes]
                truth["frames"][camera].extend(clips)
                fs.pipe_file(path, encode_camera(spec, np.concatenate(clips), depth, continuous=True))
                start = 0
                for episode in episodes:
                    row = episode_rows[episode]
                    row[f"videos/{camera}/chunk_index"], row[f"videos/{camera}/file_index"] = chunk_index, file_index
                    row[f"videos/{camera}/from_timestamp"] = start / spec.fps
                    row[f"videos/{camera}/to_timestamp"] = (start + spec.lengths[episode]) / spec.fps
                    start += spec.lengths[episode]
                continue
            for episode in episodes:
                variant = episode % spec.video_variants if spec.video_variants else None
                if variant is not None and variant in variants and spec.lengths[variant] == spec.lengths[episode]:
                    encoded.append(variants[variant])
                    continue
                frames = camera_frames(spec, episode, camera_number, depth)
                if variant is None:
                    truth["frames"][camera].append(frames)
                encoded.append(encode_camera(spec, frames, depth, continuous=False))
                if variant is not None:
                    variants[variant] = encoded[-1]
            chunk_index, file_index = file_number // spec.chunks_size, file_number % spec.chunks_size
            path = storage.join(root, VIDEO_TEMPLATE.format(video_key=camera, chunk_index=chunk_index, file_index=file_index))
            fs.makedirs(posixpath.dirname(path), exist_ok=True)
            bounds = concatenate_videos(encoded, fs, path)
            for episode, (start, end) in zip(episodes, bounds):
                row = episode_rows[episode]
                row[f"videos/{camera}/chunk_index"] = chunk_index
                row[f"videos/{camera}/file_index"] = file_index
                row[f"videos/{camera}/from_timestamp"] = start
                row[f"videos/{camera}/to_timestamp"] = end

    # Episode index, chunked like data.
    for start in range(0, len(episode_rows), spec.episodes_per_meta_file):
        file_number = start // spec.episodes_per_meta_file
        chunk_index, file_index = file_number // spec.chunks_size, file_number % spec.chunks_size
        rows = episode_rows[start:start + spec.episodes_per_meta_file]
        for row in rows:
            row["meta/episodes/chunk_index"] = chunk_index
            row["meta/episodes/file_index"] = file_index
        path = storage.join(root, EPISODES_TEMPLATE.format(chunk_index=chunk_index, file_index=file_index))
        fs.makedirs(posixpath.dirname(path), exist_ok=True)
        with fs.open(path, "wb") as handle:
            pq.write_table(pa.Table.from_pylist(rows), handle)

    _write_tasks(fs, root, spec)
    write_json(fs, storage.join(root, "meta/stats.json"), _dataset_stats(truth, spec))
    write_json(fs, storage.join(root, "meta/info.json"), info_json(spec, global_index))
    return truth


def truth_lists(spec: SyntheticLeRobot) -> dict:
    """The empty per-episode record `episode_columns` and the writers fill (values as written)."""
    return {"state": [], "action": [], "reward": [], "done": [], "sensor": [], "task_index": [],
            "frames": {c: [] for c in (*spec.cameras, *spec.image_cameras, *spec.depth_cameras, *spec.depth_image_cameras)},
            "images": {c: [] for c in (*spec.image_cameras, *spec.depth_image_cameras)},
            "language_persistent": [], "language_events": []}


def episode_columns(spec: SyntheticLeRobot, rng: np.random.Generator, episode: int, global_index: int, truth: dict) -> tuple[dict, np.ndarray]:
    """One episode's data columns as lerobot writes them (features, then timestamp, frame_index,
    episode_index, index, task_index), the values appended to `truth`; and its per-step task_index.
    Shared by the v3.0 writer and the v2.x one (formats/sources/lerobot_v2/sample.py)."""
    length = spec.lengths[episode]
    state = rng.normal(size=(length, spec.state_dim)).astype(np.float32)
    action = rng.normal(size=(length, spec.action_dim)).astype(np.float32)
    task = episode % len(spec.tasks)
    task_index = np.full(length, task, np.int64)
    if episode in spec.multi_task_episodes:
        task_index[length // 2:] = (task + 1) % len(spec.tasks)
    columns = {
        "observation.state": _fixed(state),
        "action": _fixed(action),
    }
    if spec.extra_step_features:
        reward = rng.random(length).astype(np.float32)
        done = np.zeros(length, bool)
        done[-1] = True
        sensor = rng.normal(size=(length, 2))
        columns.update({"next.reward": pa.array(reward), "next.done": pa.array(done), "observation.sensor": _fixed(sensor)})
        truth["reward"].append(reward)
        truth["done"].append(done)
        truth["sensor"].append(sensor)
    for number, camera in enumerate(spec.image_cameras):
        frames = synthetic_frames(episode, len(spec.cameras) + number, length, spec.height, spec.width)
        if spec.image_format == "png16":
            frames = (frames[..., 0].astype(np.uint16) * 251 + frames[..., 2]).astype(np.uint16)
        blobs = [encode_image(frame, spec.image_format) for frame in frames]
        columns[camera] = pa.StructArray.from_arrays(
            [pa.array(blobs, pa.binary()), pa.array([None] * length, pa.string())], names=["bytes", "path"])
        truth["frames"][camera].append(frames)
        truth["images"][camera].append(blobs)
    for number, camera in enumerate(spec.depth_image_cameras):
        depth = depth_millimetres(episode, 7 + number, length, spec.height, spec.width)
        blobs = [encode_image(frame, "tiff16") for frame in depth]
        columns[camera] = pa.StructArray.from_arrays(
            [pa.array(blobs, pa.binary()), pa.array([None] * length, pa.string())], names=["bytes", "path"])
        truth["frames"][camera].append(depth)
        truth["images"][camera].append(blobs)
    columns.update({
        "timestamp": pa.array((np.arange(length) / spec.fps).astype(np.float32)),
        "frame_index": pa.array(np.arange(length, dtype=np.int64)),
        "episode_index": pa.array(np.full(length, episode, np.int64)),
        "index": pa.array(np.arange(global_index, global_index + length, dtype=np.int64)),
        "task_index": pa.array(task_index),
    })
    truth["state"].append(state)
    truth["action"].append(action)
    truth["task_index"].append(task_index)
    return columns, task_index


def depth_millimetres(episode: int, camera: int, length: int, height: int, width: int) -> np.ndarray:
    """[T, H, W] uint16 millimetres: a ramp that uses the high byte, so 8 bits cannot hold it."""
    frames = synthetic_frames(episode, camera, length, height, width)
    return (frames[..., 0].astype(np.uint16) * 200 + frames[..., 1]).astype(np.uint16)


# lerobot 0.6's depth quantiser defaults (configs/video.py) and its formula (datasets/depth_utils.py).
DEPTH_MIN, DEPTH_MAX, DEPTH_SHIFT, DEPTH_QMAX = 0.01, 10.0, 3.5, 4095


def quantize_depth(millimetres: np.ndarray) -> np.ndarray:
    """lerobot's log quantiser: uint16 millimetres -> 12-bit codes (uint16 0..4095), in float32 as lerobot computes it."""
    depth = millimetres.astype(np.float32)
    low, high, shift = np.float32(DEPTH_MIN * 1000), np.float32(DEPTH_MAX * 1000), np.float32(DEPTH_SHIFT * 1000)
    log_min, log_max = np.log(float(low + shift)), np.log(float(high + shift))
    norm = (np.log(depth + shift) - log_min) / (log_max - log_min)
    return np.rint(norm * DEPTH_QMAX).clip(0, DEPTH_QMAX).astype(np.uint16)


def camera_frames(spec: SyntheticLeRobot, episode: int, camera_number: int, depth: bool) -> np.ndarray:
    if not depth:
        return synthetic_frames(episode, camera_number, spec.lengths[episode], spec.height, spec.width)
    millimetres = depth_millimetres(episode, camera_number, spec.lengths[episode], spec.height, spec.width)
    return quantize_depth(millimetres) if spec.depth_codec == "hevc" else millimetres


def hevc_depth_mp4(frames: np.ndarray, fps: float, params: str) -> bytes:
    """lerobot 0.6's depth video: 12-bit codes as HEVC gray12le, x265 with `params`."""
    buffer = io.BytesIO()
    output = av.open(buffer, mode="w", format="mp4")
    stream = output.add_stream("libx265", rate=Fraction(fps).limit_denominator(1001000))
    stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "gray12le"
    stream.options = {"x265-params": params}
    for index, codes in enumerate(frames):
        frame = av.VideoFrame.from_ndarray(codes, format="gray12le")
        frame.pts = index
        for packet in stream.encode(frame):
            output.mux(packet)
    for packet in stream.encode(None):
        output.mux(packet)
    output.close()
    return buffer.getvalue()


def _isolated_hevc_depth(frames: np.ndarray, fps: float, params: str) -> bytes:
    """`hevc_depth_mp4` in a process of its own. libx265 has written out of its buffers on small
    frames (formats/video/policy.py MIN_HEVC_WIDTH); in the writer of test data that corruption
    crashed a test process once, and may have been behind later refusals in it. A child that
    crashes is run once more (x265 lossless with fixed parameters writes the same bytes)."""
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory(prefix="hevc-depth-") as folder:
        source, target = f"{folder}/frames.npy", f"{folder}/out.mp4"
        np.save(source, frames)
        script = ("import sys, numpy, pathlib; from formats.sources.lerobot_v3.sample import hevc_depth_mp4; "
                  "pathlib.Path(sys.argv[2]).write_bytes(hevc_depth_mp4(numpy.load(sys.argv[1]), float(sys.argv[3]), sys.argv[4]))")
        root = str(pathlib.Path(__file__).resolve().parents[3])
        for attempt in range(2):
            done = subprocess.run([sys.executable, "-c", script, source, target, repr(fps), params], cwd=root, capture_output=True,
                                  text=True, timeout=300, env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
                                      root, os.environ.get("PYTHONPATH")]))})
            if done.returncode == 0:
                return pathlib.Path(target).read_bytes()
            if done.returncode > 0 or attempt:  # an error, not a crash (or a second crash): said as it is
                raise VideoError(f"the HEVC depth encode failed: {done.stderr.strip().splitlines()[-1:] or done.returncode}")
    raise AssertionError("unreachable")


def encode_camera(spec: SyntheticLeRobot, frames: np.ndarray, depth: bool, *, continuous: bool) -> bytes:
    """One MP4 of `frames`: RGB with the spec's codec; depth as FFV1 gray16le (synthetic 0.4.4
    layout) or lerobot 0.6's HEVC gray12le lossless (x265's default GOP and B-frames when
    continuous, as convert_image_to_video_dataset leaves them; keyint = gop per episode)."""
    buffer = io.BytesIO()
    if depth and spec.depth_codec == "hevc":
        keyint = "" if continuous else f":keyint={spec.gop or 2}:min-keyint=1"
        return _isolated_hevc_depth(frames, spec.fps, f"lossless=1:log-level=error:bframes=3{keyint}")
    options = EncodeOptions("ffv1", pix_fmt="gray16le") if depth else _encode_options(spec)
    if continuous and not depth and spec.codec == "hevc":
        options = dataclasses.replace(options, gop=max(options.gop or 0, 12))  # long GOPs: B-frames across episode ends
    try:
        encode_frames(frames, buffer, fps=spec.fps, options=options)
    except VideoError as error:
        # Seen twice in about a dozen suite runs, never alone (1,200 encodes of these frames under load
        # passed): SVT-AV1's last packets refused by the MP4 muxer ("Invalid argument" at the flush).
        # This writes test and sample data, whose encoders are deterministic: one more try gives the
        # bytes the first would have. A conversion's own encodes are not retried.
        if "Invalid argument" not in str(error):
            raise
        buffer = io.BytesIO()
        encode_frames(frames, buffer, fps=spec.fps, options=options)
    return buffer.getvalue()


def _annotations(episode: int, length: int, annotated: bool, fps: int) -> tuple[list, list]:
    """lerobot-annotate's per-step rows: the episode's persistent rows on every frame, events on
    the frame they fire (here frame 1, a `say` tool call). Not annotated: empty lists."""
    if not annotated:
        return [[] for _ in range(length)], [[] for _ in range(length)]
    persistent = [{"role": "assistant", "content": f"plan for episode {episode}", "style": "plan", "timestamp": 0.0,
                   "camera": None, "tool_calls": None},
                  {"role": "assistant", "content": "grasp the cube", "style": "subtask", "timestamp": float(np.float32(1 / fps)),
                   "camera": None, "tool_calls": None}]
    events = [[] for _ in range(length)]
    events[min(1, length - 1)] = [{"role": "assistant", "content": None, "style": None, "camera": None,
                                   "tool_calls": [{"type": "function", "function": {"name": "say", "arguments": {"text": f"hello {episode}"}}}]}]
    return [persistent for _ in range(length)], events


# lerobot's SAY_TOOL_SCHEMA (datasets/language.py): what lerobot-annotate adds to info.json `tools`.
SAY_TOOL = {"type": "function", "function": {"name": "say", "description": "Speak a short utterance to the user via the TTS executor.",
                                             "parameters": {"type": "object", "properties": {"text": {"type": "string",
                                                            "description": "The verbatim text to speak."}}, "required": ["text"]}}}


def _fixed(values: np.ndarray) -> pa.Array:
    return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values.shape[1])


def episode_stats(values: np.ndarray) -> dict:
    data = values.astype(np.float64)
    return {"min": data.min(0).tolist(), "max": data.max(0).tolist(), "mean": data.mean(0).tolist(),
            "std": data.std(0).tolist(), "count": [len(data)]}


def concatenate_videos(encoded: list[bytes], fs, path: str) -> list[tuple[float, float]]:
    """Join per-episode MP4s by packet copy, shifting timestamps; return [from, to) seconds."""
    bounds = []
    output_buffer = io.BytesIO()
    output = av.open(output_buffer, mode="w", format="mp4")
    out_stream = None
    offset_seconds = 0.0
    for blob in encoded:
        source = av.open(io.BytesIO(blob))
        stream = source.streams.video[0]
        if out_stream is None:
            out_stream = output.add_stream_from_template(stream, opaque=True)
            out_stream.time_base = stream.time_base
        time_base = stream.time_base
        offset = int(round(offset_seconds / time_base))
        frame_ticks = int(round(1 / (float(stream.average_rate) * time_base)))
        count = 0
        for packet in source.demux(stream):
            if packet.size == 0:
                continue
            packet.pts += offset
            if packet.dts is not None:
                packet.dts += offset
            packet.stream = out_stream
            output.mux(packet)
            count += 1
        source.close()
        end_seconds = float((offset + count * frame_ticks) * time_base)
        bounds.append((offset_seconds, end_seconds))
        offset_seconds = end_seconds
    output.close()
    fs.pipe_file(path, output_buffer.getvalue())
    return bounds


def _write_tasks(fs, root: str, spec: SyntheticLeRobot) -> None:
    indices = pa.array(range(len(spec.tasks)), pa.int64())
    texts = pa.array(list(spec.tasks), pa.string())
    if spec.tasks_as_index and spec.lerobot_version == "0.4.4":
        pandas_meta = {
            "index_columns": ["__index_level_0__"],
            "column_indexes": [],
            "columns": [
                {"name": "task_index", "field_name": "task_index", "pandas_type": "int64", "numpy_type": "int64", "metadata": None},
                {"name": None, "field_name": "__index_level_0__", "pandas_type": "unicode", "numpy_type": "object", "metadata": None},
            ],
            "attributes": {},
            "creator": {"library": "pyarrow", "version": pa.__version__},
        }
        table = pa.table({"task_index": indices, "__index_level_0__": texts})
        table = table.replace_schema_metadata({b"pandas": json.dumps(pandas_meta).encode()})
    else:
        table = pa.table({"task_index": indices, "task": texts})
    with fs.open(storage.join(root, "meta/tasks.parquet"), "wb") as handle:
        pq.write_table(table, handle)


def _dataset_stats(truth: dict, spec: SyntheticLeRobot) -> dict:
    stats = {}
    for name, key in (("observation.state", "state"), ("action", "action")):
        values = np.concatenate(truth[key]).astype(np.float64)
        stats[name] = {"min": values.min(0).tolist(), "max": values.max(0).tolist(), "mean": values.mean(0).tolist(),
                       "std": values.std(0).tolist(), "count": [len(values)]}
    return stats


def info_json(spec: SyntheticLeRobot, total_frames: int) -> dict:
    features = {
        "observation.state": {"dtype": "float32", "shape": [spec.state_dim], "names": [f"joint_{i}" for i in range(spec.state_dim)]},
        "action": {"dtype": "float32", "shape": [spec.action_dim], "names": [f"joint_{i}" for i in range(spec.action_dim)]},
    }
    if spec.extra_step_features:
        features["next.reward"] = {"dtype": "float32", "shape": [1], "names": None}
        features["next.done"] = {"dtype": "bool", "shape": [1], "names": None}
        features["observation.sensor"] = {"dtype": "float64", "shape": [2], "names": ["a", "b"]}
    # What the encoder really wrote: 4:2:0 pads odd sizes to even.
    width, height = padded_size(spec.width, spec.height, "yuv420p")
    new = spec.lerobot_version != "0.4.4"
    for camera in spec.cameras:
        features[camera] = {
            "dtype": "video",
            "shape": [height, width, 3],
            "names": ["height", "width", "channels"],
            "info": _video_info(new, False, {"video.height": height, "video.width": width, "video.codec": spec.codec,
                                             "video.pix_fmt": "yuv420p", "video.fps": spec.fps, "video.channels": 3, "has_audio": False,
                                             "video.g": spec.gop, "video.crf": spec.crf, "video.preset": spec.preset, "video.fast_decode": 0}),
        }
    for camera in spec.depth_cameras:
        hevc = spec.depth_codec == "hevc"
        info = {"video.height": spec.height, "video.width": spec.width, "video.codec": "hevc" if hevc else "ffv1",
                "video.pix_fmt": "gray12le" if hevc else "gray16le", "video.fps": spec.fps, "video.channels": 1, "has_audio": False}
        if hevc:
            info.update({"depth_unit": "mm", "video.g": spec.gop, "video.crf": 30, "video.preset": None, "video.fast_decode": 0,
                         "video.extra_options": {"x265-params": "lossless=1"}, "video.depth_min": DEPTH_MIN,
                         "video.depth_max": DEPTH_MAX, "video.shift": DEPTH_SHIFT, "video.use_log": True})
        features[camera] = {"dtype": "video", "shape": [spec.height, spec.width, 1], "names": ["height", "width", "channels"],
                            "info": _video_info(new, True, info)}
    for camera in spec.image_cameras:
        channels = 1 if spec.image_format == "png16" else 3
        features[camera] = {"dtype": "image", "shape": [spec.height, spec.width, channels], "names": ["height", "width", "channels"]}
        if new:
            features[camera]["info"] = {"is_depth_map": False}
    for camera in spec.depth_image_cameras:
        features[camera] = {"dtype": "image", "shape": [spec.height, spec.width, 1], "names": ["height", "width", "channels"],
                            "info": {"is_depth_map": True, "depth_unit": "mm"}}
    if spec.annotated_episodes is not None:
        for name in ("language_persistent", "language_events"):
            features[name] = {"dtype": "language", "shape": [1], "names": None}
    for name, dtype in (("timestamp", "float32"), ("frame_index", "int64"), ("episode_index", "int64"),
                        ("index", "int64"), ("task_index", "int64")):
        features[name] = {"dtype": dtype, "shape": [1], "names": None}
    episodes = len(spec.lengths)
    tools = {"tools": [SAY_TOOL]} if spec.annotated_episodes is not None else {}
    return {
        "codebase_version": "v3.0",
        "robot_type": "synthetic",
        "total_episodes": episodes,
        "total_frames": total_frames,
        "total_tasks": len(spec.tasks),
        "chunks_size": spec.chunks_size,
        "data_files_size_in_mb": 100,
        "video_files_size_in_mb": 200,
        "fps": spec.fps,
        "splits": spec.splits or {"train": f"0:{episodes}"},
        "data_path": DATA_TEMPLATE,
        "video_path": VIDEO_TEMPLATE,
        "features": features,
        **tools,
    }


def _video_info(new: bool, depth: bool, info: dict) -> dict:
    """lerobot 0.6 says `is_depth_map` and records its encoder settings; 0.4.4 `video.is_depth_map` and no settings."""
    if new:
        return {"is_depth_map": depth, **info}
    return {key: value for key, value in {**info, "video.is_depth_map": depth}.items()
            if key not in ("video.g", "video.crf", "video.preset", "video.fast_decode")}


def write_json(fs, path: str, value: dict) -> None:
    """JSON as lerobot writes it (indent 4), its folder made first."""
    fs.makedirs(posixpath.dirname(path), exist_ok=True)
    fs.pipe_file(path, (json.dumps(value, indent=4) + "\n").encode())


def _encode_options(spec: SyntheticLeRobot) -> EncodeOptions:
    """The sample's encode, with no PSNR floor: a floor only measures the frames (decoding every
    packet again, a seventh of a sample's writing), it never changes the bytes written here."""
    preset = spec.preset or ("12" if spec.codec == "av1" else None)
    return EncodeOptions(spec.codec, spec.crf, spec.gop, preset, min_psnr=0)


def _small(path: str) -> dict:
    return write_dataset(path, SyntheticLeRobot(lengths=(12, 9, 15), codec="h264", gop=None, episodes_per_video_file=2,
                                                episodes_per_data_file=2))


def _bundled(path: str, episodes: int) -> str:
    lengths = tuple(30 + (7 * i) % 23 for i in range(episodes))
    write_dataset(path, SyntheticLeRobot(lengths=lengths, episodes_per_data_file=5, episodes_per_video_file=4,
                                         episodes_per_meta_file=6, chunks_size=2, multi_task_episodes=(3,)))
    return f"a lerobot_v3 sample with {episodes} episodes ({sum(lengths)} frames)"


samples.register(samples.Sample("lerobot_v3", _small, _bundled))
