"""Copy mode's sample-table cutter against PyAV's remux: same packets, same timestamps, same pixels."""

import io
import struct
from fractions import Fraction

import av
import numpy as np
import pytest

from formats import video
from formats.sources.lerobot_v3.sample import SyntheticLeRobot, write_dataset
from formats.video import mp4, stream_copy
from tests.formats.segments import camera_segments


def _packets(data: bytes) -> list[tuple[int, int, bool, bytes]]:
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        return [(p.pts, p.dts, p.is_keyframe, bytes(p)) for p in container.demux(stream) if p.size]


def _demuxed_times(data: bytes) -> list[float]:
    """Presentation times in seconds, ascending, as the demuxer gives them (exact fractions, then float)."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        return sorted(float(p.pts * stream.time_base) for p in container.demux(stream) if p.size and p.pts is not None)


def _times_agree(data: bytes) -> None:
    """check_copied's times from the sample table are the demuxer's, time for time."""
    ours = stream_copy._presentation_times(io.BytesIO(data))
    assert ours is not None and ours.tolist() == _demuxed_times(data)


def _compare_with_remux(path) -> int:
    count = 0
    for source, segment, fps in camera_segments(path):
        with open(source, "rb") as handle:
            table = mp4.read_sample_table(handle)
        assert table is not None, f"{source} is a plain MP4: the fast path must take it"
        low, high = video._bounds(Fraction(1, table.timescale), segment.start, segment.end, fps)
        assert mp4.plan_cut(table, low, high) is not None, "an episode of a lerobot-style file is a plain cut"
        fast, slow = io.BytesIO(), io.BytesIO()
        result = stream_copy.copy_segment(source, fast, start=segment.start, end=segment.end, frames=segment.frames, fps=fps)
        stream_copy._copy_by_remux(source, slow, start=segment.start, end=segment.end, frames=segment.frames, fps=fps)
        assert not result.reencoded and result.info.frames == segment.frames
        assert fast.getvalue()[4:8] == b"ftyp" and fast.getvalue().index(b"moov") < fast.getvalue().index(b"mdat")  # moov first
        assert _packets(fast.getvalue()) == _packets(slow.getvalue())
        _times_agree(fast.getvalue())
        got, want = video.decode_frames(fast.getvalue()), video.decode_frames(slow.getvalue())
        assert got.shape[0] == segment.frames and np.array_equal(got, want)
        assert video.probe(io.BytesIO(fast.getvalue())) == video.probe(io.BytesIO(slow.getvalue()))
        count += 1
    return count


def test_av1_fixture_cuts_equal_the_remux(so100_tiny):
    assert _compare_with_remux(so100_tiny) == 10


def test_h264_b_frame_cuts_equal_the_remux(multi_file_dataset):
    """B-frames: composition offsets and the one-edit shift FFmpeg writes must come through."""
    path, _ = multi_file_dataset
    source = next(camera_segments(path))[0]
    with open(source, "rb") as handle:
        assert mp4.read_sample_table(handle).composition.any()  # the case under test really has reordering
    assert _compare_with_remux(path) == 14


def test_hevc_cuts_equal_the_remux(hevc_dataset):
    path, _ = hevc_dataset
    assert _compare_with_remux(path) == 3


def test_lossless_depth_cuts_equal_the_remux(tmp_path):
    root = tmp_path / "depth"
    write_dataset(str(root), SyntheticLeRobot(lengths=(12, 9), cameras=(), depth_cameras=("observation.images.depth",),
                                              episodes_per_video_file=2))
    assert _compare_with_remux(root) == 2


def test_sample_table_times_are_the_demuxers_in_every_fixture_file(shared_fixtures):
    """check_copied reads a copied file's times from its sample table, not the demuxer's packets:
    the same times for every MP4 the other people's tools wrote (edit lists, B-frames, AV1)."""
    files = sorted(shared_fixtures.rglob("*.mp4"))
    assert len(files) >= 10
    for path in files:
        _times_agree(path.read_bytes())


def _b_frame_file(path, frames: int = 30, fps: int = 10) -> bytes:
    with av.open(str(path), "w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=fps, options={"bf": "2", "g": "10"})
        stream.width, stream.height, stream.pix_fmt = 64, 64, "yuv420p"
        for index in range(frames):
            frame = av.VideoFrame.from_ndarray(np.full((64, 64, 3), (index * 8) % 256, np.uint8), format="rgb24")
            frame.pts = index
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    return path.read_bytes()


def _with_edit(data: bytes, segment: int | None = None, media_shift: int = 0) -> bytes:
    """The file with its one edit's segment duration replaced and its media time moved."""
    at = data.index(b"elst")
    version = data[at + 4]
    body = bytearray(data)
    layout, offset = (">QqI", at + 12) if version == 1 else (">Iii", at + 12)
    duration, media_time, rate = struct.unpack_from(layout, data, offset)
    struct.pack_into(layout, body, offset, duration if segment is None else segment, media_time + media_shift, rate)
    return bytes(body)


@pytest.mark.parametrize("edit", ["between two frames", "of no duration"])
def test_an_edit_the_demuxer_snaps_is_checked_by_the_demuxer(tmp_path, monkeypatch, edit):
    """An edit whose media time falls between two frames (FFmpeg discards the frames before it and
    shows the next at 0) or of no duration: the sample table's times are not what a reader gets,
    so check_copied reads the demuxer's, and refuses or accepts as it always did."""
    data = _b_frame_file(tmp_path / "b.mp4")
    with open(tmp_path / "b.mp4", "rb") as handle:
        table = mp4.read_sample_table(handle)
    assert table.edit is not None and table.composition.any()
    patched = _with_edit(data, media_shift=table.timescale // 40) if edit == "between two frames" else _with_edit(data, segment=0)
    assert stream_copy._presentation_times(io.BytesIO(patched)) is None
    (tmp_path / "p.mp4").write_bytes(patched)

    def verdict(check) -> str:
        try:
            check(str(tmp_path / "p.mp4"), 30, 10.0, (64, 64))
            return "accepted"
        except video.VideoError as error:
            return str(error)

    got = verdict(stream_copy.check_copied)
    monkeypatch.setattr(stream_copy, "_presentation_times", lambda written: None)  # the demuxer alone, as before the table
    assert verdict(stream_copy.check_copied) == got
    if edit == "between two frames":
        assert got.startswith("frame timing differs from the declared rate"), got


def test_check_copied_without_a_sample_table_reads_the_demuxer(tmp_path):
    """A fragmented file (no plain sample table): the demuxer's times, and a late frame still refused."""
    fragmented = tmp_path / "fragmented.mp4"
    with av.open(str(fragmented), "w", format="mp4", options={"movflags": "frag_keyframe+empty_moov"}) as out:
        stream = out.add_stream("libx264", rate=10, options={"bf": "0"})
        stream.width, stream.height, stream.pix_fmt = 64, 64, "yuv420p"
        for index in range(10):
            frame = av.VideoFrame.from_ndarray(np.full((64, 64, 3), index * 20, np.uint8), format="rgb24")
            frame.pts = index
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    assert stream_copy._presentation_times(str(fragmented)) is None
    assert _demuxed_times(fragmented.read_bytes()) == [index / 10 for index in range(10)]
    stream_copy.check_copied(str(fragmented), 10, 10.0, (64, 64))
    with pytest.raises(video.VideoError, match="frame timing differs from the declared rate: frame 1 is presented at 0.1 s, timestep 1 at"):
        stream_copy.check_copied(str(fragmented), 10, 20.0, (64, 64))


def test_cut_inside_a_gop_is_left_to_the_remux(multi_file_dataset):
    """A start that is not a sync sample: no fast cut (the remux path re-encodes it)."""
    path, _ = multi_file_dataset
    source, segment, fps = next(camera_segments(path))
    with open(source, "rb") as handle:
        table = mp4.read_sample_table(handle)
    presented = np.sort(table.pts)
    not_sync = [p for p in presented if not table.sync[np.flatnonzero(table.pts == p)[0]]]
    assert mp4.plan_cut(table, int(not_sync[0]), None) is None


@pytest.mark.parametrize("damage", ["fragmented", "no_moov", "truncated_moov"])
def test_unusual_files_are_left_to_the_demuxer(multi_file_dataset, damage):
    path, _ = multi_file_dataset
    source = next(camera_segments(path))[0]
    data = open(source, "rb").read()
    if damage == "fragmented":
        data = data + struct.pack(">I4s", 16, b"moof") + bytes(8)
    elif damage == "no_moov":
        at = data.index(b"moov") - 4
        data = data[:at] + data[at:at + 4] + b"free" + data[at + 8:]
    else:
        at = data.index(b"stsz") - 4
        data = data[:at + 16] + b"\x00\xff\xff\xff" + data[at + 20:]  # a sample count far beyond the box
    assert mp4.read_sample_table(io.BytesIO(data)) is None


def test_truncated_samples_are_a_video_error(tmp_path, multi_file_dataset):
    """Samples past the end of the file: one clear error, never a short file."""
    path, _ = multi_file_dataset
    source, segment, fps = list(camera_segments(path))[-1]
    data = open(source, "rb").read()
    moov = data.index(b"moov") - 4
    mdat = data.index(b"mdat") - 4
    cut_at = mdat + 8 + (moov - mdat) // 2 if mdat < moov else len(data) - 100
    damaged = tmp_path / "damaged.mp4"
    damaged.write_bytes(data[:cut_at] + data[moov:] if mdat < moov else data[:cut_at])
    with pytest.raises(video.VideoError):
        stream_copy.copy_segment(str(damaged), io.BytesIO(), start=segment.start, end=segment.end, frames=segment.frames, fps=fps)


def _b_frame_source(multi_file_dataset) -> tuple[bytearray, str, object, float]:
    path, _ = multi_file_dataset
    source, segment, fps = next(camera_segments(path))
    return bytearray(open(source, "rb").read()), source, segment, fps


def test_an_edit_that_hides_samples_is_left_to_the_demuxer(multi_file_dataset):
    data, *_ = _b_frame_source(multi_file_dataset)
    at = data.index(b"elst")
    assert data[at + 4] == 0  # version 0: u32 segment duration at +12
    struct.pack_into(">I", data, at + 12, struct.unpack_from(">I", data, at + 12)[0] // 2)
    assert mp4.read_sample_table(io.BytesIO(bytes(data))) is None


def test_absurd_sample_counts_are_refused_before_allocating(multi_file_dataset):
    data, *_ = _b_frame_source(multi_file_dataset)
    at = data.index(b"stts")
    struct.pack_into(">I", data, at + 12, 0xFFFFFFF0)  # first run: 4 billion samples
    assert mp4.read_sample_table(io.BytesIO(bytes(data))) is None


def test_one_size_for_all_samples_cannot_claim_a_file_of_samples(tmp_path, multi_file_dataset):
    """stsz with one size for every sample declares its count in 4 bytes: in a large file a tiny moov
    could claim a sample per byte, ~80 bytes of table each. Left to the demuxer, nothing allocated."""
    import tracemalloc

    data, *_ = _b_frame_source(multi_file_dataset)
    at = data.index(b"stsz")
    count = 1 << 27
    struct.pack_into(">II", data, at + 8, 1, count)  # after version/flags: size 1 for all, 134 million samples
    path = tmp_path / "uniform.mp4"
    with open(path, "wb") as handle:
        handle.write(data)
        handle.truncate(2 * count)  # sparse: a 256 MiB file holds the claimed samples' bytes
    tracemalloc.start()
    try:
        with open(path, "rb") as source:
            assert mp4.read_sample_table(source) is None
        assert tracemalloc.get_traced_memory()[1] < 16 << 20
    finally:
        tracemalloc.stop()


def test_damaged_headers_are_a_video_error_not_a_crash(tmp_path, multi_file_dataset):
    data, _, segment, fps = _b_frame_source(multi_file_dataset)
    at = data.index(b"mdhd")
    struct.pack_into(">I", data, at + 4 + 12, 0)  # timescale 0
    damaged = tmp_path / "ts0.mp4"
    damaged.write_bytes(data)
    with pytest.raises(video.VideoError):
        stream_copy.copy_segment(str(damaged), io.BytesIO(), start=segment.start, end=segment.end, frames=segment.frames, fps=fps)
    with pytest.raises(video.VideoError):
        stream_copy.copy_segment(str(tmp_path / "missing.mp4"), io.BytesIO(), start=0.0, end=1.0, frames=30, fps=30)


def test_negative_composition_offsets_go_through_the_remux(tmp_path):
    """FFmpeg's own dts shift for negative ctts differs from a plain reading: not cut here."""
    path = tmp_path / "negcts.mp4"
    with av.open(str(path), "w", options={"movflags": "negative_cts_offsets"}) as container:
        stream = container.add_stream("libx264", rate=30, options={"bf": "2", "g": "10"})
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for i in range(40):
            frame = av.VideoFrame.from_ndarray(np.full((48, 64, 3), i * 5, np.uint8), format="rgb24")
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    with open(path, "rb") as handle:
        table = mp4.read_sample_table(handle)
    assert table is not None and table.composition.min() < 0
    assert mp4.plan_cut(table, None, None) is None
    result = stream_copy.copy_segment(str(path), io.BytesIO(), start=0.0, end=40 / 30, frames=40, fps=30)
    assert result.frames == 40
