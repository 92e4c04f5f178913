"""Proof of frame alignment: decode an output video next to its reference frames and compare.

Used by the tests and by `python -m pipelines.validate --deep`. The reference is what the
camera's frames were before conversion: the decoded source segment, or the source images.
Frame i of the output must be at i/fps (within half a frame) and match reference frame i:
bit-identical planes for a copy (or a lossless encode), luma PSNR above a threshold for a lossy
encode. Both sides are compared on the luma plane an encoder codes (converted to yuv420p by
swscale where needed), so RGB arrays, yuvj420p JPEGs and yuv420p video compare in one colour
space; an output padded to even size is cropped back first.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import BinaryIO

import av
import numpy as np

from formats import video

__all__ = ["FrameReport", "compare_video", "psnr"]


@dataclasses.dataclass
class FrameReport:
    """What the comparison of one output video with its reference found."""

    frames: int  # frames decoded from the output
    reference_frames: int
    first_timestamp: float | None  # seconds, presentation time of the output's first frame
    last_timestamp: float | None
    timestamps_ok: bool  # frame i presented at i/fps within half a frame
    identical: bool  # every frame's planes equal the reference's
    psnr_min: float  # luma PSNR in dB, inf when identical
    psnr_mean: float

    def problems(self, *, expected_frames: int, min_psnr: float | None, lossless: bool) -> list[str]:
        """Human-readable failures against the expectations of the column's write mode."""
        found = []
        if self.frames != expected_frames or self.reference_frames != expected_frames:
            found.append(f"{self.frames} output frames, {self.reference_frames} reference frames, length {expected_frames}")
        if not self.timestamps_ok:
            found.append(f"timestamps run {self.first_timestamp}..{self.last_timestamp} s, not i/fps")
        if lossless and not self.identical:
            found.append(f"pixels differ from the source (min luma PSNR {self.psnr_min:.2f} dB) in a lossless column")
        elif min_psnr is not None and self.psnr_min < min_psnr:
            found.append(f"min luma PSNR {self.psnr_min:.2f} dB is below {min_psnr:g} dB")
        return found


psnr = video.psnr  # one definition, shared with the encoder's own floor check


def _same_planes(reference: av.VideoFrame, output: av.VideoFrame) -> bool:
    if (reference.width, reference.height) != (output.width, output.height):
        return False
    if reference.format.name != output.format.name:  # e.g. gray16be PNG vs gray16le FFV1: same values?
        common = video.array_format_of(reference.format.name)
        if common != video.array_format_of(output.format.name):
            return False
        return np.array_equal(reference.to_ndarray(format=common), output.to_ndarray(format=common))
    try:
        return np.array_equal(reference.to_ndarray(), output.to_ndarray())
    except (ValueError, NotImplementedError):  # a format numpy export does not cover: compare in RGB
        return np.array_equal(reference.to_ndarray(format="rgb48le"), output.to_ndarray(format="rgb48le"))


def compare_video(output: BinaryIO | str | bytes, reference: Iterable, *, fps: float) -> FrameReport:
    """Decode `output` and compare it frame by frame with `reference`.

    `reference` yields decoded VideoFrames (a source segment: `video.iter_frames`), encoded
    JPEG/PNG bytes or image arrays. Both sides are streamed: one frame of each at a time.
    """
    images = video.ImageDecoder()
    out_iter = iter(video.iter_frames(output, fps=fps))
    ref_iter = iter(reference)
    frames = reference_frames = 0
    identical = timestamps_ok = True
    first = last = None
    scores: list[float] = []
    while True:
        out_frame = next(out_iter, None)
        ref_item = next(ref_iter, None)
        if out_frame is not None:
            time = float(out_frame.pts * out_frame.time_base)
            first = time if first is None else first
            last = time
            if abs(time - frames / fps) > 0.5 / fps:
                timestamps_ok = False
            frames += 1
        if ref_item is not None:
            reference_frames += 1
        if out_frame is None or ref_item is None:
            if out_frame is None and ref_item is None:
                break
            identical = False
            continue
        ref_frame = images.to_frame(ref_item, reference_frames - 1)
        if identical and not _same_planes(ref_frame, out_frame):
            identical = False
        gray = ref_frame.format.name.startswith("gray") and out_frame.format.name.startswith("gray")
        ref_luma, peak = video.luma_plane(ref_frame, ref_frame.width, ref_frame.height, gray)
        out_luma, _ = video.luma_plane(out_frame, ref_frame.width, ref_frame.height, gray)
        if ref_luma.shape != out_luma.shape:
            scores.append(-math.inf)
            identical = False
            continue
        scores.append(psnr(ref_luma, out_luma, peak))
    psnr_min = min(scores) if scores else -math.inf
    finite = [s for s in scores if math.isfinite(s)]
    psnr_mean = math.inf if scores and not finite and psnr_min == math.inf else (float(np.mean(finite)) if finite else psnr_min)
    return FrameReport(frames, reference_frames, first, last, timestamps_ok, identical and frames > 0, psnr_min, psnr_mean)
