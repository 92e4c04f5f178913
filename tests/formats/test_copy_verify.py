"""Copy mode's default verification (`--verify_copies=true`): the copied samples' framing and first
picture, not a full decode, still refuse damaged source samples; `full` decodes every picture."""

import io

import numpy as np
import pytest

from formats import video
from formats.sources.lerobot_v3.sample import SyntheticLeRobot, write_dataset
from formats.video import bitstream, mp4, stream_copy
from tests.formats.segments import camera_segments

CODECS = ["av1", "h264", "hevc"]


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict:
    """codec -> (source MP4 path, its second segment, fps): two episodes in one file (h264/hevc with B-frames)."""
    found = {}
    for codec in CODECS:
        root = tmp_path_factory.mktemp(f"verify_{codec}") / "ds"
        write_dataset(str(root), SyntheticLeRobot(lengths=(12, 14), codec=codec, gop=2 if codec == "av1" else None,
                                                  cameras=("observation.images.top",), episodes_per_video_file=2))
        found[codec] = list(camera_segments(root))
    return found


def _copy(source: str, segment, fps: float, verify: str = stream_copy.SAMPLES) -> io.BytesIO:
    out = io.BytesIO()
    stream_copy.copy_segment(source, out, start=segment.start, end=segment.end, frames=segment.frames, fps=fps, verify=verify)
    return out


def _damaged(tmp_path, source: str, damage) -> tuple[str, int]:
    """The damaged copy of `source`, and which of its samples was damaged."""
    data = bytearray(open(source, "rb").read())
    table = mp4.read_sample_table(io.BytesIO(bytes(data)))
    sample = int(table.sizes[18:].argmax()) + 18  # the largest of the second episode's last samples (past what probing reads)
    damage(data, int(table.offsets[sample]), int(table.sizes[sample]))
    path = tmp_path / "damaged.mp4"
    path.write_bytes(bytes(data))
    return str(path), sample


def _framing_problem(path: str) -> str | None:
    data = open(path, "rb").read()
    table = mp4.read_sample_table(io.BytesIO(data))
    return bitstream.check_samples(bitstream.sample_format(table.stsd), data, table.offsets, table.sizes)


def _garbage_over_a_sample(data, offset, size):
    data[offset:offset + size] = (bytes(range(256)) * (size // 256 + 1))[:size]


def _zeros_over_a_sample(data, offset, size):  # a hole left by an interrupted download
    data[offset:offset + size] = bytes(size)


def _zero_run_inside_a_sample(data, offset, size):
    data[offset + size // 2:offset + size // 2 + 4] = bytes(4)


@pytest.mark.parametrize("codec", CODECS)
def test_every_valid_segment_passes_without_a_full_decode(sources, codec, monkeypatch):
    monkeypatch.setattr(stream_copy, "verify_decodes", lambda *_: pytest.fail("the default check decoded the whole file"))
    for source, segment, fps in sources[codec]:
        out = _copy(source, segment, fps)
        assert video.probe(io.BytesIO(out.getvalue())).frames == segment.frames


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("damage", [_garbage_over_a_sample, _zeros_over_a_sample], ids=lambda d: d.__name__[1:])
def test_damaged_samples_are_refused_by_the_default_check(sources, codec, damage, tmp_path):
    source, segment, fps = sources[codec][1]
    damaged, sample = _damaged(tmp_path, source, damage)
    assert _framing_problem(damaged).startswith(f"sample {sample}: ")
    # Refused: by the framing check, or before it where FFmpeg's probe of the source reads the damaged sample.
    with pytest.raises(video.VideoError, match=r"^(the copied samples do not decode \(sample \d+: .*\); the source video is damaged"
                                               r"|cannot open video: .*Invalid data)"):
        _copy(damaged, segment, fps)


@pytest.mark.parametrize("codec", ["h264", "hevc"])
def test_a_zero_run_inside_a_nal_unit_is_refused(sources, codec, tmp_path):
    source, segment, fps = sources[codec][1]
    damaged, sample = _damaged(tmp_path, source, _zero_run_inside_a_sample)
    with pytest.raises(video.VideoError, match=rf"^the copied samples do not decode \(sample {sample - 12}: a NAL unit holds a start code "
                                               r"or zero run \(0x000000-0x000002\)\); the source video is damaged$"):
        _copy(damaged, segment, fps)


def test_full_decodes_every_picture(sources, monkeypatch):
    calls = []
    monkeypatch.setattr(stream_copy, "verify_decodes", lambda written, frames: calls.append(frames))
    source, segment, fps = sources["h264"][1]
    _copy(source, segment, fps, verify=stream_copy.FULL)
    assert calls == [segment.frames]


def test_a_codec_without_a_framing_parser_is_decoded_whole(tmp_path, monkeypatch):
    root = tmp_path / "ds"
    write_dataset(str(root), SyntheticLeRobot(lengths=(4, 5), codec="h264", gop=None, cameras=("observation.images.top",),
                                              episodes_per_video_file=2))
    monkeypatch.setattr(stream_copy.bitstream, "sample_format", lambda stsd: None)
    calls = []
    monkeypatch.setattr(stream_copy, "verify_decodes", lambda written, frames: calls.append(frames))
    for source, segment, fps in camera_segments(root):
        _copy(source, segment, fps)
    assert calls == [4, 5]


def _nal_sample(*units: bytes) -> bytes:
    return b"".join(len(unit).to_bytes(4, "big") + unit for unit in units)


H264 = bitstream.SampleFormat("h264", 4)
IDR = b"\x65\x88\x84\x00\x21\xff\x80"  # an IDR slice header and payload, ending in its stop bit


@pytest.mark.parametrize("sample, problem", [
    (_nal_sample(IDR), None),
    (_nal_sample(IDR, b"\x0b"), None),  # end of stream: a NAL unit of its header alone
    (_nal_sample(IDR + b"\x00\x00"), None),  # trailing zeros some muxers leave (FFmpeg drops them)
    (_nal_sample(b"\x06\x05\x01\x80"), "no picture (VCL NAL unit) in the sample"),
    (_nal_sample(b"\xe5" + IDR[1:]), "a NAL unit's forbidden bit is set"),
    (_nal_sample(IDR[:3] + b"\x00\x00\x01" + IDR[3:]), "a NAL unit holds a start code or zero run (0x000000-0x000002)"),
    (_nal_sample(IDR)[:-1], "a NAL unit of 7 bytes does not fit the sample's 10 bytes"),
    (_nal_sample(IDR) + b"\x00\x00", "a NAL unit length field is cut off"),
], ids=["idr", "end-of-stream", "trailing-zeros", "no-picture", "forbidden-bit", "start-code", "overrun", "cut-length"])
def test_h264_framing_rules(sample, problem):
    found = bitstream.check_samples(H264, sample, np.array([0]), np.array([len(sample)]))
    assert found == (None if problem is None else f"sample 0: {problem}")


AV1 = bitstream.SampleFormat("av1")


@pytest.mark.parametrize("sample, problem", [
    (b"\x32\x03\x10\x00\x80", None),  # OBU_FRAME with its size
    (b"\x12\x00\x32\x03\x10\x00\x80", None),  # a temporal delimiter, then the frame
    (b"\x30\x10\x00\x80", None),  # the last OBU may leave its size out
    (b"\x12\x00", "no frame (FRAME or FRAME_HEADER OBU) in the sample"),
    (b"\xb2\x03\x10\x00\x80", "an OBU's forbidden bit is set"),
    (b"\x32\x09\x10\x00\x80", "an OBU of 9 bytes does not fit the sample's 5 bytes"),
    (b"\x32\xff", "an OBU size field is cut off"),
    (b"\x36", "an OBU header is cut off"),
], ids=["frame", "delimiter-frame", "unsized-last", "no-frame", "forbidden-bit", "overrun", "cut-size", "cut-header"])
def test_av1_framing_rules(sample, problem):
    found = bitstream.check_samples(AV1, sample, np.array([0]), np.array([len(sample)]))
    assert found == (None if problem is None else f"sample 0: {problem}")


def test_damage_the_framing_misses_in_the_first_picture_is_refused_by_decoding_it(tmp_path):
    """Bytes over the back of a keyframe's tile data keep the OBU framing; decoding that one picture
    refuses them here (dav1d conceals some such damage: neither this nor a full decode is a proof)."""
    write_dataset(str(tmp_path / "ds"), SyntheticLeRobot(lengths=(4,), codec="av1", width=320, height=240,
                                                         cameras=("observation.images.top",)))
    source = next(camera_segments(tmp_path / "ds"))[0]
    data = bytearray(open(source, "rb").read())
    table = mp4.read_sample_table(io.BytesIO(bytes(data)))
    first, size = int(table.offsets[0]), int(table.sizes[0])
    data[first + size // 2:first + size - 1] = b"\x55" * (size - 1 - size // 2)
    form = bitstream.sample_format(table.stsd)
    assert bitstream.check_samples(form, bytes(data), table.offsets, table.sizes) is None
    with pytest.raises(video.VideoError, match=r"^the copied samples do not decode \(.*Invalid data.*\); the source video is damaged$"):
        stream_copy.verify_samples(bytes(data), table.stsd, table.offsets, table.sizes, 4)
    stream_copy.verify_samples(open(source, "rb").read(), table.stsd, table.offsets, table.sizes, 4)
