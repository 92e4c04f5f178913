"""Planning and job-graph size on the launcher, against the episode count (issue 20).

    python bench/bench_plan.py [--episodes=100000,400000,1000000] [--baseline=/work/main] [--dataflow]
    python bench/bench_plan.py --launcher [--episodes=20000,100000] [--baseline=/work/main] [--repeats=3]

Workload: a LeRobot v3 dataset of metadata only (meta/info.json, meta/episodes/*.parquet of
50,000 episodes each, meta/tasks.parquet) with one camera, 100 frames per episode and 1,000
episodes per data file; the data files are empty Parquet files with the right schema (planning
reads only the episode index and the data files' footers) and there are no video files.

Each measurement runs in its own subprocess: `make_plan` + `build_pipeline` (local runner, the
pipeline is built, not run), the pipeline proto's size (`to_runner_api().SerializeToString()`),
wall time and peak RSS (ru_maxrss of the child). With --baseline the same is measured with the code
of another checkout in the same run, and the ratios printed. With --dataflow the DataflowRunner
dry run (offline: --dry_run --no_auth --sdk_location=container) is timed too.
Targets: planning 1,000,000 episodes under 60 s and 2 GB; the graph under 2 MB and flat in N.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = pathlib.Path(__file__).resolve().parents[1]
EPISODES_PER_INDEX_FILE = 50_000
EPISODES_PER_DATA_FILE = 1_000
FRAMES = 100
FPS = 30
CAMERA = "observation.images.front"

MEASURE = r"""
import json, resource, sys, time
started = time.perf_counter()
import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from pipelines import conversion
src, out, dataflow = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
argv = [f"--input={src}", f"--output={out}"]
if dataflow:
    argv += ["--runner=DataflowRunner", "--project=my-project-123", "--region=us-central1", "--temp_location=gs://bucket/tmp",
             "--dry_run=True", "--no_auth", "--sdk_location=container"]
options = PipelineOptions(argv)
imported = time.perf_counter()
pipeline = beam.Pipeline(options=options)
plan = conversion.build_pipeline(pipeline, options.view_as(conversion.ConvertOptions), "bench", write_assets=dataflow is False)
built = time.perf_counter()
size = len(pipeline.to_runner_api().SerializeToString())
if dataflow:
    pipeline.run()
done = time.perf_counter()
print(json.dumps({"refs": len(plan.refs), "graph_bytes": size, "import_s": imported - started, "plan_build_s": built - imported,
                  "total_s": done - started, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


# The launcher as a user runs it (`python -m pipelines.convert`, local runner) from process start
# until it hands the built pipeline to the runner: imports, the plan (early, in a forked planner,
# where the code has one: pipelines/early_plan.py), the plan files and the graph. It leaves there.
LAUNCHER = r"""
import importlib.abc, importlib.machinery, json, os, resource, sys, time
started = time.perf_counter()

class _Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "pipelines.conversion":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        load = spec.loader.exec_module
        def exec_module(module):
            load(module)
            def stop(self, *args, **kwargs):
                ready = time.perf_counter() - started
                children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
                print(json.dumps({"ready_s": ready, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                                  "children_rss_mb": children}), file=sys.__stdout__, flush=True)
                os._exit(0)
            module.beam.Pipeline.run = stop
        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, _Hook())
sys.argv = ["pipelines.convert", f"--input={sys.argv[1]}", f"--output={sys.argv[2]}", "--progress=off", "--direct_num_workers=1"]
from pipelines import convert
convert.main()
"""


def write_metadata_dataset(root: pathlib.Path, episodes: int) -> None:
    """A LeRobot v3 dataset whose data files hold no rows and whose videos do not exist."""
    (root / "meta/episodes/chunk-000").mkdir(parents=True)
    features = {
        "observation.state": {"dtype": "float32", "shape": [6], "names": [f"s{i}" for i in range(6)]},
        "action": {"dtype": "float32", "shape": [6], "names": [f"a{i}" for i in range(6)]},
        CAMERA: {"dtype": "video", "shape": [48, 64, 3], "names": ["height", "width", "channels"],
                 "info": {"video.fps": FPS, "video.codec": "av1", "video.pix_fmt": "yuv420p", "video.height": 48, "video.width": 64,
                          "video.channels": 3, "has_audio": False}},
        **{name: {"dtype": dtype, "shape": [1], "names": None}
           for name, dtype in (("timestamp", "float32"), ("frame_index", "int64"), ("episode_index", "int64"), ("index", "int64"),
                               ("task_index", "int64"))},
    }
    info = {"codebase_version": "v3.0", "robot_type": "bench", "total_episodes": episodes, "total_frames": episodes * FRAMES,
            "total_tasks": 1, "chunks_size": 1000, "data_files_size_in_mb": 100, "video_files_size_in_mb": 500, "fps": FPS,
            "splits": {"train": f"0:{episodes}"}, "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
            "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4", "features": features}
    (root / "meta/info.json").write_text(json.dumps(info, indent=2))
    pq.write_table(pa.table({"task_index": pa.array([0], pa.int64()), "__index_level_0__": ["do the thing"]}), root / "meta/tasks.parquet")
    vector = pa.list_(pa.float32(), 6)
    empty = pa.schema([("observation.state", vector), ("action", vector), ("timestamp", pa.float32()), ("frame_index", pa.int64()),
                       ("episode_index", pa.int64()), ("index", pa.int64()), ("task_index", pa.int64())]).empty_table()
    for number in range((episodes + EPISODES_PER_DATA_FILE - 1) // EPISODES_PER_DATA_FILE):
        chunk, file = divmod(number, 1000)
        path = root / f"data/chunk-{chunk:03d}/file-{file:03d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(empty, path)
    for start in range(0, episodes, EPISODES_PER_INDEX_FILE):
        index = pa.array(range(start, min(episodes, start + EPISODES_PER_INDEX_FILE)), pa.int64())
        number = pa.compute.divide(index, EPISODES_PER_DATA_FILE)
        within = pa.compute.subtract(index, pa.compute.multiply(number, EPISODES_PER_DATA_FILE))
        from_ts = pa.compute.multiply(pa.compute.cast(within, pa.float64()), FRAMES / FPS)
        table = pa.table({
            "episode_index": index,
            "tasks": pa.array([["do the thing"]] * len(index)),
            "length": pa.array([FRAMES] * len(index), pa.int64()),
            "data/chunk_index": pa.compute.divide(number, 1000), "data/file_index": pa.compute.subtract(number, pa.compute.multiply(
                pa.compute.divide(number, 1000), 1000)),
            "dataset_from_index": pa.compute.multiply(index, FRAMES), "dataset_to_index": pa.compute.multiply(pa.compute.add(index, 1), FRAMES),
            f"videos/{CAMERA}/chunk_index": pa.compute.divide(number, 1000),
            f"videos/{CAMERA}/file_index": pa.compute.subtract(number, pa.compute.multiply(pa.compute.divide(number, 1000), 1000)),
            f"videos/{CAMERA}/from_timestamp": from_ts, f"videos/{CAMERA}/to_timestamp": pa.compute.add(from_ts, FRAMES / FPS),
            "meta/episodes/chunk_index": pa.array([0] * len(index), pa.int64()),
            "meta/episodes/file_index": pa.array([start // EPISODES_PER_INDEX_FILE] * len(index), pa.int64()),
        })
        pq.write_table(table, root / f"meta/episodes/chunk-000/file-{start // EPISODES_PER_INDEX_FILE:03d}.parquet")


def measure(code: pathlib.Path, src: pathlib.Path, out: pathlib.Path, dataflow: bool) -> dict:
    env = dict(os.environ, PYTHONPATH=str(code))
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(out.parent / f".{out.name}.mixtrain-bench", ignore_errors=True)  # the run's staging beside a local output
    done = subprocess.run([sys.executable, "-c", MEASURE, str(src), str(out), "1" if dataflow else "0"], cwd=code, env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_launcher(code: pathlib.Path, src: pathlib.Path, out: pathlib.Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(code))
    shutil.rmtree(out, ignore_errors=True)
    done = subprocess.run([sys.executable, "-c", LAUNCHER, str(src), str(out)], cwd=code, env=env, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]}
    return json.loads(lines[-1])


def launcher_rows(codes, work: pathlib.Path, counts: list[int], repeats: int) -> None:
    """--launcher: process start -> the pipeline handed to the runner, best of `repeats`, this code
    and the baseline alternately."""
    print(f"{'episodes':>9} {'code':>8} {'ready s':>8} {'launcher RSS MB':>15} {'+ children MB':>13}")
    for episodes in counts:
        src = work / f"lerobot_{episodes}"
        write_metadata_dataset(src, episodes)
        best: dict[str, dict] = {}
        for _ in range(repeats):
            for name, code in codes:
                result = measure_launcher(code, src, work / "out")
                if "error" in result:
                    print(f"{episodes:>9} {name:>8} failed: {result['error']}")
                    continue
                if name not in best or result["ready_s"] < best[name]["ready_s"]:
                    best[name] = result
        for name, result in best.items():
            print(f"{episodes:>9} {name:>8} {result['ready_s']:>8.2f} {result['rss_mb']:>15.0f} {result['children_rss_mb']:>13.0f}")
        if "this" in best and "baseline" in best:
            print(f"{episodes:>9} {'ratio':>8} {best['this']['ready_s'] / best['baseline']['ready_s']:>8.2f}", flush=True)
        shutil.rmtree(src, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", default="100000,400000,1000000")
    parser.add_argument("--baseline", default="", help="another checkout (e.g. /work/main) measured in the same run")
    parser.add_argument("--dataflow", action="store_true", help="also time the DataflowRunner dry run (offline)")
    parser.add_argument("--launcher", action="store_true",
                        help="time `python -m pipelines.convert` from process start to the built pipeline instead")
    parser.add_argument("--repeats", type=int, default=3, help="with --launcher: runs per code, the best kept")
    args = parser.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="bench_plan_"))
    codes = [("this", ROOT)] + ([("baseline", pathlib.Path(args.baseline))] if args.baseline else [])
    try:
        if args.launcher:
            launcher_rows(codes, work, [int(n) for n in args.episodes.split(",")], args.repeats)
            return
        print(f"{'episodes':>9} {'code':>8} {'runner':>8} {'graph MB':>9} {'plan+build s':>12} {'total s':>8} {'peak RSS MB':>11}")
        for episodes in (int(n) for n in args.episodes.split(",")):
            src = work / f"lerobot_{episodes}"
            write_metadata_dataset(src, episodes)
            results = {}
            for runner in ("local", "dataflow") if args.dataflow else ("local",):
                for name, code in codes:
                    result = results[name, runner] = measure(code, src, work / "out", runner == "dataflow")
                    if "error" in result:
                        print(f"{episodes:>9} {name:>8} {runner:>8} failed: {result['error']}")
                        continue
                    print(f"{episodes:>9} {name:>8} {runner:>8} {result['graph_bytes'] / 1e6:>9.3f} {result['plan_build_s']:>12.1f} "
                          f"{result['total_s']:>8.1f} {result['rss_mb']:>11.0f}", flush=True)
                this, base = results.get(("this", runner), {}), results.get(("baseline", runner), {})
                if "total_s" in this and "total_s" in base:
                    print(f"{episodes:>9} {'ratio':>8} {runner:>8} {this['graph_bytes'] / base['graph_bytes']:>9.3f} "
                          f"{this['plan_build_s'] / base['plan_build_s']:>12.2f} {this['total_s'] / base['total_s']:>8.2f} "
                          f"{this['rss_mb'] / base['rss_mb']:>11.2f}", flush=True)
            shutil.rmtree(src, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
