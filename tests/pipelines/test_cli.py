"""The real command line in a subprocess: help, strict options, one error line per failure, interrupts,
progress, dry runs, and nothing left behind in the temp folder."""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from formats.sources.l5kit.sample import SyntheticL5Kit
from formats.sources.l5kit.sample import write_dataset as write_l5kit
from formats.sources.lerobot_v3.sample import SyntheticLeRobot
from formats.sources.lerobot_v3.sample import write_dataset as write_lerobot
from formats.sources.ortf.sample import SyntheticORTF
from formats.sources.ortf.sample import write_dataset as write_ortf
from formats.sources.rlds.sample import SyntheticRLDS
from formats.sources.rlds.sample import write_dataset as write_rlds
from pipelines import cli
from tests.conftest import small_tmpfs

ROOT = pathlib.Path(__file__).resolve().parents[2]
TWO_WORKERS = ("--direct_num_workers=2", "--direct_running_mode=multi_processing")
LOG_HINT = re.compile(r"^\(Beam's and the workers' log of this run: (.+?\.log)(?:; the sequences it completed are kept in .+)?\)$")


def _cli(tmp_path: pathlib.Path, *args: str, module: str = "pipelines.convert", wait: bool = True, **popen):
    """Run the command with a private TMPDIR and log folder; returns the CompletedProcess (or Popen)."""
    temp = tmp_path / "tmpdir"
    temp.mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(temp), "XDG_CACHE_HOME": str(tmp_path / "cache"), "SVT_LOG": "1"}
    command = [sys.executable, "-m", module, *args]
    if not wait:
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def _lines(text: str) -> list[str]:
    return text.strip().splitlines()


def test_help_lists_every_option_without_importing_beam(tmp_path):
    done = _cli(tmp_path, "--help")
    assert done.returncode == 0 and done.stderr == ""
    options = [option for action in cli.build_parser()._actions for option in action.option_strings]
    assert len(options) > 25
    assert [option for option in options if option not in done.stdout] == []
    for heading in ("conversion:", "video:", "output:", "progress and logs:", "RLDS options", "Beam options:", "exit status:"):
        assert heading in done.stdout
    probe = subprocess.run([sys.executable, "-c", "import sys; sys.argv = ['convert', '--help']\n"
                            "from pipelines import convert\n"
                            "try:\n    convert.main()\nexcept SystemExit:\n    pass\n"
                            "print(sorted(m for m in ('apache_beam', 'pyarrow', 'av') if m in sys.modules))"],
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert probe.stdout.strip().splitlines()[-1] == "[]"


def test_help_beam_lists_beams_own_options(tmp_path):
    done = _cli(tmp_path, "--help_beam")
    assert done.returncode == 0
    for option in ("--runner", "--direct_num_workers", "--temp_location", "--setup_file", "--dask_client_address"):
        assert option in done.stdout


def test_the_format_ids_known_to_the_command_line_are_the_registered_sources():
    from formats import sources
    from formats.video import policy, stream_copy

    assert set(cli.SOURCE_IDS) == set(sources.SOURCES)
    assert set(cli.VIDEO_CODECS) == set(policy.ENCODERS)  # ffv1 too: --video_codec=ffv1, lossless
    assert set(cli.VIDEO_MODES) == set(policy.MODES)
    assert cli.VERIFY_MODES == stream_copy.VERIFY_MODES == (stream_copy.SAMPLES, stream_copy.FULL, stream_copy.OFF)


@pytest.mark.parametrize("value, mode", [("true", "samples"), ("yes", "samples"), ("full", "full"), ("FULL", "full"),
                                         ("false", "off"), ("0", "off")])
def test_verify_copies_takes_a_boolean_or_full(value, mode):
    assert cli.verify_mode(value) == mode


def test_verify_copies_refuses_other_values():
    with pytest.raises(argparse.ArgumentTypeError, match="expected true, full or false, found 'decode'"):
        cli.verify_mode("decode")


@pytest.fixture(scope="module")
def small_lerobot(tmp_path_factory) -> pathlib.Path:
    src = tmp_path_factory.mktemp("cli_src") / "ds"
    write_lerobot(str(src), SyntheticLeRobot(lengths=(6, 5, 7), codec="h264", gop=None, episodes_per_video_file=2))
    return src


@pytest.mark.parametrize("typo, meant", [
    ("--vidoe=reencode", "--video"),
    ("--num-shards=3", "--num_shards"),
    ("--overwirte", "--overwrite"),
    ("--target_shard=5", "--target_shard_mb"),
    ("--direct_runing_mode=multi_processing", "--direct_running_mode"),
])
def test_a_misspelt_option_is_refused_with_a_suggestion(tmp_path, small_lerobot, typo, meant):
    dst = tmp_path / "out"
    done = _cli(tmp_path, f"--input={small_lerobot}", f"--output={dst}", typo)
    assert done.returncode == 2
    assert _lines(done.stderr) == [f"error: unknown option {typo.split('=')[0]}", f"did you mean {meant}?"]
    assert done.stdout == "" and not dst.exists()


def test_a_source_the_input_is_not_says_what_auto_detection_sees(tmp_path, small_lerobot):
    done = _cli(tmp_path, f"--input={small_lerobot}", f"--output={tmp_path / 'out'}", "--source=rlds")
    assert (done.returncode, _lines(done.stderr)[0]) == (1, f"error: file://{small_lerobot}: --source=rlds, but this is not a rlds "
                                                            "dataset (its dataset_info.json is missing); auto-detection finds "
                                                            "lerobot_v3: pass --source=lerobot_v3 or leave --source out")


def test_a_lerobot_folder_that_lost_its_info_json_is_named(tmp_path, small_lerobot):
    src = tmp_path / "lost"
    shutil.copytree(small_lerobot, src)
    (src / "meta" / "info.json").unlink()
    done = _cli(tmp_path, f"--input={src}", f"--output={tmp_path / 'out'}", "--source=lerobot_v3")
    assert (done.returncode, _lines(done.stderr)[0]) == (1, f"error: file://{src}: --source=lerobot_v3, but this is not a lerobot_v3 "
                                                            "dataset (its meta/info.json is missing); auto-detection finds no known "
                                                            "format there either")


@pytest.mark.parametrize("args, message", [
    (("--video_codec=hevc", "--video_crf=30"),
     ["error: --video_codec has no effect: --video=copy copies every camera of this dataset (video_front, video_wrist) without encoding",
      "pass --video=reencode to encode them"]),
    (("--split=train",), ["error: --split is an option of --source=rlds; it has no effect on this lerobot_v3 dataset"]),
    (("--video=reencode", "--video_codec=ffv1", "--video_crf=3"),
     ["error: --video_crf has no effect with --video_codec=ffv1 (lossless: each camera is kept in its own pixel format, every value)"]),
    (("--num_shards=2", "--target_shard_mb=10"),
     ["error: --target_shard_mb has no effect with --num_shards (the shard count is given); pass one of them"]),
    (("--detach",), ["error: --detach has no effect on a local runner (the run is this process); it is for --runner=DataflowRunner"]),
    (("--fps=-10",), ["error: argument --fps: expected a number > 0, found '-10'", "python -m pipelines.convert --help lists every option"]),
    (("--fps=nan",), ["error: argument --fps: expected a number > 0, found 'nan'", "python -m pipelines.convert --help lists every option"]),
    (("--source=lerobot",), ["error: argument --source: invalid choice: 'lerobot' (choose from 'auto', 'l5kit', 'lerobot_v2', "
                             "'lerobot_v3', 'ortf', 'rlds'); did you mean 'lerobot_v3'?", "python -m pipelines.convert --help lists every option"]),
    (("extra",), ["error: unexpected argument 'extra' (options are written --name=value)",
                  "python -m pipelines.convert --input=SRC --output=DST"]),
    (("--progress=off", "--progress_interval=1"),
     ["error: --progress_interval has no effect with --progress=off (it spaces plain progress lines)"]),
    (("--progress=bar", "--progress_interval=1"),
     ["error: --progress_interval has no effect with --progress=bar (it spaces plain progress lines)"]),
])
def test_options_without_effect_and_bad_values_are_refused(tmp_path, small_lerobot, args, message):
    dst = tmp_path / "out"
    done = _cli(tmp_path, f"--input={small_lerobot}", f"--output={dst}", *args)
    assert (done.returncode, _lines(done.stderr)) == (2, message)
    assert not dst.exists() and os.listdir(tmp_path / "tmpdir") == []


@pytest.fixture(scope="module")
def without_cameras(tmp_path_factory) -> dict:
    """Datasets with no camera at all: LeRobot without video features, and L5Kit (never any)."""
    base = tmp_path_factory.mktemp("no_cameras")
    write_lerobot(str(base / "lerobot_v3"), SyntheticLeRobot(lengths=(4, 3), cameras=()))
    write_l5kit(str(base / "l5kit.zarr"), SyntheticL5Kit(scene_lengths=(4,)))
    return {"lerobot_v3": base / "lerobot_v3", "l5kit": base / "l5kit.zarr"}


@pytest.mark.parametrize("source, option", [("lerobot_v3", "--video=reencode"), ("lerobot_v3", "--video=copy"),
                                            ("lerobot_v3", "--video_stats"), ("lerobot_v3", "--video_codec=hevc"),
                                            ("lerobot_v3", "--verify_copies"), ("l5kit", "--video=reencode")])
def test_video_options_on_a_dataset_without_cameras_are_refused(tmp_path, without_cameras, source, option):
    """README: `--video`/`--video_stats` (and the encoding options) on a dataset without cameras
    change nothing, so they are refused, even typed with their default value (--video=copy)."""
    dst = tmp_path / "out"
    done = _cli(tmp_path, f"--input={without_cameras[source]}", f"--output={dst}", "--progress=off", option)
    name = option.split("=")[0]
    assert (done.returncode, _lines(done.stderr)) == (2, [f"error: {name} has no effect: this {source} dataset has no cameras"])
    assert not dst.exists() and os.listdir(tmp_path / "tmpdir") == []


def test_missing_input_or_output_points_to_the_full_help(tmp_path):
    done = _cli(tmp_path, "--input=x")
    assert (done.returncode, _lines(done.stderr)) == (2, ["error: --input and --output are required",
                                                          "python -m pipelines.convert --help lists every option"])


def _missing_video(root: pathlib.Path) -> tuple[str, str]:
    write_lerobot(str(root), SyntheticLeRobot(lengths=(6, 5, 7), codec="h264", gop=None, episodes_per_video_file=3))
    video = root / "videos/observation.images.front/chunk-000/file-000.mp4"
    video.unlink()
    return str(video), "episode_000000 (video_front): video file not found"


def _zeroed_video(root: pathlib.Path) -> tuple[str, str]:
    write_lerobot(str(root), SyntheticLeRobot(lengths=(6, 5), codec="h264", gop=None, cameras=("observation.images.top",)))
    video = root / "videos/observation.images.top/chunk-000/file-000.mp4"
    video.write_bytes(bytes(video.stat().st_size))
    return str(video), "episode_000000 (video_top): "


def _truncated_data(root: pathlib.Path) -> tuple[str, str]:
    write_lerobot(str(root), SyntheticLeRobot(lengths=(5, 4, 6), cameras=(), episodes_per_data_file=2))
    data = root / "data/chunk-000/file-001.parquet"
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    return str(data), "episode_000002: cannot read data:"


def _schema_drift(root: pathlib.Path) -> tuple[str, str]:
    write_lerobot(str(root), SyntheticLeRobot(lengths=(5, 4, 6), cameras=(), episodes_per_data_file=2))
    data = root / "data/chunk-000/file-001.parquet"
    table = pq.read_table(data)
    column = pa.FixedSizeListArray.from_arrays(pa.array(range(len(table) * 6), pa.int64()), 6)
    pq.write_table(table.set_column(table.schema.get_field_index("action"), "action", column), data)
    return str(data), "episode_000002: schema drift between data files"


def _symlink_out_of_root(root: pathlib.Path) -> tuple[str, str]:
    write_ortf(str(root), SyntheticORTF(lengths=(4, 3), audio=False, annotations=False, slow_camera=None))
    target = root / "videos/cam_wrist/chunk-000/episode_000001.mp4"
    outside = root.parent / "outside.mp4"
    shutil.move(target, outside)
    os.symlink(outside, target)
    return "videos/cam_wrist/chunk-000/episode_000001.mp4", "outside the dataset root"


def _bad_features(root: pathlib.Path) -> tuple[str, str]:
    write_rlds(str(root), SyntheticRLDS(splits={"train": (3,)}, shards={"train": 1}))
    (root / "features.json").write_text("{not json")
    return str(root / "features.json"), "malformed JSON"


def _bad_zarray(root: pathlib.Path) -> tuple[str, str]:
    write_l5kit(str(root), SyntheticL5Kit(scene_lengths=(4,)))
    (root / "frames/.zarray").write_text("[1,")
    return str(root / "frames/.zarray"), "malformed JSON"


BAD_INPUTS = {fn.__name__.lstrip("_"): fn for fn in (_missing_video, _zeroed_video, _truncated_data, _schema_drift,
                                                      _symlink_out_of_root, _bad_features, _bad_zarray)}


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_one_error_line_and_the_log_path(tmp_path, case, workers):
    src = tmp_path / "src"
    file, message = BAD_INPUTS[case](src)
    dst = tmp_path / "out"
    parallel = TWO_WORKERS if workers == 2 else ("--direct_num_workers=1",)
    done = _cli(tmp_path, f"--input={src}", f"--output={dst}", *parallel)
    assert done.returncode == 1, done.stderr
    lines = _lines(done.stderr)
    assert len(lines) == 2, done.stderr
    assert lines[0].startswith("error: ") and file in lines[0] and message in lines[0], lines[0]
    log = pathlib.Path(LOG_HINT.match(lines[1]).group(1))
    assert log.parent == tmp_path / "cache/mixtrain-convert/logs" and log.stat().st_size > 0
    assert not dst.exists()
    assert os.listdir(tmp_path / "tmpdir") == []  # Beam's beam-pipeline-temp* and ours are gone


def test_success_prints_progress_with_a_total_and_leaves_no_temp_files(tmp_path):
    src = tmp_path / "many"
    write_lerobot(str(src), SyntheticLeRobot(lengths=(20,) * 300, codec="h264", gop=None, episodes_per_video_file=50,
                                             episodes_per_data_file=50, cameras=("observation.images.top",)))
    dst = tmp_path / "out"
    done = _cli(tmp_path, f"--input={src}", f"--output={dst}", "--video=reencode", "--progress=lines", "--progress_interval=0.2",
                *TWO_WORKERS)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    lines = _lines(done.stdout)
    assert lines[0] == f"[mixtrain-convert] lerobot_v3: 300 sequences -> {dst} (1 shard)"
    assert re.fullmatch(rf"converted 300 sequences, 6000 timesteps, [0-9.]+ MB in [0-9.]+ s -> {dst}", lines[-1])
    progress = [re.match(r"\[mixtrain-convert\] (\d+)/300 sequences \((\d+)%\), (\d+) timesteps, ([0-9.]+) MB written", line)
                for line in lines[1:-1]]
    assert progress and all(progress), lines
    done_counts = [int(match.group(1)) for match in progress]
    assert len(done_counts) >= 2 and done_counts == sorted(done_counts) and done_counts[-1] > done_counts[0]
    assert all(int(match.group(3)) == 20 * int(match.group(1)) for match in progress)
    assert os.listdir(tmp_path / "tmpdir") == []


@pytest.fixture(scope="module")
def four_hundred_episodes(tmp_path_factory) -> pathlib.Path:
    """400 episodes to re-encode: a run still converting when its first progress line comes.
    Written once for the four interrupts (8 s each time); read, never changed."""
    src = tmp_path_factory.mktemp("interrupts") / "many"
    write_lerobot(str(src), SyntheticLeRobot(lengths=(30,) * 400, codec="h264", gop=None, episodes_per_video_file=100,
                                             episodes_per_data_file=100, cameras=("observation.images.top",)))
    return src


@pytest.mark.parametrize("signum, code, group, workers", [(signal.SIGINT, 130, False, TWO_WORKERS), (signal.SIGTERM, 143, False, TWO_WORKERS),
                                                    (signal.SIGINT, 130, True, TWO_WORKERS),
                                                    (signal.SIGINT, 130, True, ("--direct_num_workers=1",))],
                         ids=["sigint", "sigterm", "ctrl-c-to-the-process-group", "ctrl-c-one-worker-in-process"])
def test_an_interrupt_exits_with_one_line_no_staging_and_no_process(tmp_path, four_hundred_episodes, signum, code, group, workers):
    dst = tmp_path / "out"
    process = _cli(tmp_path, f"--input={four_hundred_episodes}", f"--output={dst}", "--video=reencode", "--progress=lines", "--progress_interval=0.1",
                   *workers, wait=False, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # interrupt once sequences are being converted by the workers
        line = process.stdout.readline()
        if re.search(r" [1-9]\d*/400 sequences", line) or not line:
            break
    if group:  # what a terminal's Ctrl-C does: the launcher, the zygote, the clients and the workers all get it
        os.killpg(process.pid, signum)
    else:
        process.send_signal(signum)
    stdout, stderr = process.communicate(timeout=120)  # stops in about 10 s on 2 cores
    assert process.returncode == code, stderr
    (line,) = _lines(stderr)
    assert re.fullmatch(rf"error: interrupted \({signal.Signals(signum).name}\): the output was left as it was(; the sequences it "
                        rf"completed are kept in {re.escape(str(tmp_path))}/\.out\.mixtrain-\S+: run the same command again to "
                        r"resume, or add --fresh to start afresh)?", line), line
    assert "converted" not in stdout
    assert not dst.exists()  # nothing published (the output folder did not exist before); what was completed kept beside it
    assert os.listdir(tmp_path / "tmpdir") == []
    assert _until_none_mention(str(dst), f"connect mixtrain-workers-{process.pid}-") == []


def _until_none_mention(*needles: str, seconds: float = 30) -> list[str]:
    """The processes still mentioning a needle once they had `seconds` to exit (polled: a worker
    that takes 0.6 s to unwind is no failure, one still there after `seconds` is)."""
    deadline = time.monotonic() + seconds
    while (found := _processes_mentioning(*needles)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


def _processes_mentioning(*needles: str) -> list[str]:
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(needle in command for needle in needles):
            found.append(command)
    return found


def test_verbose_prints_the_log_too(tmp_path, small_lerobot):
    done = _cli(tmp_path, f"--input={small_lerobot}", f"--output={tmp_path / 'out'}", "--verbose", "--progress=off")
    assert done.returncode == 0
    assert "INFO" in done.stderr and "Traceback" not in done.stderr
    logs = list((tmp_path / "cache/mixtrain-convert/logs").glob("*.log"))
    assert len(logs) == 1 and "INFO" in logs[0].read_text()


def test_validate_deep_says_nothing_of_videos_where_there_are_none(tmp_path):
    src = tmp_path / "l5kit"
    write_l5kit(str(src), SyntheticL5Kit(scene_lengths=(4, 5)))
    dst = tmp_path / "out"
    assert _cli(tmp_path, f"--input={src}", f"--output={dst}", "--progress=off").returncode == 0
    done = _cli(tmp_path, str(dst), "--deep", module="pipelines.validate")
    assert done.returncode == 0, done.stdout + done.stderr
    assert _lines(done.stdout) == ["no video columns", f"ok: {dst} is a valid Mixtrain dataset (deep: no video columns to compare)"]
    (dst / "data").joinpath(os.listdir(dst / "data")[0]).write_bytes(b"PAR1")
    broken = _cli(tmp_path, str(dst), module="pipelines.validate")
    assert broken.returncode == 1 and "unreadable Parquet shard" in broken.stdout and "Traceback" not in broken.stderr


@pytest.fixture(scope="module")
def forty_episodes(tmp_path_factory) -> pathlib.Path:
    """40 episodes, 1,200 frames: more than a 300 kB disk holds. Read, never changed."""
    src = tmp_path_factory.mktemp("forty") / "src"
    write_lerobot(str(src), SyntheticLeRobot(lengths=(30,) * 40, codec="h264", gop=None, episodes_per_video_file=10))
    return src


@pytest.fixture
def small_disk(tmp_path):
    """A 300 kB tmpfs."""
    with small_tmpfs(tmp_path / "small", "300k") as mount:
        yield mount


@pytest.mark.parametrize("extra", [("--direct_num_workers=1",), TWO_WORKERS, ("--on_error=skip", "--max_skipped=100%")],
                         ids=["one-worker", "two-workers", "skip"])
def test_a_full_output_disk_names_the_output_not_the_source(tmp_path, small_disk, forty_episodes, extra):
    dst = small_disk / "out"
    done = _cli(tmp_path, f"--input={forty_episodes}", f"--output={dst}", "--progress=off", *extra)
    lines = _lines(done.stderr)
    assert done.returncode == 1 and len(lines) == 2, done.stderr
    assert lines[0] == (f"error: {dst}: cannot write the output: No space left on device; nothing was published "
                        "(the previous dataset, if any, is as it was)")
    assert os.listdir(small_disk) == []  # the staging is gone too


def test_a_read_only_output_is_one_line(tmp_path, small_lerobot, small_disk):
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    done = _cli(tmp_path, f"--input={small_lerobot}", f"--output={small_disk / 'out'}")
    assert done.returncode == 1
    assert _lines(done.stderr)[0] == (f"error: {small_disk / 'out'}: cannot write the output: Read-only file system; nothing was published "
                                      "(the previous dataset, if any, is as it was)")


def test_validate_deep_on_a_zeroed_video_is_a_finding_not_a_traceback(tmp_path, small_lerobot):
    dst = tmp_path / "out"
    assert _cli(tmp_path, f"--input={small_lerobot}", f"--output={dst}", "--progress=off").returncode == 0
    video = dst / "files/video_front/episode_000001.mp4"
    video.write_bytes(bytes(video.stat().st_size))
    done = _cli(tmp_path, str(dst), "--deep", module="pipelines.validate")
    assert done.returncode == 1 and "Traceback" not in done.stdout + done.stderr
    assert any(line.startswith(f"{video}: episode_000001") for line in _lines(done.stdout)), done.stdout
    assert _lines(done.stderr)[-1].endswith(f"{dst} is not a valid Mixtrain dataset")


def test_a_log_that_cannot_be_written_is_a_usage_error_or_falls_back(tmp_path, small_lerobot):
    done = _cli(tmp_path, f"--input={small_lerobot}", f"--output={tmp_path / 'out'}", f"--log_file={tmp_path}")
    assert (done.returncode, _lines(done.stderr)) == (2, [f"error: --log_file={tmp_path}: cannot write the log: Is a directory"])
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    env_home = {"XDG_CACHE_HOME": str(blocked)}  # an unwritable default location: the run goes on, logged elsewhere
    process = subprocess.run([sys.executable, "-m", "pipelines.convert", f"--input={small_lerobot}", f"--output={tmp_path / 'out'}",
                              "--progress=off"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                             env={**os.environ, **env_home, "TMPDIR": str(tmp_path / "tmpdir")})
    assert process.returncode == 0 and process.stderr == "", process.stderr


def test_an_unknown_output_protocol_is_a_usage_error(tmp_path, small_lerobot):
    done = _cli(tmp_path, f"--input={small_lerobot}", "--output=foo://bucket/out")
    assert (done.returncode, _lines(done.stderr)) == (2, ["error: --output=foo://bucket/out: Protocol not known: foo"])


def test_logs_are_kept_by_age_and_size_never_a_running_ones_nor_the_last_errors(tmp_path, monkeypatch):
    """25 recent logs stay (the count rule deleted all but 20, a running run's own included); logs
    past 14 days go, but the one a live run holds and the one the last error named."""
    from pipelines import session

    logs = tmp_path / "cache" / "mixtrain-convert" / "logs"
    logs.mkdir(parents=True)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    month_ago = time.time() - 30 * 86400
    for number in range(25):  # recent-00 the newest
        (logs / f"recent-{number:02d}.log").write_text("x")
        os.utime(logs / f"recent-{number:02d}.log", (time.time() - 10 * number,) * 2)
    for name in ("old.log", "held.log", "named.log"):
        (logs / name).write_text("x")
        os.utime(logs / name, (month_ago, month_ago))
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time; d = os.open(sys.argv[1], os.O_RDONLY); "
                               "fcntl.flock(d, fcntl.LOCK_SH); print('held', flush=True); time.sleep(60)", str(logs / "held.log")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        session.remember_failed_log(logs / "named.log")
        session._prune(logs)
        kept = sorted(path.name for path in logs.glob("*.log"))
        assert kept == sorted([f"recent-{number:02d}.log" for number in range(25)] + ["held.log", "named.log"])
        monkeypatch.setattr(session, "KEEP_BYTES", 10)  # past the size budget: the oldest go first, down to it
        session._prune(logs)
        assert sorted(path.name for path in logs.glob("*.log")) == ["held.log", "named.log"] + [f"recent-{n:02d}.log" for n in range(10)]
    finally:
        holder.kill()
        holder.wait()


def test_version_and_help_name_every_source_without_importing_beam(tmp_path):
    import formats

    done = subprocess.run([sys.executable, "-c", "import sys; from pipelines import convert; code = convert.run(['--version']); "
                           "print(code, 'apache_beam' in sys.modules)"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.stdout.splitlines() == [f"mixtrain-convert {formats.__version__}", "0 False"], done.stderr
    helped = subprocess.run([sys.executable, "-m", "pipelines.convert", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "Convert a LeRobot v3.0 or v2.x, RLDS (TFRecord or ArrayRecord), ORTF or L5Kit dataset" in helped.stdout
    assert "--version" in helped.stdout and "--fresh" in helped.stdout


@pytest.mark.parametrize("uri", ["http://127.0.0.1:{port}/internal", "s3://somebody/else", "gs://somebody/else", "hf://datasets/a/b"])
def test_validate_deep_never_fetches_a_source_a_received_dataset_names(tmp_path, small_lerobot, uri):
    """A dataset received from elsewhere is untrusted: its mixtrain.json's source.uri (an internal
    address, another store) is not fetched unless the user names it; one line says so."""
    import json
    import socket
    import threading

    dst = tmp_path / "out"
    assert _cli(tmp_path, f"--input={small_lerobot}", f"--output={dst}", "--progress=off").returncode == 0
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(5)
    listener.settimeout(0.2)
    accepted = []

    def accept():
        for _ in range(100):
            try:
                accepted.append(listener.accept())
            except OSError:
                pass

    watcher = threading.Thread(target=accept, daemon=True)
    watcher.start()
    named = uri.format(port=listener.getsockname()[1])
    sidecar = json.loads((dst / "mixtrain.json").read_text())
    sidecar["source"]["uri"] = named
    (dst / "mixtrain.json").write_text(json.dumps(sidecar))
    try:
        done = _cli(tmp_path, str(dst), "--deep", module="pipelines.validate")
    finally:
        listener.close()
        watcher.join(timeout=25)
    assert accepted == [] and "Traceback" not in done.stderr
    assert done.returncode == 0, done.stdout + done.stderr
    assert _lines(done.stdout)[0] == (f"source {named!r} (named by mixtrain.json) not fetched: pass --source=URI to compare with it; "
                                      "checked decoding and timing only")
