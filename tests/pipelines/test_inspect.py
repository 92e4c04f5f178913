"""python -m pipelines.inspect: the terminal summary, the command line, and the HTML report
(its structure offline, then loaded in headless Chromium: no console errors, every image
decodes, a plot per trajectory dimension and thumbnails per camera)."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys

import av
import numpy as np
import pytest

from formats.read import reader, report
from formats.sources.lerobot_v3.sample import SyntheticLeRobot
from formats.sources.lerobot_v3.sample import write_dataset as write_lerobot
from formats.sources.ortf.sample import SyntheticORTF
from formats.sources.ortf.sample import write_dataset as write_ortf
from pipelines import convert, inspect

SPEC = SyntheticLeRobot(lengths=(8, 6, 9, 7, 5), codec="h264", gop=None, episodes_per_video_file=2, episodes_per_data_file=3)


@pytest.fixture(scope="module")
def skipped_dataset(tmp_path_factory):
    """A LeRobot conversion under --on_error=skip with two episodes' wrist video missing."""
    base = tmp_path_factory.mktemp("inspect")
    src, dst = base / "src", base / "mixtrain"
    write_lerobot(str(src), SPEC)
    (src / "videos/observation.images.wrist/chunk-000/file-001.mp4").unlink()  # episodes 2 and 3
    assert convert.run([f"--input={src}", f"--output={dst}", "--progress=off", "--on_error=skip", "--max_skipped=2"]) == convert.EXIT_SKIPPED
    return src, dst


@pytest.fixture(scope="module")
def ortf_dataset(tmp_path_factory):
    """ORTF: a depth camera, a half-rate camera, audio files and 3 sequences."""
    base = tmp_path_factory.mktemp("inspect_ortf")
    write_ortf(str(base / "src"), SyntheticORTF(lengths=(6, 5, 7, 9)))
    assert convert.run([f"--input={base / 'src'}", f"--output={base / 'mixtrain'}", "--progress=off"]) == 0
    return base / "mixtrain"


def _mb(path) -> str:
    return report._mb(sum(f.stat().st_size for f in path.rglob("*") if f.is_file()))


def test_terminal_summary_states_the_dataset(skipped_dataset, capsys):
    src, dst = skipped_dataset
    assert inspect.main([str(dst)]) == 0
    out = capsys.readouterr().out.splitlines()
    sidecar = json.loads((dst / "mixtrain.json").read_text())
    stats = json.loads((dst / "stats.json").read_text())
    assert out[:5] == [f"dataset     file://{dst} (Mixtrain 1.0)", "sequences   3", "timesteps   19",
                       f"shards      1 ({_mb(dst / 'data')})", "lengths     min 5, median 6, mean 6.3, max 8"]
    # The histogram: whole-number bins 5..8 (episodes of 8, 6 and 5 steps are left).
    assert out[5:9] == ["  5  " + "#" * 40 + " 1", "  6  " + "#" * 40 + " 1", "  7  " + " " * 40 + " 0", "  8  " + "#" * 40 + " 1"]
    assert "  action            trajectory  float32   dim 6    [joint_0, joint_1, joint_2, joint_3, joint_4, joint_5]" in out
    assert "  timestamp         timestamps  double             units s" in out
    assert "  task              scalar      string" in out
    assert f"  video_front  h264  64x48  30 fps  yuv420p  copy  3 files  {_mb(dst / 'files/video_front')}" in out
    assert f"  video_wrist  h264  64x48  30 fps  yuv420p  copy  3 files  {_mb(dst / 'files/video_wrist')}" in out
    start = out.index("  action  (19 timesteps)")
    assert out[start + 1].split() == ["mean", "std", "min", "q01", "q50", "q99", "max"]
    assert out[start + 2].split() == ["joint_0", *(report._fmt(stats["action"][key][0]) for key in report.STAT_KEYS)]
    assert f"  source      lerobot_v3 file://{src}" in out
    assert f"  converter   mixtrain-convert {sidecar['converter']['version']}" in out
    assert f"  created_at  {sidecar['created_at']}" in out
    options = next(line for line in out if line.startswith("  options"))
    assert "video=copy" in options and "on_error=skip" in options
    missing = f"{src}/videos/observation.images.wrist/chunk-000/file-001.mp4"
    skipped = out.index("skipped     2")
    assert out[skipped:skipped + 3] == ["skipped     2", f"  episode_000002: {missing}: episode_000002 (video_wrist): video file not found",
                                        f"  episode_000003: {missing}: episode_000003 (video_wrist): video file not found"]
    assert out[skipped + 3].startswith("quality     0 error(s), ")  # then the data-quality findings (tests/pipelines/test_quality.py)


def test_so100_summary(so100_tiny, tmp_path, capsys):
    dst = tmp_path / "so100"
    assert convert.run([f"--input={so100_tiny}", f"--output={dst}", "--progress=off"]) == 0
    capsys.readouterr()
    assert inspect.main([str(dst)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1:3] == ["sequences   5", "timesteps   197"]
    assert out[4] == "lengths     min 23, median 44, mean 39.4, max 54"
    assert f"  video_front  av1  64x48  30 fps  yuv420p  copy  5 files  {_mb(dst / 'files/video_front')}" in out
    assert out[out.index("skipped     none") + 1:] == [
        "quality     0 error(s), 1 warning(s), recorded by the conversion",
        "  rare_task      warning  1 finding(s)",
        "    task: task 'Stack the blue block on the green block.' has 1 sequence(s)",
        "  not checked: dead_camera (docs/quality.md says what each check needs)"]


def test_command_line_failures_are_one_line(tmp_path, skipped_dataset):
    _, dst = skipped_dataset
    run = [sys.executable, "-m", "pipelines.inspect"]
    cwd = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    missing = subprocess.run([*run, str(tmp_path / "nothing")], capture_output=True, text=True, cwd=cwd, timeout=120)
    assert missing.returncode == 1 and missing.stdout == ""
    assert missing.stderr == f"error: {tmp_path / 'nothing'}/mixtrain.json: not found: not a finished Mixtrain dataset (no mixtrain.json)\n"
    bad = subprocess.run([*run, str(dst), "--samples=0"], capture_output=True, text=True, cwd=cwd, timeout=120)
    assert bad.returncode == 2 and "--samples: must be at least 1, got 0" in bad.stderr and "Traceback" not in bad.stderr
    unknown = subprocess.run([*run, str(dst), "--htm=x.html"], capture_output=True, text=True, cwd=cwd, timeout=120)
    assert unknown.returncode == 2 and "unrecognized arguments: --htm=x.html" in unknown.stderr
    helped = subprocess.run([*run, "--help"], capture_output=True, text=True, cwd=cwd, timeout=120)
    assert helped.returncode == 0 and all(option in helped.stdout for option in ("--html", "--samples", "--trajectory_samples"))
    (tmp_path / "blocker").write_text("a file, not a folder")
    target = tmp_path / "blocker" / "report.html"
    unwritable = subprocess.run([*run, str(dst), f"--html={target}"], capture_output=True, text=True, cwd=cwd, timeout=120)
    assert unwritable.returncode == 1 and unwritable.stderr.count("\n") == 1
    assert unwritable.stderr.startswith(f"error: {target}: cannot write the report") and "Traceback" not in unwritable.stderr


def _write_report(dst, path, capsys=None) -> str:
    assert inspect.main([str(dst), f"--html={path}"]) == 0
    return path.read_text()


def test_report_is_self_contained_with_every_plot_and_thumbnail(skipped_dataset, tmp_path, capsys):
    src, dst = skipped_dataset
    page = _write_report(dst, tmp_path / "report.html")
    assert f"report: {tmp_path / 'report.html'}" in capsys.readouterr().out
    # No network: no script, stylesheet link or remote URL; the only http is the SVG namespace.
    assert "<script" not in page and "<link" not in page and "url(" not in page
    assert set(re.findall(r"https?://[^\"' <>]+", page)) == {"http://www.w3.org/2000/svg"}
    assert all(src.startswith("data:image/jpeg;base64,") for src in re.findall(r'src="([^"]*)"', page))
    assert page.count('id="length-histogram"') == 1
    assert "<tr><td>sequences</td><td>3</td></tr>" in page and "<tr><td>skipped</td><td>2</td></tr>" in page
    ds = reader.open_dataset(str(dst))
    for column in ds.columns("trajectory"):
        assert f'id="stats-{column}"' in page and f'id="trajectories-{column}"' in page
        for index in range(ds.column_types[column]["dim"]):
            assert f'id="plot-{column}-{index}"' in page
    # Thumbnails: 3 sequences (all of them: fewer than --samples) x first/middle/last, per camera.
    for camera in ("video_front", "video_wrist"):
        table = page[page.index(f'id="thumbs-{camera}"'):]
        table = table[:table.index("</table>")]
        assert table.count("<img") == 9
        assert "Pick up the cube." in table or "Open the drawer." in table
    # Each thumbnail decodes to the frame it names, scaled (64x48 -> 64x48: the source is smaller than 160).
    first = re.search(r'alt="episode_000000 video_front timestep 0"[^>]*src="data:image/jpeg;base64,([^"]+)"', page)
    jpeg = __import__("base64").b64decode(first.group(1))
    decoded = next(av.open(__import__("io").BytesIO(jpeg)).decode(video=0)).to_ndarray(format="rgb24")
    expected = ds.frames("episode_000000", "video_front", 0, 1)[0]
    assert decoded.shape == expected.shape and np.abs(decoded.astype(int) - expected.astype(int)).mean() < 4
    for episode in ("episode_000002", "episode_000003"):  # the skipped sequences are listed with their error
        missing = f"{html.escape(str(src))}/videos/observation.images.wrist/chunk-000/file-001.mp4"
        assert f"<tr><td>{episode}</td><td>{missing}: {episode} (video_wrist): video file not found</td></tr>" in page


PROBE = """<script>
window.__errors = [];
window.addEventListener("error", e => window.__errors.push(String(e.message || (e.target && (e.target.src || e.target.href)) || e.type)), true);
const __consoleError = console.error;
console.error = (...a) => { window.__errors.push(a.join(" ")); __consoleError(...a); };
window.addEventListener("load", () => {
  // Synchronous (the DOM is dumped once the load handlers ran): each image drawn on a canvas,
  // which needs its pixels decoded; a broken image has no natural size or throws here.
  const images = [];
  for (const img of document.images) {
    let ok = img.complete && img.naturalWidth > 0, spread = 0;
    try {
      const canvas = document.createElement("canvas");
      canvas.width = img.naturalWidth; canvas.height = img.naturalHeight;
      const context = canvas.getContext("2d");
      context.drawImage(img, 0, 0);
      const pixels = context.getImageData(0, 0, canvas.width, canvas.height).data;
      let low = 255, high = 0;
      for (let i = 0; i < pixels.length; i += 4) { low = Math.min(low, pixels[i]); high = Math.max(high, pixels[i]); }
      spread = high - low;
    } catch (e) { ok = false; window.__errors.push("image " + img.alt + ": " + e); }
    images.push({alt: img.alt, ok, spread, width: img.naturalWidth, height: img.naturalHeight, shown: img.getBoundingClientRect().width});
  }
  const svgs = Array.from(document.querySelectorAll("svg")).map(s => ({id: s.id, cls: s.getAttribute("class"),
    width: s.getBoundingClientRect().width, marks: s.querySelectorAll("polyline,rect,circle").length}));
  const sections = {};
  for (const el of document.querySelectorAll("[id]")) {
    sections[el.id] = {imgs: el.querySelectorAll("img").length, svgs: el.querySelectorAll("svg").length};
  }
  const probe = document.createElement("pre");
  probe.id = "probe";
  probe.textContent = JSON.stringify({errors: window.__errors, images, svgs, sections});
  document.body.appendChild(probe);
});
</script>"""


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("headless Chromium is not installed (Debian: apt-get install -y chromium; ./run_local.sh test installs it when run as root)")


def _browser(profile, *args, timeout=120) -> subprocess.CompletedProcess:
    """One headless Chromium run with its own profile folder (runs never share a browser)."""
    return subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
                           f"--user-data-dir={profile}", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("name", ["lerobot_skipped", "ortf"])
def test_report_in_headless_chromium(name, skipped_dataset, ortf_dataset, tmp_path):
    """The page loads from disk in a real browser with no console message, every image
    decodes, every trajectory dimension has a drawn plot and every camera its thumbnails."""
    chromium = _chromium()
    assert chromium
    dst = skipped_dataset[1] if name == "lerobot_skipped" else ortf_dataset
    path = tmp_path / "report.html"
    page = _write_report(dst, path)
    if name == "lerobot_skipped":  # the page as it is (the probe below adds a script to a copy)
        shot = tmp_path / "report.png"
        done = _browser(tmp_path / "profile-1", f"--screenshot={shot}", "--window-size=1280,2000", "--hide-scrollbars", path.as_uri())
        assert shot.is_file(), done.stderr[-2000:]
        assert [line for line in done.stderr.splitlines() if "CONSOLE" in line] == []
        image = next(av.open(str(shot)).decode(video=0)).to_ndarray(format="rgb24")
        assert image.shape == (2000, 1280, 3) and image.std() > 10  # rendered, not a blank page

    probe_path = tmp_path / "probe.html"
    probe_path.write_text(page.replace("<head>", "<head>" + PROBE, 1))
    dumped = _browser(tmp_path / "profile-2", "--dump-dom", probe_path.as_uri())
    found = re.search(r'<pre id="probe">(.*?)</pre>', dumped.stdout, re.S)
    assert found, (dumped.returncode, dumped.stdout[-1500:], dumped.stderr[-500:])
    result = json.loads(html.unescape(found.group(1)))
    assert result["errors"] == [] and [line for line in dumped.stderr.splitlines() if "CONSOLE" in line] == []
    ds = reader.open_dataset(str(dst))
    images = result["images"]
    assert images and all(img["ok"] and img["spread"] > 0 and img["width"] > 0 and img["shown"] > 0 for img in images), images
    sections = result["sections"]
    assert sections["length-histogram"] == {"imgs": 0, "svgs": 0} and any(s["id"] == "length-histogram" and s["marks"] > 0 for s in result["svgs"])
    plots = {s["id"]: s for s in result["svgs"] if s["id"].startswith("plot-")}
    for column in ds.columns("trajectory"):
        dim = ds.column_types[column]["dim"]
        assert sections[f"trajectories-{column}"]["svgs"] == min(dim, report.MAX_PLOTTED_DIMENSIONS)
        assert sections[f"stats-{column}"]["svgs"] == dim
        for index in range(min(dim, report.MAX_PLOTTED_DIMENSIONS)):
            assert plots[f"plot-{column}-{index}"]["width"] > 0 and plots[f"plot-{column}-{index}"]["marks"] >= 2
    samples = min(4, len(ds))
    for camera in ds.video_columns:
        with_video = sum(1 for sequence_id in report.sample_ids(ds.sequence_ids(), samples) if ds.video_url(sequence_id, camera))
        assert sections[f"thumbs-{camera}"]["imgs"] == 3 * with_video > 0


def test_units_and_depth_camera_of_an_ortf_dataset(ortf_dataset, tmp_path, capsys):
    assert inspect.main([str(ortf_dataset), f"--html={tmp_path / 'report.html'}"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert ("  action                trajectory  float32   dim 7    [dx, dy, dz, droll, dpitch, dyaw, gripper]  "
            "units meters, meters, meters, radians, radians, radians, discrete") in out
    assert f"  video_depth         ffv1  64x48  15 fps  gray16le  copy  depth  4 files  {_mb(ortf_dataset / 'files/video_depth')}" in out
    page = (tmp_path / "report.html").read_text()
    stats = page[page.index('id="stats-action"'):]
    assert "<tr><td>dx</td><td>meters</td>" in stats and "<tr><td>gripper</td><td>discrete</td>" in stats
    assert "<tr><td>[0]</td><td>s</td>" in page[page.index('id="stats-timestamp"'):]


def test_a_damaged_dataset_is_one_error_line_naming_the_file(skipped_dataset, tmp_path, capsys):
    _, dst = skipped_dataset
    copy = tmp_path / "copy"
    shutil.copytree(dst, copy)
    shard = copy / "data/part-00000.parquet"
    shard.write_bytes(shard.read_bytes()[:100])
    assert inspect.main([str(copy)]) == 1
    assert capsys.readouterr().err == (f"error: {shard}: Parquet magic bytes not found in footer. "
                                       "Either the file is corrupted or this is not a parquet file.\n")
    shard.unlink()
    assert inspect.main([str(copy)]) == 1
    assert capsys.readouterr().err == f"error: {shard}: listed in mixtrain.json but missing\n"
    shutil.copy(dst / "data/part-00000.parquet", shard)
    (copy / "stats.json").write_text("{")
    assert inspect.main([str(copy)]) == 1
    assert capsys.readouterr().err.startswith(f"error: {copy / 'stats.json'}: malformed JSON")


def test_wide_columns_plot_their_first_dimensions_and_keep_every_statistic(tmp_path, capsys):
    write_lerobot(str(tmp_path / "src"), SyntheticLeRobot(lengths=(12, 9), state_dim=40, cameras=()))
    assert convert.run([f"--input={tmp_path / 'src'}", f"--output={tmp_path / 'dst'}", "--progress=off"]) == 0
    page = _write_report(tmp_path / "dst", tmp_path / "report.html")
    plots = page[page.index('id="trajectories-obs_state"'):]
    plots = plots[:plots.index("</div>")]
    assert plots.count("<svg") == report.MAX_PLOTTED_DIMENSIONS == 32
    assert "<code>obs_state</code> against time <span class=\"muted\">(the first 32 of 40 dimensions)</span>" in page
    stats = page[page.index('id="stats-obs_state"'):]
    stats = stats[:stats.index("</table>")]
    assert stats.count('<svg class="band"') == 40 and "<tr><td>joint_39</td>" in stats
    assert "cameras     none" in capsys.readouterr().out
