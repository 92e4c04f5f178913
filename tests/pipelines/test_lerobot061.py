"""End to end, copy mode: the datasets lerobot 0.4.4 and 0.6.1 wrote themselves, and
convert_image_to_video_dataset's layout (episodes inside GOPs, HEVC B-frames across episode ends)
from the project's writer. Every array bit for bit, every video frame plane for plane."""

import io
import json

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from formats import storage, video
from formats.sources.lerobot_v3.sample import SyntheticLeRobot, write_dataset
from formats.video import stream_copy
from pipelines import convert, validate
from tests.conftest import shared_lerobot


def _convert(src, dst, *extra):
    return convert.run([f"--input={src}", f"--output={dst}", "--progress=off", *extra])


def _rows(dst):
    return pa.concat_tables([pq.read_table(p) for p in sorted((dst / "data").glob("*.parquet"))]).sort_by("sequence_id")


def _frames(source, start=None, end=None, fps=30.0):
    """Every frame's samples at their own bit depth (yuv420p planes, gray12le as uint16)."""
    return [frame.to_ndarray() for frame in video.iter_frames(source, start=start, end=end, fps=fps)]


# README "Video": lossy columns keep luma PSNR >= 35 dB against the source. The same bound is
# asserted on each chroma plane against the source's 2x2 means (measured on images_lerobot061:
# luma >= 41.0 dB, Cb >= 41.7 dB, Cr >= 39.5 dB; a wrong, shifted or colour-swapped frame is < 20 dB).
MIN_PSNR = 35.0


def _psnr(a, b):
    return 10 * np.log10(255.0**2 / max(np.mean((np.asarray(a, np.float64) - b) ** 2), 1e-12))


def _assert_close_to_png(frame, png, key):
    """One decoded yuv420p frame against the source PNG decoded by PIL and taken to limited-range
    BT.601 YCbCr by the textbook formula (no product code on this side)."""
    rgb = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), np.float64)
    height, width = rgb.shape[:2]
    assert height % 2 == 0 and width % 2 == 0 and frame.shape == (height * 3 // 2, width), key
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    y = 16 + (65.481 * r + 128.553 * g + 24.966 * b) / 255
    cb = 128 + (-37.797 * r - 74.203 * g + 112.0 * b) / 255
    cr = 128 + (112.0 * r - 93.786 * g - 18.214 * b) / 255
    half = height // 2, width // 2
    chroma = frame[height:].reshape(2, *half)  # yuv420p: Y, then U, then V, each plane contiguous
    quarter = lambda plane: plane.reshape(half[0], 2, half[1], 2).mean(axis=(1, 3))  # noqa: E731
    for name, got, expected in (("Y", frame[:height], y), ("Cb", chroma[0], quarter(cb)), ("Cr", chroma[1], quarter(cr))):
        assert _psnr(got, expected) >= MIN_PSNR, (key, name, _psnr(got, expected))


@pytest.fixture(scope="module", params=["so100_tiny", "multi_lerobot061", "stream_lerobot061", "images_lerobot061"])
def converted(request, tmp_path_factory):
    src = shared_lerobot(request.param)
    dst = tmp_path_factory.mktemp("lerobot_real") / request.param
    assert _convert(src, dst) == 0
    return src, dst


def test_real_datasets_convert_bit_and_pixel_exactly(converted):
    src, dst = converted
    info = json.loads((src / "meta/info.json").read_text())
    sidecar = json.loads((dst / "mixtrain.json").read_text())
    rows = _rows(dst)
    episodes = pa.concat_tables([pq.read_table(p) for p in sorted((src / "meta/episodes").glob("*/*.parquet"))]).sort_by("episode_index")
    data = pa.concat_tables([pq.read_table(p) for p in sorted((src / "data").glob("*/*.parquet"))]).sort_by("index")
    assert rows.column("episode_index").to_pylist() == episodes.column("episode_index").to_pylist()
    by_episode = data.column("episode_index").to_numpy()
    checked = {"values": 0, "frames": 0, "images": 0}
    for key, entry in sidecar["column_types"].items():
        source = entry.get("source")
        feature = info["features"].get(source, {})
        for row, episode in enumerate(episodes.to_pylist()):
            mine = by_episode == episode["episode_index"]
            # task_index is re-based per row on purpose (an index into the row's `tasks`, docs/lerobot_v3.md).
            if entry["type"] in ("trajectory", "steps") and source in data.column_names and source != "task_index":
                expected = data.column(source).filter(pa.array(mine)).combine_chunks()
                while pa.types.is_fixed_size_list(expected.type) or pa.types.is_list(expected.type):
                    expected = expected.flatten()
                got = rows.column(key)[row].values
                while pa.types.is_fixed_size_list(got.type) or pa.types.is_list(got.type):
                    got = got.flatten()
                assert got.type == expected.type, key  # the source dtype, never narrowed or widened
                assert got.to_numpy(zero_copy_only=False).tobytes() == expected.to_numpy(zero_copy_only=False).tobytes(), key
                checked["values"] += len(got)
            elif entry["type"] == "video":
                output = _frames(str(dst / rows.column(key)[row].as_py()))
                assert len(output) == episode["length"]
                if feature["dtype"] == "video":
                    prefix = f"videos/{source}/"
                    path = src / info["video_path"].format(video_key=source, chunk_index=episode[prefix + "chunk_index"],
                                                           file_index=episode[prefix + "file_index"])
                    expected = _frames(str(path), episode[prefix + "from_timestamp"], episode[prefix + "to_timestamp"], info["fps"])
                elif entry["is_depth_map"]:  # TIFF millimetres, value for value
                    cells = data.column(source).filter(pa.array(mine)).to_pylist()
                    expected = [video.ImageDecoder().decode(cell["bytes"], 0).to_ndarray() for cell in cells]
                else:  # RGB images are encoded lossily (H.264 yuv420p): within the lossy bound, against PIL's decode
                    cells = data.column(source).filter(pa.array(mine)).to_pylist()
                    assert len(cells) == len(output)
                    for frame, cell in zip(output, cells):
                        _assert_close_to_png(frame, cell["bytes"], key)
                    checked["frames"] += len(output)
                    checked["images"] += len(output)
                    continue
                assert len(expected) == len(output)
                for a, b in zip(output, expected):
                    assert a.dtype == b.dtype and np.array_equal(a, b), key
                checked["frames"] += len(output)
        if feature.get("info", {}).get("is_depth_map") or feature.get("info", {}).get("video.is_depth_map"):
            assert entry["is_depth_map"] is True
    assert checked["values"] > 0 and checked["frames"] > 0
    assert checked["images"] == (42 if src.name == "images_lerobot061" else 0)  # every RGB image of the fixture
    # Copy mode copied every lerobot-written segment: nothing here needed the lossless fallback.
    assert not any("not_copied" in entry for entry in sidecar["column_types"].values())
    # stats.json: mean/std/min/max/count as lerobot's meta/stats.json (lerobot's quantiles are per-episode bounds, not quantiles).
    ours = json.loads((dst / "stats.json").read_text())
    theirs = json.loads((src / "meta/stats.json").read_text())
    compared = 0
    for key, entry in sidecar["column_types"].items():
        if entry["type"] in ("trajectory", "steps") and entry.get("source") in theirs and key in ours and key != "task_index":
            for stat in ("mean", "std", "min", "max", "count"):
                np.testing.assert_allclose(np.ravel(ours[key][stat]), np.ravel(theirs[entry["source"]][stat]), rtol=0, atol=1e-5)
                compared += 1
    assert compared >= 10


def test_depth_metadata_of_lerobot061_stream():
    src = shared_lerobot("stream_lerobot061")
    from formats.sources import lerobot_v3
    fs, root = storage.open_root(str(src))
    meta, _ = lerobot_v3.plan(fs, root)
    depth = meta.column("video_realsense_depth").meta
    assert depth["is_depth_map"] is True and depth["pix_fmt"] == "gray12le" and depth["depth_unit"] == "mm"
    quantiser = depth["depth_quantization"]
    assert {k: quantiser[k] for k in ("depth_min", "depth_max", "shift", "use_log")} == {"depth_min": 0.01, "depth_max": 10.0,
                                                                                          "shift": 3.5, "use_log": True}
    assert meta.column("video_wrist").meta["is_depth_map"] is False


# convert_image_to_video_dataset: each video file is one encode of many episodes. AV1 keyframes every
# 2 frames, so an episode starting at an odd frame starts inside a GOP; x265 (B-frames, long GOP)
# puts every cut inside a GOP or between B-frames and the later frames they reference.
IMAGE_TO_VIDEO = SyntheticLeRobot(
    lengths=(7, 9, 6, 8), fps=15, lerobot_version="0.6.1", cameras=("observation.images.wrist",),
    depth_cameras=("observation.images.depth",), depth_codec="hevc", continuous_video=True, episodes_per_video_file=4,
)


def test_image_to_video_layout_is_pixel_exact_and_says_which_files_are_not_copies(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    truth = write_dataset(str(src), IMAGE_TO_VIDEO)
    assert _convert(src, dst) == 0
    sidecar = json.loads((dst / "mixtrain.json").read_text())
    rows = _rows(dst)
    starts = np.cumsum((0,) + IMAGE_TO_VIDEO.lengths[:-1])
    source = src / "videos/observation.images.wrist/chunk-000/file-000.mp4"
    for column, camera in (("video_wrist", "observation.images.wrist"), ("video_depth", "observation.images.depth")):
        entry = sidecar["column_types"][column]
        assert entry["written_as"] == "copy+lossless" and entry["lossless"] is True
        not_copied = entry["not_copied"]
        for row, sequence_id in enumerate(rows.column("sequence_id").to_pylist()):
            path = str(dst / rows.column(column)[row].as_py())
            codec = video.probe(path).codec
            if sequence_id in not_copied:  # x264 lossless for 8-bit YUV, FFV1 for 12-bit depth
                assert not_copied[sequence_id]["written_as"] == "lossless"
                assert codec == not_copied[sequence_id]["codec"] == ("h264" if column == "video_wrist" else "ffv1")
            else:
                assert codec == ("av1" if column == "video_wrist" else "hevc")
            output = _frames(path)
            length = IMAGE_TO_VIDEO.lengths[row]
            assert len(output) == length
            if column == "video_depth":  # 12-bit codes, all of them, exactly
                assert output[0].dtype == np.uint16
                np.testing.assert_array_equal(np.stack(output), truth["frames"][camera][row])
            else:
                expected = _frames(str(source), starts[row] / 15, (starts[row] + length) / 15, 15)
                np.testing.assert_array_equal(np.stack(output), np.stack(expected))
    # AV1: the episodes starting at an odd frame (7 and 7 + 9 + 6 = 22 is even; 7 + 9 = 16 even) are the ones re-written.
    assert set(sidecar["column_types"]["video_wrist"]["not_copied"]) == {"episode_000001"}
    assert sidecar["column_types"]["video_wrist"]["not_copied"]["episode_000001"]["reason"] == "the segment starts inside a GOP"
    assert set(sidecar["column_types"]["video_depth"]["not_copied"]) == {f"episode_{i:06d}" for i in range(4)}
    assert validate.validate(str(dst)) == []
    findings, _ = validate.deep_check(str(dst))
    assert findings == []
    # An --incremental rerun reuses every file and still names the ones that are not copies.
    assert _convert(src, dst, "--incremental") == 0
    again = json.loads((dst / "mixtrain.json").read_text())
    assert again["incremental"]["reused_sequences"] == 4
    for column in ("video_wrist", "video_depth"):
        assert again["column_types"][column]["not_copied"] == sidecar["column_types"][column]["not_copied"]


def test_copied_hevc_cut_never_loses_a_b_frame(tmp_path):
    """The cut that used to lose a frame: packets of the episode interleave in decode order with a
    later frame they reference. The written file holds what it decodes to, all T frames."""
    src = tmp_path / "src"
    truth = write_dataset(str(src), IMAGE_TO_VIDEO)
    path = str(src / "videos/observation.images.depth/chunk-000/file-000.mp4")
    with av.open(path) as container:
        packets = [(p.pts, p.dts) for p in container.demux(video=0) if p.size]
    tick = 1024  # 1/15 s in the 1/15360 time base
    first_episode = [i for i, (pts, _) in enumerate(packets) if pts < 7 * tick]
    assert first_episode != list(range(len(first_episode)))  # a later frame is decoded among episode 0's
    out = tmp_path / "cut.mp4"
    result = stream_copy.copy_segment(path, str(out), start=0.0, end=7 / 15, frames=7, fps=15)
    assert result.frames == 7 and len(_frames(str(out))) == 7 and result.written_as == "lossless"
    np.testing.assert_array_equal(np.stack(_frames(str(out))), truth["frames"]["observation.images.depth"][0])


def test_streaming_recorder_layout_is_copied_packet_for_packet(tmp_path):
    """lerobot 0.6's recorder: every episode its own encode (AV1 RGB, HEVC gray12le depth with
    B-frames), joined by stream copy. Every segment is a packet copy, 12-bit codes intact."""
    spec = SyntheticLeRobot(lengths=(9, 6, 11), fps=15, lerobot_version="0.6.1", cameras=("observation.images.wrist",),
                            depth_cameras=("observation.images.depth",), depth_codec="hevc", episodes_per_video_file=3)
    src, dst = tmp_path / "src", tmp_path / "dst"
    truth = write_dataset(str(src), spec)
    assert _convert(src, dst) == 0
    types = json.loads((dst / "mixtrain.json").read_text())["column_types"]
    assert types["video_depth"]["written_as"] == "copy" and "not_copied" not in types["video_depth"]
    assert types["video_depth"]["is_depth_map"] is True and types["video_depth"]["depth_quantization"]["use_log"] is True
    rows = _rows(dst)
    for row in range(3):
        path = str(dst / rows.column("video_depth")[row].as_py())
        assert video.probe(path).codec == "hevc" and video.probe(path).pix_fmt == "gray12le"
        np.testing.assert_array_equal(np.stack(_frames(path)), truth["frames"]["observation.images.depth"][row])
