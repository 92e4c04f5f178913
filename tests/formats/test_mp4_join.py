"""formats/video/mp4.py `joinable`: only a file whose samples can follow another's without two
frames shown at once is joined (a received MP4's sample table may lie)."""

from __future__ import annotations

import dataclasses
import io

import numpy as np

from formats.sources.lerobot_v3.sample import SyntheticLeRobot, write_dataset
from formats.video import mp4


def _table(tmp_path) -> mp4.SampleTable:
    write_dataset(str(tmp_path / "src"), SyntheticLeRobot(lengths=(12,), cameras=("observation.images.front",)))
    path = next((tmp_path / "src" / "videos").rglob("*.mp4"))
    table = mp4.read_sample_table(io.BytesIO(path.read_bytes()))
    assert table is not None and mp4.joinable(table) and mp4.joinable(table, table)
    return table


def _with_durations(table: mp4.SampleTable, durations: np.ndarray) -> mp4.SampleTable:
    decode = np.cumsum(durations) - durations
    return dataclasses.replace(table, durations=durations, decode=decode, pts=decode + table.composition - table.shift)


def test_a_sample_of_no_duration_is_not_joined(tmp_path):
    table = _table(tmp_path)
    last_zero = table.durations.copy()
    last_zero[-1] = 0  # the last frame shown at the file's end, where the next file's first frame starts
    assert not mp4.joinable(_with_durations(table, last_zero))
    one = dataclasses.replace(table, pts=table.pts[:1], decode=table.decode[:1], durations=np.zeros(1, np.int64),
                              composition=table.composition[:1], sizes=table.sizes[:1], offsets=table.offsets[:1],
                              sync=None if table.sync is None else table.sync[:1])
    assert not mp4.joinable(one)


def test_two_samples_shown_at_once_are_not_joined(tmp_path):
    table = _table(tmp_path)
    pts = table.pts.copy()
    pts[1] = pts[2]
    assert not mp4.joinable(dataclasses.replace(table, pts=pts))


def test_another_codec_configuration_or_time_scale_starts_another_file(tmp_path):
    table = _table(tmp_path)
    assert not mp4.joinable(table, dataclasses.replace(table, stsd=table.stsd + b"\0"))
    assert not mp4.joinable(table, dataclasses.replace(table, timescale=table.timescale * 2))
