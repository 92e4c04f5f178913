"""Every documented command runs after the plain install the README shows (`pip install .`, no
extras): here the packages only an extra brings are made unimportable in every process of the run
(a sitecustomize on PYTHONPATH reaches Beam's worker processes too), and the commands run as
documented. `make_sample` imported pandas (the test extra's) for every format."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Import names of the packages that only extras of setup.py install (test, lake, lance, s3, dask, hub, torch).
EXTRAS_ONLY = ("pandas", "polars", "pyiceberg", "deltalake", "lance", "s3fs", "moto", "dask", "distributed", "duckdb", "torch",
               "huggingface_hub", "pytest", "gcp_storage_emulator", "atheris")

BLOCKER = f"""
import sys

class _ExtrasOnly:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {EXTRAS_ONLY!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (an extra's package: blocked by the plain-install test)", name=name)
        return None

sys.meta_path.insert(0, _ExtrasOnly())
"""


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    folder = tmp_path_factory.mktemp("plain")
    (folder / "sitecustomize.py").write_text(BLOCKER)
    env = {**os.environ, "PYTHONPATH": f"{folder}{os.pathsep}{ROOT}"}

    def run(*args: str, cwd=folder) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{args}\n{done.stdout[-1500:]}\n{done.stderr[-3000:]}"
        return done

    blocked = subprocess.run([sys.executable, "-c", "import pandas"], cwd=folder, env=env, capture_output=True, text=True)
    assert "blocked by the plain-install test" in blocked.stderr  # the blocker works
    return run, folder


@pytest.mark.parametrize("format_", ["lerobot_v3", "lerobot_v2", "ortf", "l5kit", "rlds"])
def test_make_sample_writes_every_format_without_the_extras(plain, format_):
    run, folder = plain
    assert run("-m", "pipelines.make_sample", str(folder / format_), f"--format={format_}").stdout.startswith("wrote ")


def test_the_main_job_runs_without_the_extras(plain):
    """What ./run_local.sh runs: a sample, converted with 2 workers, validated, inspected with its report."""
    run, folder = plain
    run("-m", "pipelines.make_sample", str(folder / "job" / "lerobot_v3"))
    done = run("-m", "pipelines.convert", f"--input={folder / 'job' / 'lerobot_v3'}", f"--output={folder / 'job' / 'mixtrain'}",
               "--direct_num_workers=2", "--direct_running_mode=multi_processing", "--progress=off")
    assert "converted 12 sequences" in done.stdout
    run("-m", "pipelines.validate", str(folder / "job" / "mixtrain"))
    assert "report: " in run("-m", "pipelines.inspect", str(folder / "job" / "mixtrain"), "--html", str(folder / "job" / "r.html")).stdout
