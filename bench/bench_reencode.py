"""Re-encode throughput: the pipeline against a bare PyAV loop on the same data, in the same run.

    python bench/bench_reencode.py [--episodes=24] [--frames=150] [--width=320] [--height=240] [--repeat=2]

Workload: a synthetic LeRobot v3 dataset as lerobot writes it (AV1, keyframe every 2 frames,
two cameras, episodes concatenated per file). Both sides decode every episode's segment and
encode it to H.264 with the same settings (the pipeline's defaults), one process, one worker:

  bare loop  seek, decode [from, to), encode with libx264, write the MP4: nothing else;
  pipeline   `python -m pipelines.convert --video=reencode` with the in-process runner and one
             worker: planning, Beam, the video step, Parquet rows, stats, publish.

Each side runs in its own subprocess (best of --repeat); the table reports wall time, CPU time
(user + system of the subprocess and its threads) and frames/s, and the ratio pipeline / bare
per frame of CPU time. Target: <= 1.15.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BARE_LOOP = r"""
import io, json, sys, time
from fractions import Fraction
import av
from formats.sources import lerobot_v3
from formats.video import policy
from formats import storage

src, dst = sys.argv[1], sys.argv[2]
options = policy.EncodeOptions().resolved()
fs, root = storage.open_root(src)
meta, refs = lerobot_v3.plan(fs, root)
time_base = Fraction(1, int(meta.fps))
frames = 0
for ref in refs:
    for column, segment in ref.videos:
        container = av.open(storage.join(root, segment.path))
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        half = 0.5 / meta.fps
        low = int(round((segment.start - half) / stream.time_base))
        high = int(round((segment.end - half) / stream.time_base))
        if low > 0:
            container.seek(low, stream=stream, backward=True)
        out = av.open(f"{dst}/{column}_{ref.sequence_id}.mp4", "w", format="mp4")
        encoder = out.add_stream("libx264", rate=int(meta.fps))
        encoder.width, encoder.height, encoder.pix_fmt = stream.codec_context.width, stream.codec_context.height, "yuv420p"
        encoder.options = {"crf": str(options.crf), "g": str(options.gop), "preset": options.preset, "x264-params": "mbtree=0"}
        count = 0
        for frame in container.decode(stream):
            if frame.pts >= high:
                break
            if frame.pts < low:
                continue
            # pts i in a 1/fps time base: without the time base x264's rate control sees the
            # source's 1/15360 ticks, misjudges frame durations and writes a different file.
            frame.pts, frame.time_base, frame.pict_type = count, time_base, av.video.frame.PictureType.NONE
            for packet in encoder.encode(frame):
                out.mux(packet)
            count += 1
        for packet in encoder.encode(None):
            out.mux(packet)
        out.close()
        container.close()
        assert count == segment.frames, (ref.sequence_id, column, count)
        frames += count
print(json.dumps({"frames": frames}))
"""


def _run(command: list[str], env: dict) -> tuple[float, float, str]:
    """Wall seconds, CPU seconds (children: user + system) and stdout of one subprocess."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"benchmark step failed: {' '.join(command)}\n{done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=24)
    parser.add_argument("--frames", type=int, default=150)
    parser.add_argument("--width", type=int, default=320)
    parser.add_argument("--height", type=int, default=240)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1, choices=(1, 2), help="the pipeline's workers (2: multi_processing)")
    args = parser.parse_args()

    from formats.sources.lerobot_v3.sample import SyntheticLeRobot, write_dataset

    env = dict(os.environ, PYTHONPATH=str(ROOT), SVT_LOG="1")
    work = pathlib.Path(tempfile.mkdtemp(prefix="bench_reencode_"))
    try:
        source = work / "source"
        print(f"writing {args.episodes} episodes x {args.frames} frames x 2 cameras at {args.width}x{args.height} (AV1) ...", file=sys.stderr)
        write_dataset(str(source), SyntheticLeRobot(lengths=[args.frames] * args.episodes, width=args.width, height=args.height,
                                                    episodes_per_video_file=8, episodes_per_data_file=8))
        frames = 2 * args.episodes * args.frames
        results = {"bare loop": [], "pipeline": []}
        for attempt in range(args.repeat):
            bare_out = work / f"bare_{attempt}"
            bare_out.mkdir()
            wall, cpu, out = _run([sys.executable, "-c", BARE_LOOP, str(source), str(bare_out)], env)
            assert json.loads(out)["frames"] == frames
            results["bare loop"].append((wall, cpu))
            wall, cpu, _ = _run([sys.executable, "-m", "pipelines.convert", f"--input={source}", f"--output={work / f'pipe_{attempt}'}",
                                 "--video=reencode", "--runner=DirectRunner", f"--direct_num_workers={args.workers}",
                                 f"--direct_running_mode={'in_memory' if args.workers == 1 else 'multi_processing'}",
                                 "--progress=off"], env)
            results["pipeline"].append((wall, cpu))
        best = {name: min(runs, key=lambda r: r[1]) for name, runs in results.items()}
        print(f"\nre-encode AV1 -> H.264 (crf/gop/preset defaults), {frames} frames, pipeline with {args.workers} worker(s), "
              f"best of {args.repeat}")
        print(f"{'':<10} {'wall s':>8} {'CPU s':>8} {'frames/s (wall)':>16} {'CPU ms/frame':>13}")
        for name, (wall, cpu) in best.items():
            print(f"{name:<10} {wall:8.2f} {cpu:8.2f} {frames / wall:16.1f} {1000 * cpu / frames:13.3f}")
        cpu_ratio = best["pipeline"][1] / best["bare loop"][1]
        wall_ratio = best["pipeline"][0] / best["bare loop"][0]
        print(f"ratio pipeline / bare loop: CPU per frame {cpu_ratio:.3f} (target <= 1.15), wall {wall_ratio:.3f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
