"""LeRobot v2.x episodes read on a worker: one episode's data file, whole, as a Sequence.

The rows become a Sequence exactly as for v3.0 (formats/sources/lerobot_v3/rows.py: the same
columns, checks and per-step tasks); what differs is how they are found. A v2 data file is one
episode, so it is read whole, and it must be the episode its name and episodes.jsonl say: every row
of that `episode_index` and as many rows as episodes.jsonl's `length` (lerobot's reader takes the
files as they are and would mix a misnamed file's rows into another episode).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from formats.errors import FormatError
from formats.sequence import FROM_IMAGES, VIDEO
from formats.sources import parquet_rows
from formats.sources.lerobot_v3 import rows
from formats.sources.lerobot_v3.rows import EpisodeRef, episode_columns

__all__ = ["Reader", "EPISODES_PATH", "TOLERANCE_S"]

EPISODES_PATH = "meta/episodes.jsonl"
# lerobot's LeRobotDataset(tolerance_s=1e-4): how far a row's timestamp may be from the time of the
# video frame it shows (decode_video_frames asserts it for every frame it returns).
TOLERANCE_S = 1e-4


class Reader(rows.Reader):
    """The v3.0 reader with v2's row lookup: the whole data file of the episode."""

    def episode_rows(self, path: str, ref: EpisodeRef) -> pa.Table:
        metadata, schema, columns = episode_columns(self.fs, path, ref, self.meta, self.footers)
        decoded = parquet_rows.read_row_groups(self.fs, path, metadata, range(metadata.num_row_groups), columns)
        table = parquet_rows.table_or_empty(list(decoded.values()), schema, columns)
        if table.num_rows != ref.length:
            raise FormatError(f"{EPISODES_PATH} gives episode {ref.episode_index} {ref.length} frames, its data file holds {table.num_rows} rows")
        found = np.unique(table.column("episode_index").to_numpy(zero_copy_only=False)).tolist() if "episode_index" in columns else None
        if found is not None and found != [ref.episode_index]:
            raise FormatError(f"the data file holds rows of episode(s) {found}, not episode {ref.episode_index} "
                              "(a data file under another episode's name)")
        if "timestamp" in table.column_names and any(spec.kind == VIDEO and spec.meta.get("encoded_from") != FROM_IMAGES
                                                      for spec in self.meta.columns):
            check_frame_times(table.column("timestamp").to_numpy(zero_copy_only=False), self.meta.fps, ref.episode_index)
        return table


def check_frame_times(timestamps: np.ndarray, fps: float, episode_index: int) -> None:
    """Row i must show frame i of each camera's MP4 (presented at i / fps): lerobot 0.3's reader
    shows the frame presented at the row's timestamp, and fails when none is within tolerance_s.
    A row further than that from i / fps (timestamps that drift, start late, or skip a frame) is
    refused: no frame of the file is the one lerobot would show without failing."""
    times = timestamps.astype(np.float64)
    if not np.isfinite(times).all():
        return  # rebased_timestamps names the non-finite step
    off = np.abs(times - np.arange(len(times)) / fps)
    bad = np.flatnonzero(~(off < TOLERANCE_S))
    if len(bad):
        step = int(bad[0])
        raise FormatError(f"episode {episode_index}: timestamp {float(timestamps[step]):.6g} s at step {step} is {off[step]:.3g} s from "
                          f"frame {step} of the camera videos ({step}/{fps:g} s); lerobot's reader allows {TOLERANCE_S:g} s "
                          f"(tolerance_s), so the frames of this episode are not defined")
