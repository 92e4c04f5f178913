"""Write synthetic LeRobot v2.0 / v2.1 datasets as lerobot 0.3.x lays them out, and convert them
to v3.0 the way lerobot's own converter does.

`write_dataset` takes the v3.0 writer's `SyntheticLeRobot` spec (formats/sources/lerobot_v3/sample.py)
and writes the same kind of episodes (the same columns, values, frames and tasks, from the same
seed) in the v2 layout lerobot 0.3's LeRobotDataset.save_episode produces: one data file per episode
(`data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet`, `episode_chunk` =
episode_index // chunks_size), each camera's episode encoded alone into its own MP4
(`videos/chunk-XXX/<camera>/episode_XXXXXX.mp4`), meta/episodes.jsonl, meta/tasks.jsonl, and
meta/episodes_stats.jsonl (v2.1) or meta/stats.json and cameras' `video_info` (v2.0). The spec's `chunks_size` is the
chunk folder size; its per-file counts (`episodes_per_*_file`) are v3.0 notions and not used.

`convert_v21_to_v30` is lerobot 0.6's scripts/convert_dataset_v21_to_v30.py on a local copy,
step for step (data files concatenated through pandas, each camera's MP4s joined by stream copy
with `from_timestamp` the sum of the earlier files' stream durations, the episodes table from
episodes.jsonl plus the locators and `stats/...`, info.json rewritten), except that a new data or
video file is started after a number of episodes instead of a size in MB, so that small tests get
several files and chunks. The tests convert both layouts and compare the output.
"""

from __future__ import annotations

import dataclasses
import io
import json
import posixpath

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from formats import samples, storage
from formats.sources.lerobot_v3.sample import (
    SyntheticLeRobot,
    camera_frames,
    concatenate_videos,
    encode_camera,
    episode_columns,
    episode_stats,
    info_json,
    truth_lists,
    write_json,
)

__all__ = ["DATA_TEMPLATE", "VIDEO_TEMPLATE", "write_dataset", "convert_v21_to_v30"]

DATA_TEMPLATE = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
VIDEO_TEMPLATE = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
V30_DATA = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
V30_VIDEO = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"


def write_dataset(url: str, spec: SyntheticLeRobot | None = None, *, version: str = "v2.1",
                  extra_video_frames: dict[int, int] | None = None) -> dict:
    """Write a v2.0 or v2.1 dataset under `url` and return the values written per episode (the
    v3.0 writer's `truth`). `extra_video_frames`: {episode: n} gives that episode's MP4s n frames
    more than its rows (a recording artefact of lerobot 0.3: the encoder flushed late frames)."""
    spec = spec or SyntheticLeRobot(codec="h264", gop=2)
    extra_video_frames = extra_video_frames or {}
    fs, root = storage.open_root(url)
    rng = np.random.default_rng(spec.seed)
    truth = truth_lists(spec)
    episodes, stats_lines, global_index = [], [], 0
    for episode, length in enumerate(spec.lengths):
        columns, task_index = episode_columns(spec, rng, episode, global_index, truth)
        chunk = episode // spec.chunks_size
        path = storage.join(root, DATA_TEMPLATE.format(episode_chunk=chunk, episode_index=episode))
        fs.makedirs(posixpath.dirname(path), exist_ok=True)
        with fs.open(path, "wb") as handle:
            pq.write_table(pa.table(columns), handle)
        episodes.append({"episode_index": episode, "tasks": [spec.tasks[int(i)] for i in dict.fromkeys(task_index.tolist())],
                         "length": length})
        stats_lines.append({"episode_index": episode, "stats": {
            "observation.state": episode_stats(truth["state"][-1]), "action": episode_stats(truth["action"][-1])}})
        global_index += length
    for number, camera in enumerate(spec.cameras):
        for episode in range(len(spec.lengths)):
            frames = camera_frames(spec, episode, number, False)
            truth["frames"][camera].append(frames)
            extra = extra_video_frames.get(episode, 0)
            if extra:  # the same frames, then `extra` more of the same motion
                longer = dataclasses.replace(spec, lengths=tuple(n + extra if i == episode else n for i, n in enumerate(spec.lengths)))
                frames = camera_frames(longer, episode, number, False)
            path = storage.join(root, VIDEO_TEMPLATE.format(episode_chunk=episode // spec.chunks_size, video_key=camera, episode_index=episode))
            fs.makedirs(posixpath.dirname(path), exist_ok=True)
            fs.pipe_file(path, encode_camera(spec, frames, False, continuous=False))
    _jsonl(fs, storage.join(root, "meta/episodes.jsonl"), episodes)
    _jsonl(fs, storage.join(root, "meta/tasks.jsonl"), [{"task_index": i, "task": task} for i, task in enumerate(spec.tasks)])
    if version == "v2.1":
        _jsonl(fs, storage.join(root, "meta/episodes_stats.jsonl"), stats_lines)
    else:
        all_values = {name: np.concatenate(truth[key]) for name, key in (("observation.state", "state"), ("action", "action"))}
        write_json(fs, storage.join(root, "meta/stats.json"), {name: episode_stats(values) for name, values in all_values.items()})
    write_json(fs, storage.join(root, "meta/info.json"), _info_v2(spec, global_index, version))
    return truth


def _info_v2(spec: SyntheticLeRobot, total_frames: int, version: str) -> dict:
    """info.json as lerobot 0.3's create_empty_dataset_info writes it, with the v3.0 writer's features."""
    v3 = info_json(spec, total_frames)
    episodes = len(spec.lengths)
    return {
        "codebase_version": version,
        "robot_type": v3["robot_type"],
        "total_episodes": episodes,
        "total_frames": total_frames,
        "total_tasks": len(spec.tasks),
        "total_videos": episodes * len(spec.cameras),
        "total_chunks": (episodes + spec.chunks_size - 1) // spec.chunks_size,
        "chunks_size": spec.chunks_size,
        "fps": spec.fps,
        "splits": v3["splits"],
        "data_path": DATA_TEMPLATE,
        "video_path": VIDEO_TEMPLATE if spec.cameras else None,
        "features": v3["features"] if version == "v2.1" else {key: _v20_feature(feature) for key, feature in v3["features"].items()},
    }


def _v20_feature(feature: dict) -> dict:
    """v2.0 as lerobot 0.3's v1 -> v2.0 converter left it (most v2.0 datasets on the Hub): a
    camera's stream facts under `video_info`, not `info`."""
    if feature["dtype"] != "video":
        return feature
    return {("video_info" if key == "info" else key): value for key, value in feature.items()}


def _jsonl(fs, path: str, rows: list[dict]) -> None:
    fs.makedirs(posixpath.dirname(path), exist_ok=True)
    fs.pipe_file(path, "".join(json.dumps(row) + "\n" for row in rows).encode())


# --- lerobot's v2.1 -> v3.0 converter, on a local folder ------------------------------------------


def convert_v21_to_v30(source: str, target: str, *, episodes_per_data_file: int = 2, episodes_per_video_file: int = 2,
                       chunks_size: int = 2) -> None:
    """What `python -m lerobot.scripts.convert_dataset_v21_to_v30 --root=SOURCE` writes (lerobot 0.6.1),
    under `target`. Files roll over after a count of episodes instead of a size in MB."""
    fs, src = storage.open_root(source)
    _, dst = storage.open_root(target)
    info = json.loads(fs.cat_file(storage.join(src, "meta/info.json")))
    if info["codebase_version"] != "v2.1":
        raise ValueError(f"Local dataset has codebase version '{info['codebase_version']}', expected 'v2.1'.")
    # convert_tasks: a DataFrame indexed by the task text (named "task"), written by pandas.
    tasks = [json.loads(line) for line in fs.cat_file(storage.join(src, "meta/tasks.jsonl")).decode().splitlines() if line.strip()]
    tasks.sort(key=lambda row: row["task_index"])
    pd = _pandas()
    frame = pd.DataFrame({"task_index": [t["task_index"] for t in tasks]}, index=pd.Index([t["task"] for t in tasks], name="task"))
    fs.makedirs(storage.join(dst, "meta"), exist_ok=True)
    frame.to_parquet(storage.join(dst, "meta/tasks.parquet"))
    episodes_metadata = _convert_data(fs, src, dst, info, episodes_per_data_file, chunks_size)
    videos_metadata = _convert_videos(fs, src, dst, info, episodes_per_video_file, chunks_size)
    legacy = sorted((json.loads(line) for line in fs.cat_file(storage.join(src, "meta/episodes.jsonl")).decode().splitlines() if line.strip()),
                    key=lambda row: row["episode_index"])
    stats = sorted((json.loads(line) for line in fs.cat_file(storage.join(src, "meta/episodes_stats.jsonl")).decode().splitlines()
                    if line.strip()), key=lambda row: row["episode_index"])
    rows = []
    for number, (data, old, stat) in enumerate(zip(episodes_metadata, legacy, stats, strict=True)):
        video = videos_metadata[number] if videos_metadata is not None else {}
        ids = {data["episode_index"], old["episode_index"], stat["episode_index"], *([video["episode_index"]] if video else [])}
        if len(ids) != 1:
            raise ValueError(f"Number of episodes is not the same ({ids}).")
        row = {**data, **video, **old}
        for feature, values in stat["stats"].items():
            for name, value in values.items():
                row[f"stats/{feature}/{name}"] = value
        row["meta/episodes/chunk_index"], row["meta/episodes/file_index"] = 0, 0
        rows.append(row)
    path = storage.join(dst, "meta/episodes/chunk-000/file-000.parquet")
    fs.makedirs(posixpath.dirname(path), exist_ok=True)
    with fs.open(path, "wb") as handle:
        pq.write_table(pa.Table.from_pylist(rows), handle)
    # convert_info
    info["codebase_version"] = "v3.0"
    del info["total_chunks"], info["total_videos"]
    info["data_files_size_in_mb"], info["video_files_size_in_mb"] = 100, 200
    info["data_path"] = V30_DATA
    info["video_path"] = V30_VIDEO if info["video_path"] is not None else None
    info["fps"] = int(info["fps"])
    for feature in info["features"].values():
        if feature["dtype"] != "video":
            feature["fps"] = info["fps"]
    write_json(fs, storage.join(dst, "meta/info.json"), info)


def _next(chunk: int, file: int, chunks_size: int) -> tuple[int, int]:
    """lerobot's update_chunk_file_indices."""
    return (chunk + 1, 0) if file + 1 == chunks_size else (chunk, file + 1)


def _sorted_files(fs, folder: str, pattern: str) -> list[str]:
    return sorted(path for path in fs.glob(storage.join(folder, pattern)))


def _convert_data(fs, src: str, dst: str, info: dict, per_file: int, chunks_size: int) -> list[dict]:
    image_keys = [key for key, feature in info["features"].items() if feature["dtype"] == "image"]
    paths = _sorted_files(fs, storage.join(src, "data"), "*/*.parquet")
    chunk = file = frames = 0
    batch, metadata = [], []
    for number, path in enumerate(paths):
        if len(batch) == per_file:
            _concat_data(fs, batch, storage.join(dst, V30_DATA.format(chunk_index=chunk, file_index=file)), image_keys)
            chunk, file = _next(chunk, file, chunks_size)
            batch = []
        rows = pq.ParquetFile(fs.open(path, "rb")).metadata.num_rows
        metadata.append({"episode_index": number, "data/chunk_index": chunk, "data/file_index": file,
                         "dataset_from_index": frames, "dataset_to_index": frames + rows})
        frames += rows
        batch.append(path)
    if batch:
        _concat_data(fs, batch, storage.join(dst, V30_DATA.format(chunk_index=chunk, file_index=file)), image_keys)
    return metadata


def _concat_data(fs, paths: list[str], target: str, image_keys: list[str]) -> None:
    """concat_data_files: pandas reads, concatenates and writes (fixed-size vectors come back as
    list<float>); image columns written as Hugging Face Image storage, struct<bytes, path>."""
    pd = _pandas()
    frame = pd.concat([pd.read_parquet(fs.open(path, "rb")) for path in paths], ignore_index=True)
    schema = None
    if image_keys:
        schema = pa.Schema.from_pandas(frame)
        image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
        schema = pa.schema([pa.field(f.name, image) if f.name in image_keys else f for f in schema])
    fs.makedirs(posixpath.dirname(target), exist_ok=True)
    with fs.open(target, "wb") as handle:
        frame.to_parquet(handle, index=False, schema=schema)


def _convert_videos(fs, src: str, dst: str, info: dict, per_file: int, chunks_size: int) -> list[dict] | None:
    keys = sorted(key for key, feature in info["features"].items() if feature["dtype"] == "video")
    if not keys:
        return None
    per_camera = [_convert_camera(fs, src, dst, key, per_file, chunks_size) for key in keys]
    return [{k: v for part in parts for k, v in part.items()} for parts in zip(*per_camera, strict=True)]


def _duration(blob: bytes) -> float:
    """get_video_duration_in_s: the stream's duration (else the container's) in seconds."""
    with av.open(io.BytesIO(blob)) as container:
        stream = container.streams.video[0]
        if stream.duration is not None:
            return float(stream.duration * stream.time_base)
        return float(container.duration / av.time_base)


def _convert_camera(fs, src: str, dst: str, key: str, per_file: int, chunks_size: int) -> list[dict]:
    paths = _sorted_files(fs, storage.join(src, "videos"), f"*/{key}/*.mp4")
    chunk = file = 0
    duration = 0.0
    batch, metadata = [], []

    def flush():
        target = storage.join(dst, V30_VIDEO.format(video_key=key, chunk_index=chunk, file_index=file))
        fs.makedirs(posixpath.dirname(target), exist_ok=True)
        concatenate_videos(batch, fs, target)

    for number, path in enumerate(paths):
        blob = fs.cat_file(path)
        if len(batch) == per_file:
            flush()
            chunk, file = _next(chunk, file, chunks_size)
            duration, batch = 0.0, []
        length = _duration(blob)
        metadata.append({"episode_index": number, f"videos/{key}/chunk_index": chunk, f"videos/{key}/file_index": file,
                         f"videos/{key}/from_timestamp": duration, f"videos/{key}/to_timestamp": duration + length})
        duration += length
        batch.append(blob)
    if batch:
        flush()
    return metadata


def _small(path: str) -> dict:
    """Three episodes over two chunk folders, two H.264 cameras, a PNG camera, a task change mid-episode."""
    return write_dataset(path, SMALL)


SMALL = SyntheticLeRobot(lengths=(12, 9, 15), codec="h264", gop=2, chunks_size=2, image_cameras=("observation.images.top",),
                         multi_task_episodes=(1,))


def _bundled(path: str, episodes: int) -> str:
    lengths = tuple(30 + (7 * i) % 23 for i in range(episodes))
    write_dataset(path, SyntheticLeRobot(lengths=lengths, codec="h264", gop=2, chunks_size=5, multi_task_episodes=(3,)))
    return f"a lerobot_v2 (v2.1) sample with {episodes} episodes ({sum(lengths)} frames)"


samples.register(samples.Sample("lerobot_v2", _small, _bundled))


def _pandas():
    """pandas, which this writer goes through as lerobot 0.3 does (its metadata and index columns in
    the files); imported here, not with the module: the sample registry loads every writer, and a
    plain install (no pandas) runs `make_sample` for the other formats."""
    try:
        import pandas
    except ImportError:
        raise ImportError("the lerobot_v2 sample is written through pandas, as lerobot writes it: pip install pandas") from None
    return pandas
