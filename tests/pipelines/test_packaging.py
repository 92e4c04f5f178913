"""Worker packaging as Dataflow does it: the sdist of setup.py, installed into a fresh virtualenv,
running a two-process conversion from outside the checkout, so every DoFn is pickled and imported
again in another process from the installed package only."""

import os
import pathlib
import subprocess
import sys
import sysconfig
import venv

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _run(command, cwd, timeout=600):
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME")}
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{command}\n{done.stdout[-1500:]}\n{done.stderr[-3000:]}"
    return done


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX virtualenv layout")
def test_sdist_installed_in_a_fresh_virtualenv_converts_with_two_worker_processes(tmp_path):
    dist = tmp_path / "dist"
    _run([sys.executable, "setup.py", "-q", "sdist", "--dist-dir", str(dist)], cwd=ROOT)
    sdist = next(dist.glob("mixtrain-convert-*.tar.gz"))
    env_dir = tmp_path / "worker_env"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    # The third-party dependencies come from this interpreter's site-packages (as a Dataflow SDK
    # container brings Beam); the project itself only from the sdist. A path in a .pth file does
    # not run that folder's own .pth files, so this checkout's editable install stays invisible.
    site = pathlib.Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp_path).stdout.strip())
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--ignore-installed", str(sdist)], cwd=tmp_path)
    work = tmp_path / "elsewhere"
    work.mkdir()
    where = _run([str(python), "-c", "import formats, transforms, pipelines; print(formats.__file__, transforms.__file__)"], cwd=work).stdout
    assert str(ROOT) not in where and str(env_dir) in where
    _run([str(python), "-m", "pipelines.make_sample", "ds", "--episodes=6"], cwd=work)
    done = _run([str(python), "-m", "pipelines.convert", "--input=ds", "--output=out", "--video=reencode", "--video_stats",
                 "--direct_num_workers=2", "--direct_running_mode=multi_processing", "--progress=off"], cwd=work)
    assert "converted 6 sequences" in done.stdout
    _run([str(python), "-m", "pipelines.validate", "out", "--deep"], cwd=work)
