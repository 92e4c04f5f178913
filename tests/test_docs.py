"""Docs that run: every fenced code block of README.md and docs/*.md is executed (or parsed, for
JSON) against the sample `./run_local.sh` writes, so a page cannot drift from the product.

The only way to skip a block is a marker on the line before its fence, saying why:
`<!-- docs-test: not run: REASON -->` (needs Google Cloud, Docker, torch, ...) or
`<!-- docs-test: illustration: REASON -->` (a folder tree, a schema). Every other block must be
`bash`, `python` or `json`. Each page runs in its own folder holding a copy of `sample/` (and, for
the README, `run_local.sh`), with `python` the repository's virtualenv and the repository first on
PYTHONPATH; `~` is a home folder inside it with `~/data/my_lerobot_ds` (a copy of the sample).
A page's Python blocks share one namespace, in order (tests/docs_runner.py); gs:// blocks run
against the GCS emulator (gcp-storage-emulator) as `gs://bucket`, and a page with s3:// in a block
runs against moto's S3 server (tests/s3_server.py) as `s3://bucket`.

Blocks per page (run / marked), 2026-11-26:

| page | run | marked | why marked |
| --- | --- | --- | --- |
| README.md | 3 | 1 | `./run_local.sh test` is the whole suite, this test included (`./run_local.sh` runs in the worked example) |
| docs/architecture.md | 0 | 2 | illustrations (the package tree, the source contract) |
| docs/dask.md | 1 | 5 | installs packages, starts long-lived Dask services, needs SLURM or Kubernetes; a lost scheduler's line |
| docs/dataflow.md | 0 | 5 | Google Cloud: Dataflow, gcloud, Docker, Cloud Scheduler |
| docs/export.md | 2 | 3 | the folders an export writes (v3.0, v2.1); Google Cloud (Dataflow) |
| docs/format.md | 1 | 2 | the files tree, two lines of a _quality.jsonl; the mixtrain.json example is parsed and checked against the sample's |
| docs/lake.md | 9 | 1 | the table layout tree |
| docs/lance.md | 4 | 1 | the dataset layout tree |
| docs/output.md | 0 | 1 | the output tree |
| docs/quality.md | 2 | 0 | |
| docs/reading.md | 0 | 1 | needs torch (not a dependency) |
| docs/rlds.md | 1 | 1 | Google Cloud (a public bucket, Dataflow) |
| docs/storage.md | 2 | 2 | the variables naming a store of the reader's own; starting a local S3 server that stays up |
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

from tests import gcs_emulator, s3_server

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = ["README.md", *sorted(str(path.relative_to(ROOT)) for path in (ROOT / "docs").glob("*.md"))]
COUNTS = {  # page: (blocks run, blocks marked); pages without a code block are left out
    "README.md": (3, 1),
    "docs/architecture.md": (0, 2),
    "docs/dask.md": (1, 5),
    "docs/dataflow.md": (0, 5),
    "docs/export.md": (2, 3),
    "docs/format.md": (1, 2),
    "docs/lake.md": (9, 1),
    "docs/lance.md": (4, 1),
    "docs/output.md": (0, 1),
    "docs/quality.md": (2, 0),
    "docs/reading.md": (0, 1),
    "docs/rlds.md": (1, 1),
    "docs/storage.md": (2, 2),
}
MARKER = re.compile(r"^\s*<!-- docs-test: (not run|illustration): (?P<reason>.+?) -->\s*$")
OPEN = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w-]*)\s*$")
RUNNABLE = {"bash", "python", "json"}


@dataclasses.dataclass
class Block:
    file: str
    line: int  # the opening fence's line, 1-based
    lang: str
    code: str
    marker: str | None  # the reason a marked block is not run


def blocks(page: str) -> list[Block]:
    """Every fenced block of a page, with the marker on the line before its fence."""
    lines = (ROOT / page).read_text().splitlines()
    found, index = [], 0
    while index < len(lines):
        opening = OPEN.match(lines[index])
        if not opening:
            index += 1
            continue
        end = next(i for i in range(index + 1, len(lines)) if lines[i].strip() == "```")
        marker = MARKER.match(lines[index - 1]) if index else None
        found.append(Block(page, index + 1, opening["lang"], textwrap.dedent("\n".join(lines[index + 1:end])) + "\n",
                           marker and f"{marker[1]}: {marker['reason']}"))
        index = end + 1
    return found


# What blocks print, where it is stable: page -> {block index in the page: [regular expressions]}.
EXPECTED = {
    "README.md": {
        1: [r"converted 12 sequences, 477 timesteps, [\d.]+ MB in [\d.]+ s -> /\S+/home/data/my_mixtrain\n",  # ~ expanded
            r"ok: /\S+/home/data/my_mixtrain is a valid Mixtrain dataset\n", r"\nreport: /\S+/page/report\.html \("],
        2: [r"^<Mixtrain dataset file://\S+/sample/mixtrain: 12 sequences, 1 shard>\n"
            r"\['obs_state', 'action'\] \['video_front', 'video_wrist'\]\n"
            r"\(37, 6\) float32 Open the drawer\. files/video_front/episode_000001\.mp4\n"
            r"\d+ windows per epoch\n$"],
        3: [r"converted 12 sequences, 477 timesteps", r"\n12 \['sequence_id', .*'obs_state'.*\]\n"
            r"episode_000000 \d+ \d+ 6 files/video_front/episode_000000\.mp4\n\{.*'type': 'video'.*\}\n$"],
    },
    "docs/lake.md": {
        0: [r"12 unchanged sequences reused", r"\(pyiceberg: SqlCatalog\('mixtrain', uri='sqlite:///\S+/sample/lake/catalog\.db'\)"],
        1: [r"^12 2\n$"],
        3: [r"^12 3 True\n(\d+ \d+ \d{8}T\d{6}-\w+\n){2}12 12\n$"],
        4: [r"^\(12, 2\)\n\(2, \d+\)\n\(12,\)\n\(12,\)\n$"],
        5: [r"converted 12 sequences.*Delta table"],
        6: [r"^12\n0 WRITE \d{8}T\d{6}-\w+\n12 12 12\n$"],
        7: [r"'current': False\}\n.*'current': True\}\n\[True, False\]\n$"],
        9: [r"converted 12 sequences.*-> gs://bucket/lake: Iceberg table default\.dataset"],
    },
    "docs/rlds.md": {
        0: [r"^wrote an rlds sample with 12 episodes \(\d+ steps, array_record shards; convert it with --fps\) to sample/rlds_ar\n"
            r"\[mixtrain-convert\] rlds: 12 sequences -> sample/rlds_ar_mixtrain \(1 shard\)\n"
            r"converted 12 sequences, \d+ timesteps.*-> sample/rlds_ar_mixtrain\n$"],
    },
    "docs/storage.md": {
        2: [r"converted 12 sequences.*-> s3://bucket/mixtrain/so100\n", r"ok: s3://bucket/mixtrain/so100 is a valid Mixtrain dataset",
            r"-> s3://bucket/lake/so100: Delta table, version 0 \(deltalake: DeltaTable\('s3://bucket/lake/so100', "
            r"storage_options=\{'aws_endpoint': 'http://127\.0\.0\.1:\d+', 'aws_allow_http': 'true', 'aws_region': 'us-east-1'\}\)\)"],
        3: [r"^12 s3://bucket/mixtrain/so100/files/video_front/episode_000000\.mp4\n$"],
    },
    "docs/quality.md": {
        0: [r"converted 12 sequences, 477 timesteps.*-> sample/quality\n",
            r"\nquality     0 error\(s\), 6 warning\(s\), recorded by the conversion\n  short          warning  6 finding\(s\)\n"
            r"    episode_000000 steps 0-29: 30 steps, fewer than 40\n",
            r"ok: sample/quality is a valid Mixtrain dataset\n", r"validate exited 1\n$"],
        1: [r"^6 short episode_000000 \[0, 29\]\n11\n$"],
    },
    "docs/export.md": {  # block 1: the Dataflow command (not run)
        0: [r"^exported 12 episodes, 477 frames, 2 cameras as lerobot_v3 in [\d.]+ s -> sample/lerobot_export\n",
            r"converted 12 sequences, 477 timesteps, .* -> sample/roundtrip\n$"],
        2: [r"^v3\.0 12 477 True\nTrue\nTrue\n$"],
    },
    "docs/dask.md": {
        1: [r"converted 12 sequences.*-> sample/dask\n\[True, True, True\]\n$"],
    },
    "docs/lance.md": {
        1: [r"^\(\d+, 6\) b'ftyp'\n$"],
        2: [r"converted 12 sequences.*-> sample/lance"],
        4: [r"^12 \[1, 2\]\n$"],
    },
}


def test_every_page_with_code_is_counted():
    """A new page with code blocks, or a block added or marked, changes this table (and the docstring's)."""
    counted = {}
    for page in PAGES:
        found = blocks(page)
        if found:
            counted[page] = (sum(b.marker is None for b in found), sum(b.marker is not None for b in found))
    for page, (run, marked) in counted.items():
        reasons = "; ".join(f"{b.line}: {b.marker}" for b in blocks(page) if b.marker)
        print(f"{page}: {run} run, {marked} marked{' (' + reasons + ')' if reasons else ''}")
    assert counted == COUNTS


@pytest.mark.parametrize("page", PAGES)
def test_every_unmarked_block_is_bash_python_or_json(page):
    for block in blocks(page):
        assert block.marker is not None or block.lang in RUNNABLE, (
            f"{page}:{block.line}: a ```{block.lang} block: make it bash, python or json, or mark it "
            "<!-- docs-test: illustration: WHY --> / <!-- docs-test: not run: WHY --> on the line before")


def test_json_blocks_parse():
    for page in PAGES:
        for block in blocks(page):
            if block.marker is None and block.lang == "json":
                assert isinstance(json.loads(block.code), dict), f"{page}:{block.line}"


def test_the_mixtrain_json_example_has_the_keys_of_a_real_one(sample):
    """docs/format.md's mixtrain.json example names no key the sample's mixtrain.json lacks."""
    (example,) = [json.loads(b.code) for b in blocks("docs/format.md") if b.lang == "json"]
    real = json.loads((sample / "sample" / "mixtrain" / "mixtrain.json").read_text())
    assert set(example) <= set(real) and set(example["converter"]) <= set(real["converter"])
    assert example["mixtrain"] == real["mixtrain"] and example["source"]["format"] == real["source"]["format"]


@pytest.fixture(scope="session")
def sample(tmp_path_factory) -> pathlib.Path:
    """A folder where `./run_local.sh` (the repository's, with this virtualenv behind a shim so that
    it installs nothing) wrote sample/lerobot_v3, sample/mixtrain and sample/report.html."""
    base = tmp_path_factory.mktemp("docs")
    for name in ("run_local.sh", "setup.py", "BEAM_VERSION"):
        (base / name).symlink_to(ROOT / name)
    shim = base / "venv"
    (shim / "bin").mkdir(parents=True)
    (shim / "bin" / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (shim / "bin" / "python").chmod(0o755)
    stamp = hashlib.sha1((ROOT / "setup.py").read_bytes() + (ROOT / "BEAM_VERSION").read_bytes()).hexdigest()[:12]
    (shim / f".installed-{stamp}").touch()
    done = subprocess.run(["bash", "./run_local.sh"], cwd=base, env=_env(base, base), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return base


def _env(base: pathlib.Path, cwd: pathlib.Path) -> dict:
    return {**os.environ, "PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT),
            "MIXTRAIN_VENV": str(base / "venv"), "HOME": str(cwd / "home"), "SVT_LOG": "1"}


@pytest.fixture
def emulator_env(request):
    """The GCS emulator on a free loopback port, with a bucket `bucket` (as tests/pipelines/test_gcs.py);
    for a page naming s3:// in a block run, moto's S3 server too (as tests/pipelines/test_s3.py)."""
    page = request.node.callspec.params["page"]
    with contextlib.ExitStack() as stores:
        url = stores.enter_context(gcs_emulator.running())
        env = {"STORAGE_EMULATOR_HOST": url, "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
               "PYICEBERG_CATALOG__LAKE__GCS__OAUTH2__TOKEN": "anon"}
        if any(b.marker is None and "s3://" in b.code for b in blocks(page)):
            env |= s3_server.environment(stores.enter_context(s3_server.running()))
        yield env


@pytest.mark.parametrize("page", [page for page in COUNTS if any(b.marker is None and b.lang != "json" for b in blocks(page))])
def test_the_code_blocks_of_a_page_run(page, sample, emulator_env, tmp_path):
    cwd = tmp_path / "page"
    shutil.copytree(sample, cwd, symlinks=True, ignore=shutil.ignore_patterns("venv"))
    shutil.copytree(sample / "sample" / "lerobot_v3", cwd / "home" / "data" / "my_lerobot_ds")
    found = blocks(page)
    runnable = [b for b in found if b.marker is None and b.lang in ("bash", "python")]
    (tmp_path / "blocks.json").write_text(json.dumps([dataclasses.asdict(b) for b in runnable]))
    started = time.monotonic()
    subprocess.run([sys.executable, str(ROOT / "tests" / "docs_runner.py"), str(tmp_path / "blocks.json"), str(tmp_path / "results.json")],
                   cwd=cwd, env={**_env(sample, cwd), **emulator_env}, check=True, timeout=600)
    results = json.loads((tmp_path / "results.json").read_text())
    print(f"{page}: {len(results)} blocks in {time.monotonic() - started:.1f} s")
    for block, result in zip(runnable, results):
        assert result["ok"], f"{page}:{block.line} ({block.lang}) failed:\n{result['out']}\n{result['err']}"
        assert "Traceback" not in result["err"], f"{page}:{block.line}:\n{result['err']}"
    assert len(results) == len(runnable)
    for index, patterns in EXPECTED.get(page, {}).items():
        result = results[runnable.index(found[index])]
        for pattern in patterns:
            assert re.search(pattern, result["out"], re.S), f"{page}:{found[index].line}: {pattern!r} not in:\n{result['out']}"
