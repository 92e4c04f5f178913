"""Copy mode's default verification (`--verify_copies=true`): the copied samples' framing and first
picture, not a full decode, still refuse damaged source samples; `full` decodes every picture."""

import io

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
