"""LeRobot dataset v2.0 and v2.1 reader: the layout lerobot 0.3.x writes, read in place.

Layout (lerobot 0.3.x datasets/utils.py), every path from meta/info.json's templates:
  meta/info.json              codebase_version "v2.0" | "v2.1", features, fps, chunks_size,
                              data_path  (`data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet`),
                              video_path (`videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4`)
  meta/episodes.jsonl         one line per episode: episode_index, tasks, length (and any field a tool added)
  meta/tasks.jsonl            one line per task: task_index, task
  meta/episodes_stats.jsonl   v2.1: per-episode statistics; v2.0 has meta/stats.json instead. Neither
                              is read: statistics are recomputed from the values, as for v3.0.
  one data file per episode; one MP4 per camera per episode (the whole file is the episode);
  `image` features as PNG bytes in the data file; `episode_chunk` = episode_index // chunks_size.

What the episodes become is defined by lerobot's own v2.1 -> v3.0 converter (lerobot 0.6
scripts/convert_dataset_v21_to_v30.py): every field the plan publishes and every value a row holds
is the one a conversion of the converted dataset gives (tests/formats/test_lerobot_v2.py writes both
and compares the shards byte for byte); the shared planning is formats/sources/lerobot_v3's
`plan_episodes`, this module only reads the v2 metadata and says where an episode's files are.

Frames: lerobot 0.3's reader shows, for a data row, the frame of the camera's MP4 presented at that
row's `timestamp` (within tolerance_s = 1e-4 s, else it fails). An episode with video is therefore
read only when its timestamps are i / fps within that tolerance (formats/sources/lerobot_v2/rows.py);
frames the MP4 holds past the episode's rows are never shown by lerobot, and not copied here.
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
from typing import ClassVar

import fsspec
import pyarrow as pa

from formats import sources, storage
from formats.errors import FormatError
from formats.sequence import DatasetMeta, VideoSegment
from formats.sources import Source
from formats.sources.lerobot_v2.rows import EPISODES_PATH, TOLERANCE_S, Reader
from formats.sources.lerobot_v3 import INFO_PATH, MAX_EPISODE_FRAMES, Layout, is_v2, plan_episodes, require
from formats.sources.lerobot_v3.rows import EpisodeRef

__all__ = ["FORMAT", "SUPPORTED_VERSIONS", "TOLERANCE_S", "detect", "plan"]

FORMAT = "lerobot_v2"
SUPPORTED_VERSIONS = ("v2.0", "v2.1")
TASKS_PATH = "meta/tasks.jsonl"
# A larger episodes.jsonl is not an episode index (a million episodes take about 100 MB).
MAX_JSONL_BYTES = 1 << 30


def detect(fs: fsspec.AbstractFileSystem, root: str) -> bool:
    """meta/info.json whose codebase_version is v2.x (formats/sources/lerobot_v3 takes the others)."""
    path = storage.join(root, INFO_PATH)
    if not fs.exists(path):
        return False
    try:
        return is_v2(storage.read_json(fs, path).get("codebase_version"))
    except FormatError:
        return False  # malformed: lerobot_v3 claims it and says what is wrong


@dataclasses.dataclass(frozen=True)
class V2Layout(Layout):
    """One data file per episode and one MP4 per camera per episode, in chunk folders of
    `chunks_size` episodes: the templates take `episode_chunk` and `episode_index` (lerobot 0.3's
    get_data_file_path / get_video_file_path)."""

    chunks_size: int = 1000
    shared_data_files: ClassVar[bool] = False

    def data_file(self, row: dict, shared: dict) -> str:
        index = row["episode_index"]
        return self.fill(shared, "data_path", episode_chunk=index // self.chunks_size, episode_index=index)

    def video(self, row: dict, key: str, length: int, fps: float, shared: dict) -> VideoSegment:
        """The whole MP4, as the frames presented in [0, length / fps): the ones lerobot's reader
        shows for timestamps 0 .. (length - 1) / fps (the converter gives the same span of its
        joined file). A file with fewer frames is refused when it is copied."""
        index = row["episode_index"]
        if self.video_template is None:
            raise FormatError(f"{self.info_path}: episode_{index:06d}: camera {key!r} is a video feature but info.json has no video_path")
        path = self.fill(shared, "video_path", episode_chunk=index // self.chunks_size, video_key=key, episode_index=index)
        return VideoSegment(path, length, 0.0, length / fps)


def plan(fs: fsspec.AbstractFileSystem, root: str, options: dict | None = None) -> tuple[DatasetMeta, list[EpisodeRef]]:
    """Read metadata only (info.json, episodes.jsonl, tasks.jsonl, the data files' footers) and
    return the output schema and one EpisodeRef per line of episodes.jsonl, in episode order."""
    info_path = storage.resolve_inside(root, INFO_PATH, what="info.json", fs=fs)
    info = storage.read_json(fs, info_path, missing="not found; a LeRobot v2.x dataset needs meta/info.json")
    version = info.get("codebase_version")
    if version not in SUPPORTED_VERSIONS:
        raise FormatError(f"{info_path}: codebase_version {version!r} is not supported "
                          f"(the lerobot_v2 source reads {' and '.join(SUPPORTED_VERSIONS)}, lerobot_v3 reads v3.0)")
    chunks_size = require(info, "chunks_size", int, info_path)
    if chunks_size <= 0:
        raise FormatError(f"{info_path}: 'chunks_size' must be a positive number of episodes per chunk folder, found {chunks_size}")
    layout = V2Layout(require(info, "data_path", str, info_path), info.get("video_path"), info_path, chunks_size)
    episodes = _read_episodes(fs, root)
    _check_data_files(fs, root, layout, episodes)
    tasks = _read_tasks(fs, root)
    meta, refs = plan_episodes(fs, root, info, layout, episodes, tasks, FORMAT, EPISODES_PATH)
    _check_no_unlisted_files(fs, root, refs)
    return meta, refs


# --- metadata -----------------------------------------------------------------------------------


def _jsonl(fs, root: str, relative: str, what: str) -> tuple[str, list[dict]]:
    """A JSON Lines file's objects (blank lines skipped); a bad line is one error naming its number."""
    path = storage.resolve_inside(root, relative, what=what, fs=fs)
    if not fs.exists(path):
        raise FormatError(f"{path}: not found; a LeRobot v2.x dataset needs {relative}")
    storage.check_regular(fs, path)
    if fs.size(path) > MAX_JSONL_BYTES:
        raise FormatError(f"{path}: {fs.size(path)} bytes is not plausible for {what}")
    rows = []
    for number, line in storage.text_lines(fs, path):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise FormatError(f"{path}: line {number}: malformed JSON: {error}") from error
        if not isinstance(row, dict):
            raise FormatError(f"{path}: line {number}: expected a JSON object, found {type(row).__name__}")
        rows.append((number, row))
    return path, rows


def _integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _read_episodes(fs, root: str) -> pa.Table:
    """meta/episodes.jsonl as the episode index plan_episodes reads: sorted by episode_index,
    with `dataset_from_index` / `dataset_to_index` counted over the episodes in that order (what
    the converter writes); the other fields of a line are episode-level fields (kept as columns)."""
    path, lines = _jsonl(fs, root, EPISODES_PATH, "episode index")
    if not lines:
        raise FormatError(f"{path}: no episodes")
    rows = []
    for number, row in lines:
        index, length, tasks = row.get("episode_index"), row.get("length"), row.get("tasks", [])
        if not _integer(index) or index < 0:
            raise FormatError(f"{path}: line {number}: episode_index must be a non-negative integer, found {index!r}")
        if not _integer(length) or not 0 < length <= MAX_EPISODE_FRAMES:
            raise FormatError(f"{path}: line {number}: episode_{index:06d}: length must be a positive number of frames, found {length!r}")
        if not isinstance(tasks, list) or not all(isinstance(task, str) for task in tasks):
            raise FormatError(f"{path}: line {number}: episode_{index:06d}: tasks must be a list of strings, found {tasks!r}")
        rows.append(row)
    with_tasks = [("tasks" in row) for row in rows]
    if any(with_tasks) and not all(with_tasks):  # a line without them would become an episode without tasks
        number = next(number for (number, _), has in zip(lines, with_tasks) if not has)
        raise FormatError(f"{path}: line {number}: no tasks, where other lines list theirs")
    rows.sort(key=lambda row: row["episode_index"])
    start = 0
    for previous, row in zip([None, *rows], rows):
        if previous is not None and previous["episode_index"] == row["episode_index"]:
            raise FormatError(f"{path}: episode_index {row['episode_index']} appears more than once")
        row["dataset_from_index"], row["dataset_to_index"] = start, start + row["length"]
        start += row["length"]
    # Every field any line holds (from_pylist took the first line's fields: one the first line
    # lacked was dropped for every episode); a line without a field gets null there.
    names = list(dict.fromkeys(name for row in rows for name in row))
    try:
        table = pa.table({name: [row.get(name) for row in rows] for name in names})
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as error:
        raise FormatError(f"{path}: an episode field holds values of different types across lines, or an integer past "
                          f"64 bits: {error}") from error
    for field in table.schema:
        if _empty_struct(field.type):  # no Parquet writer can store it
            raise FormatError(f"{path}: episode field {field.name!r} holds only empty objects ({{}}) on every line that has it")
    return table


def _empty_struct(kind: pa.DataType) -> bool:
    if pa.types.is_struct(kind):
        return kind.num_fields == 0 or any(_empty_struct(kind.field(index).type) for index in range(kind.num_fields))
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return _empty_struct(kind.value_type)
    return False


def _read_tasks(fs, root: str) -> dict[int, str]:
    path, lines = _jsonl(fs, root, TASKS_PATH, "task table")
    tasks = {}
    for number, row in lines:
        index, text = row.get("task_index"), row.get("task")
        if not _integer(index) or not isinstance(text, str):
            raise FormatError(f"{path}: line {number}: expected {{\"task_index\": <int>, \"task\": <text>}}, found {row!r}")
        if index in tasks:
            raise FormatError(f"{path}: task_index {index} appears more than once")
        tasks[index] = text
    return tasks


def _check_data_files(fs, root: str, layout: V2Layout, episodes: pa.Table) -> None:
    """Every listed episode's data file, found by listing each data folder once, before the
    episodes are planned: a missing one was found by a worker after the whole plan (18 s and
    1.4 GB at 200,000 episodes). A template that cannot be filled is left to the plan to name."""
    shared: dict = {}
    listed: dict[str, set[str]] = {}
    for index in episodes.column("episode_index").to_pylist():
        try:
            relative = layout.data_file({"episode_index": index}, shared)
            path = storage.resolve_inside(root, relative, what="data file", fs=fs)
        except FormatError:
            return
        folder, name = path.rsplit("/", 1)
        if folder not in listed:
            listed[folder] = ({entry.rstrip("/").rsplit("/", 1)[-1] for entry in fs.ls(folder, detail=False)}
                              if fs.isdir(folder) else set())
        if name not in listed[folder]:
            raise FormatError(f"{path}: episode_{index:06d}: data file not found (episode {index})")


def _check_no_unlisted_files(fs, root: str, refs: list) -> None:
    """A data file beside the listed ones is an episode episodes.jsonl forgot: converting without
    it would drop it silently (lerobot's converter and its 0.3 reader both take every data file).
    Looked for in the folders of the listed files and in their sibling folders (another chunk)."""
    listed = {ref.data_file for ref in refs}
    folders = {posixpath.dirname(path) for path in listed}
    for parent in {posixpath.dirname(folder) for folder in folders if folder}:
        if parent:  # data/chunk-XXX: the other chunk folders too (not the root's folders: meta/, videos/)
            absolute = storage.resolve_inside(root, parent, what="data folder", fs=fs)
            if fs.isdir(absolute):
                folders |= {f"{parent}/{path.rstrip('/').rsplit('/', 1)[-1]}" for path in fs.ls(absolute, detail=False) if fs.isdir(path)}
    for folder in sorted(folders):
        absolute = storage.resolve_inside(root, folder, what="data folder", fs=fs) if folder else root
        if not fs.isdir(absolute):
            continue  # its files are missing: the plan or the load names the first one
        for entry in sorted(path.rstrip("/") for path in fs.ls(absolute, detail=False)):
            name = entry.rsplit("/", 1)[-1]
            relative = f"{folder}/{name}" if folder else name
            if name.endswith(".parquet") and not name.startswith(".") and relative not in listed:
                raise FormatError(f"{storage.join(root, relative)}: a data file that {EPISODES_PATH} does not list "
                                  f"({len(refs)} episodes listed); add its episode to {EPISODES_PATH} or move the file away")


class LeRobotV2(Source):
    id = FORMAT
    expects = "LeRobot v2.x expected meta/info.json with codebase_version v2.0 or v2.1"
    marker = "meta/info.json"
    shared_files = (TASKS_PATH,)  # info.json and episodes.jsonl are not shared: they change with every appended episode
    reader = Reader
    detect = staticmethod(detect)
    plan = staticmethod(plan)


SOURCE = sources.register(LeRobotV2())
