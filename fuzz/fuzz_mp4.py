"""Harness: MP4 sample tables, cuts and declared sizes (formats/video/mp4.py, declared.py, bitstream.py).

Contract, per input (an MP4 file's bytes): `declared.check_declared` raises nothing but VideoError;
the sample-table parse (`mp4.read_sample_table`'s body: it turns ValueError/KeyError/IndexError/
struct.error/OverflowError into "not the plain case", None) raises nothing else, and no
MemoryError (read_sample_table would hide one); the framing check (`bitstream.sample_format`,
`check_samples`) never raises; every cut `plan_cut` accepts is written by `write_cut` (a
ValueError there is what stream_copy reports as VideoError) and reads back as a plain MP4 with
exactly the cut's samples. At most 1 s and 256 MiB per input (fuzz/contract.py).
"""

from __future__ import annotations

import glob
import io
import os
import struct

import numpy as np

from formats.errors import VideoError
from formats.video import bitstream, declared, mp4
from fuzz.contract import ContractViolation, fixtures_dir

MAX_LEN = 80_000
SMOKE_RUNS = 600


def _encoded(codec: str, frames: int = 6) -> bytes:
    from formats import video

    out = io.BytesIO()
    pictures = [np.full((48, 64, 3), 40 * i % 255, np.uint8) for i in range(frames)]
    video.encode_frames(pictures, out, fps=10, options=video.EncodeOptions(codec=codec, gop=2))
    return out.getvalue()


def prepare(work: str) -> list[bytes]:
    """Seeds: tiny files the product's own encoder writes (H.264, HEVC, AV1) and the smallest
    fixture MP4s (lerobot 0.6.1's AV1 joins) when ../shared/fixtures is present."""
    seeds = [_encoded(codec) for codec in ("h264", "hevc", "av1")]
    root = fixtures_dir()
    if root:
        files = sorted(glob.glob(os.path.join(root, "lerobot_v3", "*", "videos", "**", "*.mp4"), recursive=True), key=os.path.getsize)
        seeds += [open(path, "rb").read() for path in files[:2] if os.path.getsize(path) <= MAX_LEN]
    return seeds


_PARSE_ERRORS = (ValueError, KeyError, IndexError, struct.error, OverflowError)


def _table(data: bytes) -> mp4.SampleTable | None:
    """read_sample_table without its `except MemoryError` (the harness must see one)."""
    try:
        boxes = mp4.top_level(io.BytesIO(data))
        if b"moov" not in boxes:
            return None
        return mp4._parse(boxes.get(b"ftyp", b""), boxes[b"moov"], len(data))
    except _PARSE_ERRORS:
        return None


def one_input(data: bytes) -> None:
    declared.check_declared(io.BytesIO(data))
    table = _table(data)
    if table is None:
        return
    form = bitstream.sample_format(table.stsd)
    if form is not None:
        bitstream.check_samples(form, data, table.offsets, table.sizes)
    pts = np.sort(table.pts)
    bounds = [(None, None)]
    if len(pts) > 1:
        middle = int(pts[len(pts) // 2])
        bounds += [(None, middle), (middle, None), (int(pts[1]), int(pts[-1]))]
    for low, high in bounds:
        cut = mp4.plan_cut(table, low, high)
        if cut is None:
            continue
        out = io.BytesIO()
        try:
            mp4.write_cut(cut, io.BytesIO(data), out)
        except ValueError as error:  # stream_copy._copy_by_sample_table's wording
            raise VideoError(f"cannot copy video: {error}") from error
        again = _table(out.getvalue())
        if again is None or len(again.sizes) != cut.stop - cut.first or \
                not np.array_equal(again.sizes, table.sizes[cut.first:cut.stop]):
            raise ContractViolation(f"the written cut [{cut.first}, {cut.stop}) does not read back with its samples")
