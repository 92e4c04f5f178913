"""Re-encode and image-sequence encoding: options, quality bar, odd sizes, depth, verification."""

import contextlib
import io
import os

import av
import numpy as np
import pytest

from formats import storage, video
from formats.errors import ConversionError, VideoError
from formats.mixtrain.stats import ImageStats, sample_indices
from formats.sources import lerobot_v3
from formats.sources.lerobot_v3.sample import encode_image, synthetic_frames
from formats.video import mp4, stream_copy, verify
from formats.video import policy as video_policy


def test_encode_options_defaults_and_column_meta():
    options = video_policy.EncodeOptions().resolved()
    assert (options.codec, options.crf, options.gop, options.preset, options.pix_fmt) == ("h264", 16, 10, "medium", "yuv420p")
    assert video_policy.EncodeOptions("av1").resolved().column_meta() == {"codec": "av1", "pix_fmt": "yuv420p", "gop": 10, "crf": 20,
                                                                          "preset": "8", "min_psnr": 35.0}
    assert video_policy.EncodeOptions("hevc", crf=30, gop=1, preset="fast", pix_fmt="yuv444p").resolved().crf == 30


@pytest.mark.parametrize("options, message", [
    (video_policy.EncodeOptions("av1", pix_fmt="yuv444p"), "pixel format 'yuv444p' is not available for av1 (choose from yuv420p)"),
    (video_policy.EncodeOptions("h264", crf=60), "crf 60 is outside 0..51 for h264"),
    (video_policy.EncodeOptions("vp9"), "video codec 'vp9' is not supported"),
    (video_policy.EncodeOptions("h264", gop=0), "gop 0 must be at least 1"),
])
def test_encode_options_refuse_impossible_combinations(options, message):
    with pytest.raises(ConversionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        options.resolved()


def _h264_profile(data: bytes) -> tuple[str, str, int, int]:
    with av.open(io.BytesIO(data)) as container:
        context = container.streams.video[0].codec_context
        return context.profile, context.pix_fmt, context.width, context.height


def test_reencode_fixture_to_h264_meets_the_quality_bar(so100_tiny):
    """AV1 (keyframe every 2) -> H.264 at defaults: T frames at i/fps, PSNR >= 35 dB, High profile yuv420p."""
    fs, root = storage.open_root(str(so100_tiny))
    meta, refs = lerobot_v3.plan(fs, root)
    worst = np.inf
    for ref in refs:
        for _, segment in ref.videos:
            source = storage.join(root, segment.path)
            out = io.BytesIO()
            result = video.reencode_segment(source, out, start=segment.start, end=segment.end, frames=segment.frames,
                                            fps=meta.fps, options=video_policy.EncodeOptions())
            assert result.frames == segment.frames and result.padded_from is None
            report = verify.compare_video(out.getvalue(), video.iter_frames(source, start=segment.start, end=segment.end,
                                                                            fps=meta.fps), fps=meta.fps)
            assert report.frames == report.reference_frames == segment.frames
            assert report.timestamps_ok and report.first_timestamp == 0.0
            assert report.last_timestamp == pytest.approx((segment.frames - 1) / meta.fps)
            assert report.problems(expected_frames=segment.frames, min_psnr=35.0, lossless=False) == []
            assert _h264_profile(out.getvalue()) == ("High", "yuv420p", 64, 48)
            worst = min(worst, report.psnr_min)
    assert 35.0 <= worst < 60  # lossy, yet above the bar


def test_copy_is_reported_identical_and_a_shift_is_caught(so100_tiny):
    fs, root = storage.open_root(str(so100_tiny))
    meta, refs = lerobot_v3.plan(fs, root)
    segment = refs[1].videos[0][1]
    source = storage.join(root, segment.path)
    out = io.BytesIO()
    stream_copy.copy_segment(source, out, start=segment.start, end=segment.end, frames=segment.frames, fps=meta.fps)
    frames = list(video.iter_frames(source, start=segment.start, end=segment.end, fps=meta.fps))
    same = verify.compare_video(out.getvalue(), frames, fps=meta.fps)
    assert same.identical and same.psnr_min == np.inf
    assert same.problems(expected_frames=segment.frames, min_psnr=None, lossless=True) == []
    shifted = verify.compare_video(out.getvalue(), frames[1:] + frames[:1], fps=meta.fps)
    assert not shifted.identical and shifted.psnr_min < 30
    problems = shifted.problems(expected_frames=segment.frames, min_psnr=None, lossless=True)
    assert problems and "pixels differ from the source" in problems[0]
    short = verify.compare_video(out.getvalue(), frames[:-1], fps=meta.fps)
    assert f"{segment.frames} output frames, {segment.frames - 1} reference frames" in short.problems(
        expected_frames=segment.frames, min_psnr=None, lossless=True)[0]


@pytest.mark.parametrize("codec", ["h264", "hevc", "av1"])
def test_odd_frames_are_padded_to_even_with_edge_pixels(codec):
    frames = synthetic_frames(0, 0, 12, 49, 65)
    out = io.BytesIO()
    result = video.encode_frames(frames, out, fps=30, options=video_policy.EncodeOptions(codec))
    assert (result.frames, result.width, result.height, result.padded_from) == (12, 66, 50, (65, 49))
    info = video.probe(io.BytesIO(out.getvalue()))
    assert (info.codec, info.width, info.height, info.frames) == (codec, 66, 50, 12)
    report = verify.compare_video(out.getvalue(), frames, fps=30)  # output cropped back to 65x49
    assert report.frames == 12 and report.timestamps_ok and report.psnr_min >= 35
    decoded = video.decode_frames(out.getvalue(), planar=False).astype(np.int16)
    # The padding column repeats the last source column (up to coding error).
    assert np.abs(decoded[:, :49, 65] - decoded[:, :49, 64]).mean() < 3


def test_yuv444p_keeps_odd_sizes_and_full_chroma():
    frames = synthetic_frames(1, 2, 6, 49, 65)
    out = io.BytesIO()
    result = video.encode_frames(frames, out, fps=30, options=video_policy.EncodeOptions("h264", pix_fmt="yuv444p"))
    assert result.padded_from is None
    assert _h264_profile(out.getvalue())[1:] == ("yuv444p", 65, 49)
    rgb = video.decode_frames(out.getvalue(), planar=False).astype(np.float64)
    assert verify.psnr(frames.astype(np.float64), rgb, 255) > 35  # all three channels, not just luma


@pytest.mark.parametrize("image_format, floor", [("png", 40.0), ("jpeg", 35.0)])
def test_encoded_images_become_t_frames(image_format, floor):
    frames = synthetic_frames(2, 1, 15, 48, 64)
    blobs = [encode_image(frame, image_format) for frame in frames]
    out = io.BytesIO()
    assert video.encode_frames(blobs, out, fps=15, options=video_policy.EncodeOptions()).frames == 15
    report = verify.compare_video(out.getvalue(), blobs, fps=15)  # against the decoded images
    assert report.frames == 15 and report.timestamps_ok
    assert report.last_timestamp == pytest.approx(14 / 15)
    assert report.psnr_min >= floor
    # ... and against the raw frames, so a decoder that mixed images up would not pass unseen.
    assert verify.compare_video(out.getvalue(), frames, fps=15).psnr_min >= 35
    decoder = video.ImageDecoder()
    if image_format == "png":  # lossless: every decoded image is its own frame, none blended
        assert all(np.array_equal(decoder.decode(blob, i).to_ndarray(), frame) for i, (blob, frame) in enumerate(zip(blobs, frames)))


def test_gray_and_rgba_arrays_encode():
    gray = synthetic_frames(0, 0, 5, 48, 64)[..., 1]
    rgba = np.concatenate([synthetic_frames(0, 1, 5, 48, 64), np.full((5, 48, 64, 1), 255, np.uint8)], axis=3)
    for frames in (gray, gray[..., None], rgba):
        out = io.BytesIO()
        assert video.encode_frames(frames, out, fps=30).frames == 5
        assert verify.compare_video(out.getvalue(), frames, fps=30).psnr_min > 35


def test_16_bit_depth_is_encoded_losslessly_whatever_was_asked():
    depth = (np.arange(49 * 65, dtype=np.uint32).reshape(49, 65) * 13 % 65536).astype(np.uint16)
    frames = np.stack([depth + i for i in range(8)])
    options = video_policy.options_for(video_policy.EncodeOptions("h264"), source_pix_fmt="gray16le", is_depth=True)
    assert (options.codec, options.pix_fmt) == ("ffv1", "gray16le")
    out = io.BytesIO()
    result = video.encode_frames(frames, out, fps=30, options=options)
    assert (result.width, result.height, result.padded_from) == (65, 49, None)  # no chroma: no padding
    decoded = np.stack([frame.to_ndarray() for frame in video.iter_frames(out.getvalue())])
    assert decoded.dtype == np.uint16 and np.array_equal(decoded, frames)
    assert verify.compare_video(out.getvalue(), frames, fps=30).identical
    # A 10-bit colour source is routed the same way; an 8-bit colour one is not.
    assert video_policy.options_for(video_policy.EncodeOptions(), source_pix_fmt="yuv420p10le", is_depth=False).codec == "ffv1"
    assert video_policy.options_for(video_policy.EncodeOptions(), source_pix_fmt="yuv420p", is_depth=False).codec == "h264"


def test_16_bit_source_copies_and_reencodes_bit_exactly():
    depth = np.stack([(np.indices((48, 64)).sum(0) * 700 + 97 * i).astype(np.uint16) for i in range(10)])
    source = io.BytesIO()
    video.encode_frames(depth, source, fps=10, options=video_policy.EncodeOptions("ffv1", pix_fmt="gray16le"))
    copied, reencoded = io.BytesIO(), io.BytesIO()
    assert not stream_copy.copy_segment(io.BytesIO(source.getvalue()), copied, start=0.3, end=0.8, frames=5, fps=10).reencoded
    options = video_policy.options_for(video_policy.EncodeOptions(), source_pix_fmt="gray16le", is_depth=True)
    video.reencode_segment(io.BytesIO(source.getvalue()), reencoded, start=0.3, end=0.8, frames=5, fps=10, options=options)
    for output in (copied, reencoded):
        got = np.stack([frame.to_ndarray() for frame in video.iter_frames(output.getvalue(), fps=10)])
        assert np.array_equal(got, depth[3:8])


@pytest.mark.parametrize("frames, message", [
    ([b"GIF89a...."], "image 0 is neither JPEG, PNG nor TIFF"),
    ([b"\xff\xd8\xff\xe0broken"], "image 0: cannot decode mjpeg"),
    ([np.zeros((48, 64, 3), np.uint8), np.zeros((40, 64, 3), np.uint8)], "image 1 is 64x40, the first is 64x48"),
    ([np.zeros((48, 64, 2), np.uint8)], r"image 0: array of shape \[48, 64, 2\] and dtype uint8 is not an image"),
    ([np.zeros((48, 64), np.float32)], "dtype float32 is not an image"),
])
def test_bad_images_name_the_frame(frames, message):
    with pytest.raises(VideoError, match=message):
        video.encode_frames(frames, io.BytesIO(), fps=30)


def test_reencode_with_wrong_frame_count_is_an_error(so100_tiny):
    fs, root = storage.open_root(str(so100_tiny))
    meta, refs = lerobot_v3.plan(fs, root)
    segment = refs[0].videos[0][1]
    with pytest.raises(VideoError, match=r"segment \[0, 1.7\) s holds 51 frames, expected 52"):
        video.reencode_segment(storage.join(root, segment.path), io.BytesIO(), start=segment.start, end=segment.end,
                               frames=52, fps=meta.fps, options=video_policy.EncodeOptions())


def test_plan_column_describes_the_output():
    source = {"fps": 30, "codec": "av1", "resolution": {"width": 65, "height": 49}, "pix_fmt": "yuv420p",
              "is_depth_map": False, "source": "observation.images.top"}
    assert video_policy.plan_column(source, mode="copy", requested=video_policy.EncodeOptions()) == (None, {**source, "written_as": "copy"})
    options, entry = video_policy.plan_column(source, mode="reencode", requested=video_policy.EncodeOptions("hevc", crf=22))
    assert options.codec == "hevc" and entry["source_codec"] == "av1" and entry["crf"] == 22
    assert entry["resolution"] == {"width": 66, "height": 50} and entry["source_resolution"] == {"width": 65, "height": 49}
    images = {"fps": 10, "resolution": {"width": 64, "height": 48}, "encoded_from": "images", "source": "observation.image"}
    options, entry = video_policy.plan_column(images, mode="copy", requested=video_policy.EncodeOptions())
    assert options.codec == "h264" and entry["codec"] == "h264" and "source_resolution" not in entry
    depth = dict(source, pix_fmt="gray16le", is_depth_map=True, codec="ffv1")
    options, entry = video_policy.plan_column(depth, mode="reencode", requested=video_policy.EncodeOptions())
    assert entry["codec"] == "ffv1" and entry["lossless"] and entry["resolution"] == {"width": 65, "height": 49}


def test_sample_indices_follow_lerobot():
    assert sample_indices(50).tolist() == list(range(50))
    assert len(sample_indices(1000)) == 177  # int(1000 ** 0.75)
    assert len(sample_indices(10**7)) == 10_000
    assert sample_indices(1000)[[0, -1]].tolist() == [0, 999]


def test_image_stats_are_per_channel_in_unit_range():
    frames = synthetic_frames(0, 0, 30, 48, 64)
    stats = ImageStats(30)
    for frame in frames:
        stats.add(frame)
    summary = stats.result().to_json()
    values = frames.reshape(-1, 3) / 255.0
    assert np.allclose(np.array(summary["mean"]).reshape(3), values.mean(0))
    assert np.allclose(np.array(summary["std"]).reshape(3), values.std(0))
    assert np.array(summary["max"]).shape == (3, 1, 1) and np.array(summary["q50"]).shape == (3, 1, 1)
    assert summary["count"] == [30 * 48 * 64]
    big = ImageStats(1)
    big.add(np.zeros((480, 640, 3), np.uint8))
    assert big.result().count == 120 * 160  # strided by int(640 / 150) = 4, like lerobot's auto_downsample


def test_full_range_yuv_is_brought_to_limited_range_and_tagged():
    frames = []
    for _ in range(4):
        frame = av.VideoFrame.from_ndarray(np.full((72, 64), 250, np.uint8), format="yuv420p")
        frame.color_range = 2  # what dav1d reports for a full-range AV1 stream
        frames.append(frame)
    out = io.BytesIO()
    video.encode_frames(frames, out, fps=30)
    with av.open(io.BytesIO(out.getvalue())) as container:
        context = container.streams.video[0].codec_context
        assert context.color_range != 2  # not full range (x264 writes limited range as the default it is)
        luma = next(container.decode(video=0)).to_ndarray()[:48]
    assert abs(int(np.median(luma)) - (16 + round(250 * 219 / 255))) <= 1  # 231, not 250


def test_rgb_input_is_tagged_bt601():
    out = io.BytesIO()
    video.encode_frames(synthetic_frames(0, 0, 3, 48, 64), out, fps=30)
    with av.open(io.BytesIO(out.getvalue())) as container:
        context = container.streams.video[0].codec_context
        assert (context.color_range, context.colorspace) == (1, 6)


def test_declared_size_is_checked_and_empty_input_refused():
    frames = synthetic_frames(0, 0, 3, 48, 64)
    with pytest.raises(VideoError, match="frames are 64x48, the metadata declares 65x49"):
        video.encode_frames(frames, io.BytesIO(), fps=30, expected_size=(65, 49))
    with pytest.raises(VideoError, match="no frames to encode"):
        video.encode_frames([], io.BytesIO(), fps=30)


def test_16_bit_images_are_refused_by_a_lossy_codec_and_kept_by_ffv1():
    depth = (np.indices((48, 64)).sum(0) * 900).astype(np.uint16)
    with pytest.raises(VideoError, match=r"image 0 has more than 8 bits per sample \(gray16le\); h264 would keep 8"):
        video.encode_frames([depth], io.BytesIO(), fps=30)
    odd = np.stack([np.pad(depth, ((0, 1), (0, 1)), mode="edge")] * 2)  # 65x49, no chroma: no padding either
    out = io.BytesIO()
    video.encode_frames(odd, out, fps=30, options=video_policy.options_for(video_policy.EncodeOptions(), source_pix_fmt=None, is_depth=True))
    assert np.array_equal(np.stack([f.to_ndarray() for f in video.iter_frames(out.getvalue())]), odd)


def test_image_stats_accept_a_gray_frame_in_a_colour_camera():
    stats = ImageStats(2)
    stats.add(np.full((4, 4, 3), 255, np.uint8))
    stats.add(np.zeros((4, 4), np.uint8))
    assert np.array(stats.result().to_json()["mean"]).ravel().tolist() == [0.5, 0.5, 0.5]


def test_transparent_images_are_refused_opaque_ones_encode():
    rgba = np.concatenate([synthetic_frames(0, 1, 2, 48, 64), np.full((2, 48, 64, 1), 255, np.uint8)], axis=3)
    assert video.encode_frames(rgba, io.BytesIO(), fps=30).frames == 2
    rgba[1, 5, 5, 3] = 128
    with pytest.raises(VideoError, match=r"image 1 has transparency \(rgba\); video cannot keep an alpha channel"):
        video.encode_frames(rgba, io.BytesIO(), fps=30)


def test_hevc_refuses_frames_narrower_than_x265_can_take():
    """libx265 writes out of bounds on narrow frames (valgrind; a later free() aborted the process)."""
    frames = [np.zeros((36, 48, 3), np.uint8)] * 3
    with pytest.raises(video.VideoError, match=r"frames are 48x36: libx265 writes outside its buffers on frames narrower than 64 px"):
        video.encode_frames(frames, io.BytesIO(), fps=10, options=video_policy.EncodeOptions("hevc"))
    assert video.encode_frames(frames, io.BytesIO(), fps=10, options=video_policy.EncodeOptions("h264")).frames == 3


def _x264_threads(data: bytes) -> bytes:
    """The thread settings x264 writes into its SEI options string."""
    start = data.index(b"threads=")
    return data[start:data.index(b" nr=", start)]


def test_x264_runs_on_its_fixed_threads_whatever_the_cap():
    """x264 cuts one slice per thread and writes its thread count into the stream: it always runs on
    FIXED_ENCODER_THREADS (issue 28), so one worker on two cores and two workers write the same bytes."""
    frames = synthetic_frames(3, 0, 12, 128, 128)  # x264 gives each slice thread at least a few macroblock rows

    def encode(threads):
        buffer = io.BytesIO()
        assert video.encode_frames(list(frames), buffer, fps=10, threads=threads).frames == 12
        return buffer.getvalue()

    written = {encode(threads) for threads in (1, 2, 8, None)}
    assert len(written) == 1
    assert _x264_threads(written.pop()).startswith(b"threads=%d " % video.FIXED_ENCODER_THREADS["h264"])


def test_lossless_encoders_write_the_same_bytes_whatever_the_threads():
    frames = (synthetic_frames(1, 0, 4, 32, 48)[..., 0].astype(np.uint16) * 257)

    def encode(threads):
        buffer = io.BytesIO()
        video.encode_frames(list(frames), buffer, fps=10, options=video_policy.EncodeOptions("ffv1", pix_fmt="gray16le"), threads=threads)
        return buffer.getvalue()

    assert encode(None) == encode(1) == encode(2)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="SVT-AV1 raises thread priorities only when run by root")
def test_av1_encoding_leaves_no_thread_real_time():
    """SVT-AV1 opened by root sets its caller and its own threads to SCHED_FIFO 99, which starved
    the machine; the encoder is put back to the caller's policy and its bytes do not change."""
    def realtime_threads():
        policies = []
        for task in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError):
                policies.append(os.sched_getscheduler(int(task)))
        return sum(policy in (os.SCHED_FIFO, os.SCHED_RR) for policy in policies)

    frames = synthetic_frames(3, 0, 12, 64, 48)
    before = os.sched_getscheduler(0)
    buffers = [io.BytesIO(), io.BytesIO()]
    for buffer in buffers:
        video.encode_frames(list(frames), buffer, fps=10, options=video_policy.EncodeOptions(codec="av1"))
        assert os.sched_getscheduler(0) == before == os.SCHED_OTHER
        assert realtime_threads() == 0
    assert buffers[0].getvalue() == buffers[1].getvalue() and len(buffers[0].getvalue()) > 0
    with pytest.raises(VideoError, match="cannot encode av1"):  # SVT-AV1 refuses 2-pixel-high frames after raising priorities
        video.encode_frames(list(synthetic_frames(3, 0, 4, 64, 2)), io.BytesIO(), fps=10, options=video_policy.EncodeOptions(codec="av1"))
    assert os.sched_getscheduler(0) == before and realtime_threads() == 0


@pytest.mark.parametrize("codec", ["h264", "hevc"])
def test_encoded_bytes_do_not_depend_on_the_machines_cores(codec, monkeypatch):
    """x264's and x265's bytes follow their thread count: the codec threads a 2-core and a 16-core
    machine give each worker (pipelines.local_workers.codec_threads) must not reach them (issue 28)."""
    from pipelines import local_workers

    frames = [np.random.default_rng(i % 4).integers(0, 255, (240, 320, 3), dtype=np.uint8) for i in range(12)]
    written = set()
    for cores in (2, 16):
        monkeypatch.setattr(local_workers.os, "sched_getaffinity", lambda _pid, cores=cores: set(range(cores)), raising=False)
        for workers in (1, 2):
            out = io.BytesIO()
            video.encode_frames(frames, out, fps=30, options=video_policy.EncodeOptions(codec), threads=local_workers.codec_threads(workers))
            written.add(out.getvalue())
    assert len(written) == 1


def _pictures(data: bytes) -> list[bytes]:
    """An HEVC MP4's NAL units in decode order, without SEI (x265 writes its options there)."""
    table = mp4.read_sample_table(io.BytesIO(data))
    units = []
    for offset, size in zip(table.offsets.tolist(), table.sizes.tolist()):
        position = offset
        while position < offset + size:
            length = int.from_bytes(data[position:position + 4], "big")
            if (data[position + 4] >> 1) & 0x3F not in (39, 40):
                units.append(data[position + 4:position + 4 + length])
            position += 4 + length
    return units


def test_x265s_pool_sized_by_the_machine_leaves_the_pictures_alone(monkeypatch):
    """x265 sizes its worker pool by the machine's cores (here: pools=2 and pools=16 stand in for the
    machines); with its frame threads fixed, only the options it echoes in an SEI differ."""
    frames = [np.random.default_rng(i % 4).integers(0, 255, (240, 320, 3), dtype=np.uint8) for i in range(12)]
    plain = video._encoder_options
    pictures = []
    for pools in (2, 16):
        monkeypatch.setattr(video, "_encoder_options", lambda options, pools=pools: {
            **plain(options), "x265-params": f"{plain(options)['x265-params']}:pools={pools}"})
        out = io.BytesIO()
        video.encode_frames(frames, out, fps=30, options=video_policy.EncodeOptions("hevc"))
        pictures.append(_pictures(out.getvalue()))
    assert pictures[0] == pictures[1]


NOISE = [np.random.default_rng(7).integers(0, 256, (48, 64, 3), dtype=np.uint8) for _ in range(12)]


def test_an_encode_below_the_psnr_floor_is_encoded_again_at_a_lower_crf():
    """Noise at crf 30 keeps about 25 dB; the encode measures it in its own pass (the same number
    validate --deep finds) and steps the crf down until every frame keeps 35 dB."""
    plain = io.BytesIO()
    measured = video.encode_frames(NOISE, plain, fps=30, options=video_policy.EncodeOptions("h264", 30))
    assert measured.psnr_min == verify.compare_video(plain.getvalue(), NOISE, fps=30).psnr_min < 35
    held = io.BytesIO()
    seen = []
    result = video.encode_to_floor(lambda: NOISE, held, fps=30, options=video_policy.EncodeOptions("h264", 30),
                                   on_frame=lambda index, frame: seen.append(index))
    assert result.below_floor == (30, measured.psnr_min)
    assert result.options.crf in (24, 18, 12, 6, 0) and result.frames == 12 and seen == list(range(12))  # frames seen once
    report = verify.compare_video(held.getvalue(), NOISE, fps=30)
    assert report.frames == 12 and report.psnr_min == result.psnr_min >= 35


def test_the_floor_is_an_option_and_the_lowest_crf_its_limit():
    free = io.BytesIO()
    result = video.encode_to_floor(lambda: NOISE, free, fps=30, options=video_policy.EncodeOptions("h264", 30, min_psnr=0))
    assert result.options.crf == 30 and result.psnr_min is None and result.below_floor is None
    with pytest.raises(VideoError, match=r"^luma PSNR \S+ dB is below the 99 dB floor even at hevc crf 0: lower --video_min_psnr "):
        video.encode_to_floor(lambda: NOISE, io.BytesIO(), fps=30, options=video_policy.EncodeOptions("hevc", 20, min_psnr=99))
    assert [o.crf for o in video_policy.quality_ladder(video_policy.EncodeOptions("av1").resolved())] == [20, 14, 8, 2, 1]
    assert video_policy.quality_ladder(video_policy.EncodeOptions("ffv1").resolved())[0].min_psnr is None


def test_ffv1_asked_for_keeps_each_source_format_and_every_value():
    """--video_codec=ffv1: RGB (PNG images) in FFV1's own RGB format, YUV as it is; decoded, the
    frames are the source's values (RGB through a YUV matrix would round them)."""
    requested = video_policy.EncodeOptions("ffv1").resolved()
    assert video_policy.lossless_pix_fmt("rgb24") == "bgr0" and video_policy.lossless_pix_fmt("rgb48be") == "rgb48le"
    assert video_policy.options_for(requested, source_pix_fmt="yuv420p", is_depth=False).pix_fmt == "yuv420p"
    options = video_policy.options_for(requested, source_pix_fmt="rgb24", is_depth=False)
    assert (options.codec, options.pix_fmt, options.gop) == ("ffv1", "bgr0", 1)
    rng = np.random.default_rng(7)
    frames = [rng.integers(0, 256, (36, 48, 3), dtype=np.uint8) for _ in range(5)]  # noise: any rounding shows
    out = io.BytesIO()
    video.encode_frames([video.encode_image(frame, "png") for frame in frames], out, fps=10, options=options)
    decoded = video.decode_frames(out.getvalue(), fps=10, planar=False)
    assert len(decoded) == 5 and all(np.array_equal(a, b) for a, b in zip(decoded, frames))
