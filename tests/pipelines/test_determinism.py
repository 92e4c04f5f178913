"""Same input, same options, two processes with different hash seeds: the same bytes, for every source.

Set and dict-of-protobuf-map iteration order depends on PYTHONHASHSEED, so only separate
processes show it (one process converting twice sees the same order both times).
"""

import json
import os
import pathlib
import subprocess
import sys

from formats.sources.l5kit.sample import SyntheticL5Kit
from formats.sources.l5kit.sample import write_dataset as write_l5kit
from formats.sources.lerobot_v3.sample import SyntheticLeRobot
from formats.sources.lerobot_v3.sample import write_dataset as write_lerobot
from formats.sources.ortf.sample import SyntheticORTF
from formats.sources.ortf.sample import write_dataset as write_ortf
from formats.sources.rlds.sample import SyntheticRLDS
from formats.sources.rlds.sample import write_dataset as write_rlds

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCES = {
    "lerobot_v3": (lambda p: write_lerobot(str(p), SyntheticLeRobot(lengths=(6, 5, 7), codec="h264", gop=None, episodes_per_video_file=2)), []),
    "rlds": (lambda p: write_rlds(str(p), SyntheticRLDS(splits={"train": (4, 5), "val": (3,)}, shards={"train": 2, "val": 1})), ["--fps=10"]),
    "ortf": (lambda p: write_ortf(str(p), SyntheticORTF(lengths=(5, 4), audio=False)), []),
    "l5kit": (lambda p: write_l5kit(str(p), SyntheticL5Kit(scene_lengths=(6, 5))), []),
}
# One process converts every source: Beam's start-up is paid once per hash seed.
CONVERT_ALL = """
import json, sys
from pipelines import convert
jobs = json.loads(sys.argv[1])
sys.exit(max(convert.run([f"--input={src}", f"--output={dst}", "--progress=off", "--num_shards=2", *extra]) for src, dst, extra in jobs))
"""


def _published(dst: pathlib.Path) -> dict:
    return {p.relative_to(dst).as_posix(): p.read_bytes() for p in sorted(dst.rglob("*")) if p.is_file()}


def test_outputs_do_not_depend_on_the_hash_seed(tmp_path):
    outputs = {}
    for seed in ("0", "4242"):
        jobs = []
        for name, (write, extra) in SOURCES.items():
            src = tmp_path / "src" / name / "1.0.0"
            if not src.exists():
                write(src)
            jobs.append((str(src), str(tmp_path / seed / name), extra))
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run([sys.executable, "-c", CONVERT_ALL, json.dumps(jobs)], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        outputs[seed] = {name: _published(tmp_path / seed / name) for name in SOURCES}
    for name in SOURCES:
        first, second = outputs["0"][name], outputs["4242"][name]
        assert first.keys() == second.keys(), name
        assert any(path.startswith("files/") for path in first) or name == "l5kit", name  # videos are compared too
        sidecars = [json.loads(files.pop("mixtrain.json")) for files in (first, second)]
        for sidecar in sidecars:
            sidecar.pop("created_at")
        assert sidecars[0] == sidecars[1], name
        assert [path for path in first if first[path] != second[path]] == [], name  # shards, stats.json, videos, _fingerprints.json


def test_outputs_do_not_depend_on_the_worker_count(tmp_path):
    """The batches are dealt to the local runner's workers (transforms/read.py `_dealt`): how the
    refs are cut depends on the worker count, the published bytes must not (every source; 3
    workers as threads, in this process, against 1). Videos are re-encoded: the encoders' bytes
    must not follow the workers either."""
    from pipelines import convert

    for name, (write, extra) in SOURCES.items():
        src = tmp_path / "src" / name / "1.0.0"
        write(src)
        outputs = {}
        for workers in ("1", "3"):
            dst = tmp_path / workers / name
            parallel = ["--direct_num_workers=3", "--direct_running_mode=multi_threading"] if workers == "3" else []
            video = ["--video=reencode"] if name in ("lerobot_v3", "rlds") else []
            assert convert.run([f"--input={src}", f"--output={dst}", "--progress=off", "--num_shards=2", *extra, *video,
                                *parallel]) == convert.EXIT_OK, name
            outputs[workers] = _published(dst)
        one, three = outputs["1"], outputs["3"]
        assert one.keys() == three.keys() and len(one) > 4, name
        sidecars = [json.loads(files.pop("mixtrain.json")) for files in (one, three)]
        for sidecar in sidecars:
            sidecar.pop("created_at")
        assert sidecars[0] == sidecars[1], name
        assert [path for path in one if one[path] != three[path]] == [], name
