"""Segment copy: pixel-identical cuts of AV1, H.264 (B-frames) and HEVC; fallback; bad files."""

import io

import numpy as np
import pytest

from formats import video
from formats.errors import VideoError
from formats.video import policy, stream_copy
from tests.formats.segments import camera_segments


def _cut_all(path):
    """Cut every camera segment of a dataset; yield (source frames, output bytes, result)."""
    for source, segment, fps in camera_segments(path):
        out = io.BytesIO()
        result = stream_copy.copy_segment(source, out, start=segment.start, end=segment.end, frames=segment.frames, fps=fps)
        expected = video.decode_frames(source, start=segment.start, end=segment.end, fps=fps)
        yield expected, out.getvalue(), result, segment


def _check_identical(path):
    count = 0
    for expected, output, result, segment in _cut_all(path):
        assert not result.reencoded
        got = video.decode_frames(output)
        assert got.shape[0] == segment.frames == expected.shape[0]
        assert np.array_equal(got, expected)
        count += 1
    return count


def test_av1_fixture_segments_are_pixel_identical(so100_tiny):
    assert _check_identical(so100_tiny) == 10


def test_h264_with_b_frames_segments_are_pixel_identical(multi_file_dataset):
    path, _ = multi_file_dataset
    assert _check_identical(path) == 14


def test_hevc_segments_are_pixel_identical(hevc_dataset):
    path, _ = hevc_dataset
    assert _check_identical(path) == 3


def test_output_timestamps_start_at_zero(so100_tiny):
    _, output, _, segment = list(_cut_all(so100_tiny))[2]  # episode 1, starts at 1.7 s in the source
    assert segment.start == pytest.approx(1.7)
    import av

    with av.open(io.BytesIO(output)) as container:
        stream = container.streams.video[0]
        times = [float(frame.pts * stream.time_base) for frame in container.decode(stream)]
    np.testing.assert_allclose(times, np.arange(len(times)) / 30, atol=1e-6)


def test_segment_not_on_a_keyframe_is_encoded_losslessly_and_reported(so100_tiny):
    source = str(so100_tiny / "videos/observation.images.front/chunk-000/file-000.mp4")
    out = io.BytesIO()
    # Frame 1 is not a keyframe (lerobot's GOP is 2): copying cannot start there.
    result = stream_copy.copy_segment(source, out, start=1 / 30, end=1.7, frames=50, fps=30)
    assert result.reencoded and result.frames == 50
    assert result.note() == {"written_as": "lossless", "codec": "h264", "pix_fmt": "yuv420p", "reason": "the segment starts inside a GOP"}
    assert video.probe(io.BytesIO(out.getvalue())).codec == "h264"  # x264 lossless: 8-bit YUV that browsers play
    # Every plane of every frame is the source's (a lossless encode, not a near-lossless one).
    got = video.decode_frames(out.getvalue())
    expected = video.decode_frames(source, start=1 / 30, end=1.7, fps=30)
    assert got.shape == expected.shape == (50, 72, 64)
    np.testing.assert_array_equal(got, expected)


def test_frame_count_mismatch_is_an_error(so100_tiny):
    source = str(so100_tiny / "videos/observation.images.front/chunk-000/file-000.mp4")
    with pytest.raises(VideoError, match=r"segment \[0, 1.7\) s holds 51 frames, expected 60"):
        stream_copy.copy_segment(source, io.BytesIO(), start=0.0, end=1.7, frames=60, fps=30)


def test_truncated_file_is_an_error(so100_tiny, tmp_path):
    data = (so100_tiny / "videos/observation.images.front/chunk-000/file-000.mp4").read_bytes()
    truncated = tmp_path / "t.mp4"
    truncated.write_bytes(data[: len(data) // 3])
    with pytest.raises(VideoError):
        stream_copy.copy_segment(str(truncated), io.BytesIO(), start=5.8, end=6.566666, frames=23, fps=30)


def test_not_a_video_is_an_error(tmp_path):
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(b"\x00" * 1000)
    with pytest.raises(VideoError, match=r"cannot open video"):
        video.probe(str(junk))


@pytest.mark.parametrize("codec", ["h264", "hevc", "av1"])
def test_encode_frames_roundtrip(codec):
    frames = np.random.default_rng(1).integers(0, 255, (12, 48, 64, 3), dtype=np.uint8)
    out = io.BytesIO()
    assert video.encode_frames(frames, out, fps=30, options=policy.EncodeOptions(codec, crf=18)).frames == 12
    info = video.probe(io.BytesIO(out.getvalue()))
    assert (info.codec, info.width, info.height, info.frames, info.pix_fmt) == (codec, 64, 48, 12, "yuv420p")


def test_lossless_cut_is_checked_pixel_for_pixel_before_it_is_kept(so100_tiny, monkeypatch):
    """A lossy encoder in the lossless slot is caught by decoding the written file: the next one is used."""
    source = str(so100_tiny / "videos/observation.images.front/chunk-000/file-000.mp4")
    lossy = policy.EncodeOptions("h264", 30, 10, "medium", "yuv420p").resolved()
    monkeypatch.setattr(stream_copy, "lossless_options", lambda pix_fmt: [lossy, policy.EncodeOptions("ffv1", pix_fmt=pix_fmt).resolved()])
    out = io.BytesIO()
    result = stream_copy.copy_segment(source, out, start=1 / 30, end=1.7, frames=50, fps=30)
    assert result.codec == "ffv1" and video.probe(io.BytesIO(out.getvalue())).codec == "ffv1"
    np.testing.assert_array_equal(video.decode_frames(out.getvalue()), video.decode_frames(source, start=1 / 30, end=1.7, fps=30))
    monkeypatch.setattr(stream_copy, "lossless_options", lambda pix_fmt: [lossy])
    with pytest.raises(VideoError, match=r"could not be written losslessly; cannot copy it"):
        stream_copy.copy_segment(source, io.BytesIO(), start=1 / 30, end=1.7, frames=50, fps=30)
