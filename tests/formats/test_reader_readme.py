"""The README's reader example runs as written against the sample `./run_local.sh` converts."""

from __future__ import annotations

import contextlib
import io
import pathlib
import re

from pipelines import convert, make_sample

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def _example() -> str:
    text = README.read_text()
    section = text[text.index("## Reading a converted dataset"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_reader_example_runs(tmp_path, monkeypatch):
    assert make_sample.main([str(tmp_path / "sample/lerobot_v3")]) == 0
    assert convert.run([f"--input={tmp_path / 'sample/lerobot_v3'}", f"--output={tmp_path / 'sample/mixtrain'}", "--progress=off"]) == 0
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(_example(), "README.md", "exec"), namespace)  # noqa: S102 (the documented example itself)
    lines = out.getvalue().splitlines()
    assert lines[0] == f"<Mixtrain dataset file://{tmp_path}/sample/mixtrain: 12 sequences, 1 shard>"
    assert lines[1] == "['obs_state', 'action'] ['video_front', 'video_wrist']"
    assert lines[2] == "(37, 6) float32 Open the drawer. files/video_front/episode_000001.mp4"
    assert namespace["ids"] == [f"episode_{i:06d}" for i in (1, 3, 5, 7, 9, 11)]
    assert namespace["long_ones"].column("length").to_pylist() == [51, 49, 47]
    assert namespace["frames"].shape == (8, 48, 64, 3)
    assert namespace["observation"].shape == (2, 6) and namespace["actions"].shape == (8, 6)
    assert lines[3] == f"{namespace['ds'].count_windows(2, 8, 4)} windows per epoch" and namespace["ds"].count_windows(2, 8, 4) > 0
