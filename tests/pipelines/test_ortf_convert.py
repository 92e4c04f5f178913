"""End to end: ORTF -> Mixtrain through the CLI."""

import json

import pyarrow as pa
import pyarrow.parquet as pq

from formats.sources.ortf.sample import SyntheticORTF, write_dataset
from pipelines import convert, validate


def _convert(src, dst, *extra):
    return convert.run([f"--input={src}", f"--output={dst}", "--progress=off", *extra])


def _rows(dst):
    return pa.concat_tables([pq.read_table(p) for p in sorted((dst / "data").glob("*.parquet"))]).sort_by("sequence_id")


def test_copy_mode_identical_videos_files_and_manifest(tmp_path):
    src = tmp_path / "ortf"
    truth = write_dataset(str(src), SyntheticORTF(slow_camera=None))
    dst = tmp_path / "out"
    assert _convert(src, dst, "--num_shards=2") == 0
    assert validate.validate(str(dst)) == []
    findings, summary = validate.deep_check(str(dst))
    assert findings == []
    assert sorted(summary) == sorted(f"video_{camera}: 5 videos, 54 frames, 5/5 pixel-identical"
                                     for camera in ("cam_wrist", "cam_overhead", "depth"))
    rows = _rows(dst)
    assert rows.num_rows == 5
    by_id = {row["episode_id"]: row for row in rows.to_pylist()}
    for number, row in enumerate(truth["episode_rows"]):
        out = by_id[row["episode_id"]]
        # Copied files are the source's bytes; videos that are exactly the episode too.
        assert (dst / out["audio"]).read_bytes() == (src / row["audio_file"]).read_bytes()
        assert (dst / out["video_cam_wrist"]).read_bytes() == (src / row["video_files"]["cam_wrist"]).read_bytes()
        assert (dst / out["annotation_files"][0]).read_bytes() == (src / f"annotations/episode_{number:06d}/first_frame.jpg").read_bytes()
        assert json.loads(out["scene_objects"]) == truth["episodes"][number]["scene_objects"]
        assert out["operator_notes"] == row["operator_notes"] and out["failure_reason"] == row["failure_reason"]
    sidecar = json.loads((dst / "mixtrain.json").read_text())
    assert sidecar["source"]["manifest"]["robot"]["name"] == "Franka Panda"
    assert sidecar["source"]["assets"] == ["files/_dataset/robot/meshes/link0.stl", "files/_dataset/robot/panda.urdf"]
    assert (dst / "files/_dataset/robot/panda.urdf").read_bytes() == (src / "robot/panda.urdf").read_bytes()
    assert sidecar["column_types"]["audio"]["type"] == "audio" and sidecar["column_types"]["audio"]["file_reference"]
    assert sidecar["column_types"]["scene_objects"]["type"] == "json"
    assert sidecar["column_types"]["action"]["names"][-1] == "gripper"


def test_slow_camera_retimed_and_reencode_mode(tmp_path):
    src = tmp_path / "ortf"
    write_dataset(str(src), SyntheticORTF(lengths=(8, 6, 9)))
    for mode in ("copy", "reencode"):
        dst = tmp_path / mode
        assert _convert(src, dst, f"--video={mode}") == 0
        findings, summary = validate.deep_check(str(dst))
        assert findings == [], findings
        overhead = next(line for line in summary if line.startswith("video_cam_overhead"))
        assert "3 videos, 23 frames" in overhead and float(overhead.split("PSNR ")[1].split(" ")[0]) >= 35
        assert json.loads((dst / "mixtrain.json").read_text())["column_types"]["video_cam_overhead"]["written_as"] == (
            "retime" if mode == "copy" else "encode")


def test_frame_index_beyond_the_video_is_a_clear_error(tmp_path, capsys):
    src = tmp_path / "ortf"
    write_dataset(str(src), SyntheticORTF(lengths=(8, 6)))
    steps = src / "data/chunk-000/steps.parquet"
    table = pq.read_table(steps)
    column = "observation.images.cam_overhead.frame_index"
    values = table.column(column).to_pylist()
    values[7] = 40
    pq.write_table(table.set_column(table.schema.get_field_index(column), column, pa.array(values)), steps)
    assert _convert(src, tmp_path / "out") == 1
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("error: ") and "cam_overhead/chunk-000/episode_000000.mp4: ep-0000_kitchen_0 (video_cam_overhead)" in error
    assert error.endswith("frame_index 40 is beyond the video's 4 frames")


def test_absolute_clock_is_kept_when_timestamps_are_not_episode_relative(tmp_path):
    src = tmp_path / "ortf"
    truth = write_dataset(str(src), SyntheticORTF(lengths=(5, 4), audio=False, annotations=False))
    manifest = json.loads((src / "meta/manifest.json").read_text())
    manifest["timestamp_reference"] = "unix_epoch"
    (src / "meta/manifest.json").write_text(json.dumps(manifest))
    dst = tmp_path / "out"
    assert _convert(src, dst) == 0
    rows = _rows(dst).to_pylist()
    by_id = {row["episode_id"]: row for row in rows}
    episode = truth["episodes"][1]
    assert by_id[episode["episode_id"]]["timestamp_s"] == episode["timestamp"].tolist()
    assert by_id[episode["episode_id"]]["timestamp"][0] == 0.0


def test_a_copied_camera_whose_episode_had_to_be_retimed_or_cut_says_so(tmp_path):
    """mixtrain.json never labels a re-encoded file `copy`: an episode whose frame_index skips a
    frame is re-timed (near-lossless), a longer file cut mid-GOP is encoded losslessly; both named."""
    import io

    import av
    import pyarrow as pa
    import pyarrow.parquet as pq

    from formats.sources.lerobot_v3.sample import synthetic_frames
    from formats.sources.ortf.sample import SyntheticORTF, write_dataset

    src = tmp_path / "ortf"
    write_dataset(str(src), SyntheticORTF(lengths=(5, 9, 6), slow_camera=None, depth_format=None, audio=False, annotations=False,
                                          failed_episodes=()))
    steps = src / "data/chunk-000/steps.parquet"
    table = pq.read_table(steps)
    column = "observation.images.cam_overhead.frame_index"
    indices = table.column(column).to_pylist()
    indices[3] = indices[2]  # episode 0 repeats a frame: its video cannot be copied as it is
    pq.write_table(table.set_column(table.schema.get_field_index(column), column, pa.array(indices, table.schema.field(column).type)), steps)
    buffer = io.BytesIO()  # episode 0's wrist file runs on for 20 frames, H.264 with B-frames
    with av.open(buffer, "w", format="mp4") as output:
        stream = output.add_stream("libx264", rate=15)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        stream.options = {"bf": "3", "g": "250", "b-adapt": "0", "crf": "18"}
        for i, array in enumerate(synthetic_frames(0, 0, 20, 48, 64)):
            frame = av.VideoFrame.from_ndarray(array, format="rgb24")
            frame.pts = i
            output.mux(stream.encode(frame))
        output.mux(stream.encode(None))
    (src / "videos/cam_wrist/chunk-000/episode_000000.mp4").write_bytes(buffer.getvalue())
    dst = tmp_path / "out"
    assert _convert(src, dst) == 0
    types = json.loads((dst / "mixtrain.json").read_text())["column_types"]
    overhead, wrist = types["video_cam_overhead"], types["video_cam_wrist"]
    assert (overhead["written_as"], overhead["lossless"]) == ("copy+retime", False)
    assert list(overhead["not_copied"]) == ["ep-0000_kitchen_0"] and overhead["not_copied"]["ep-0000_kitchen_0"]["written_as"] == "retime"
    assert (wrist["written_as"], wrist["lossless"]) == ("copy+lossless", True)
    assert wrist["not_copied"]["ep-0000_kitchen_0"]["written_as"] == "lossless"
    assert validate.deep_check(str(dst))[0] == []  # the cut compares with the file's first 5 frames, pixel for pixel


def test_a_whole_file_whose_clock_does_not_start_at_zero_is_rebased(tmp_path):
    """Frame i must be at i / fps: a byte-for-byte copy of a file starting at t=1 s would shift every frame."""
    import io

    import av

    from formats import video
    from formats.sources.lerobot_v3.sample import synthetic_frames
    from formats.sources.ortf.sample import SyntheticORTF, write_dataset

    src = tmp_path / "ortf"
    write_dataset(str(src), SyntheticORTF(lengths=(6, 5), slow_camera=None, depth_format=None, audio=False, annotations=False,
                                          failed_episodes=()))
    target = src / "videos/cam_wrist/chunk-000/episode_000000.mp4"
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as output:
        stream = output.add_stream("libx264", rate=15)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        stream.options = {"bf": "0", "g": "1"}
        for i, array in enumerate(synthetic_frames(0, 0, 6, 48, 64)):
            frame = av.VideoFrame.from_ndarray(array, format="rgb24")
            frame.pts = 15 + i  # the recorder's clock: 1 s in
            output.mux(stream.encode(frame))
        output.mux(stream.encode(None))
    target.write_bytes(buffer.getvalue())
    assert video.first_time(str(target)) == 1.0
    dst = tmp_path / "out"
    assert _convert(src, dst) == 0
    written = dst / "files/video_cam_wrist/ep-0000_kitchen_0.mp4"
    assert video.first_time(str(written)) == 0.0 and video.probe(str(written)).frames == 6
    assert validate.deep_check(str(dst))[0] == []
