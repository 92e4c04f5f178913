"""What the command line alone decides (pipelines/preflight.py): `~` paths, nested input and output,
Dataflow's required options, runner names, Beam's option names, and that every such refusal comes
before Beam or pyarrow is imported."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from formats.sources.lerobot_v3.sample import SyntheticLeRobot, write_dataset
from pipelines import beam_flags, cli, preflight

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> pathlib.Path:
    src = tmp_path_factory.mktemp("preflight") / "ds"
    write_dataset(str(src), SyntheticLeRobot(lengths=(4, 5), codec="h264", gop=None, cameras=("observation.images.front",)))
    return src


def _refused(tmp_path: pathlib.Path, *args: str, home: pathlib.Path | None = None) -> tuple[int, list[str], bool]:
    """(exit status, stderr lines, whether Beam or pyarrow was imported) of `convert.run(args)` in a fresh process."""
    script = ("import sys\nfrom pipelines import convert\ncode = convert.run(sys.argv[1:])\n"
              "print(code, 'apache_beam' in sys.modules or 'pyarrow' in sys.modules)")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), **({"HOME": str(home)} if home else {})}
    done = subprocess.run([sys.executable, "-c", script, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    code, heavy = done.stdout.split()[-2:]
    return int(code), done.stderr.strip().splitlines(), heavy == "True"


@pytest.mark.parametrize("case", ["unknown option", "unknown runner", "missing input", "existing output", "local path on Dataflow",
                                  "Dataflow without project", "output inside input", "input inside output"])
def test_refusals_need_no_data_and_no_heavy_import(tmp_path, small, case):
    out = tmp_path / "out"
    published = tmp_path / "published"
    published.mkdir()
    (published / "mixtrain.json").write_text("{}")
    args, expected = {
        "unknown option": ((f"--input={small}", f"--output={out}", "--num_workrs=2"),
                           (2, ["error: unknown option --num_workrs", "did you mean --num_workers?"])),
        "unknown runner": ((f"--input={small}", f"--output={out}", "--runner=Dataflw"),
                           (2, ["error: unknown runner 'Dataflw' (Beam's runners: " + ", ".join(preflight.RUNNERS) + ")",
                                "did you mean --runner=DataflowRunner?"])),
        "missing input": ((f"--input={tmp_path / 'nope'}", f"--output={out}"), (1, [f"error: {tmp_path / 'nope'}: input not found"])),
        "existing output": ((f"--input={small}", f"--output={published}"),
                            (1, [f"error: {published}: output already holds a Mixtrain dataset; pass --overwrite to replace it, "
                                 "or --incremental to convert only what changed"])),
        "local path on Dataflow": ((f"--input={small}", "--output=gs://b/out", "--runner=DataflowRunner"),
                                   (2, [f"error: --input={small} is on this machine's disk, which DataflowRunner workers cannot read; "
                                        "use a gs:// (or other shared storage) URL"])),
        "Dataflow without project": (("--input=gs://b/in", "--output=gs://b/out", "--runner=dataflow", "--region=europe-west1"),
                                     (2, ["error: DataflowRunner needs --project, --temp_location",
                                          "python -m pipelines.convert --input=gs://... --output=gs://... --runner=DataflowRunner "
                                          "--project=PROJECT --region=REGION --temp_location=gs://BUCKET/tmp (docs/dataflow.md)"])),
        "output inside input": ((f"--input={small}", f"--output={small}/converted"),
                                (2, [f"error: --output={small}/converted is inside --input={small}: the dataset would be written "
                                     "into the source dataset; choose an output folder outside it"])),
        "input inside output": ((f"--input={small}", f"--output={small.parent}"),
                                (2, [f"error: --input={small} is inside --output={small.parent}: publishing the output would replace "
                                     "the input; choose an output folder outside the dataset"])),
    }[case]
    code, lines, heavy = _refused(tmp_path, *args)
    assert (code, lines) == expected
    assert not heavy, "refused after importing Beam or pyarrow"
    assert not out.exists() and not (small / "converted").exists()


def test_tilde_paths_are_expanded_as_a_shell_user_means_them(tmp_path, small):
    home = tmp_path / "home"
    (home / "data").mkdir(parents=True)
    os.symlink(small, home / "data/ds")
    done = subprocess.run([sys.executable, "-m", "pipelines.convert", "--input=~/data/ds", "--output=~/out", "--progress=off"],
                          cwd=tmp_path, env={**os.environ, "HOME": str(home), "XDG_CACHE_HOME": str(tmp_path / "cache")},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith(f"-> {home / 'out'}")
    assert (home / "out/mixtrain.json").is_file() and not (tmp_path / "~").exists()


def test_a_failed_run_removes_the_parent_folders_it_created(tmp_path):
    not_a_dataset = tmp_path / "junk"
    not_a_dataset.mkdir()
    (not_a_dataset / "readme.txt").write_text("hello")
    target = tmp_path / "new" / "parent" / "child"
    done = subprocess.run([sys.executable, "-m", "pipelines.convert", f"--input={not_a_dataset}", f"--output={target}"], cwd=ROOT,
                          env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and done.stderr.startswith(f"error: {not_a_dataset}: not a dataset of a known format")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["cache", "junk"]


@pytest.mark.parametrize("typed, meant", [("Direct", "DirectRunner"), ("direct", "DirectRunner"), ("dataflow", "DataflowRunner"),
                                          ("FnApiRunner", "FnApiRunner"), ("my.module.Runner", "my.module.Runner"),
                                          ("apache_beam.runners.direct.direct_runner.DirectRunner", "DirectRunner")])
def test_runner_names_are_read_as_beam_reads_them(typed, meant):
    assert preflight.as_meant([f"--runner={typed}"]) == [f"--runner={meant}"]
    assert preflight.as_meant(["--runner", typed]) == ["--runner", meant]


@pytest.mark.parametrize("runner", ["PrismRunner", "InteractiveRunner"])
def test_local_runners_this_converter_does_not_serve_are_refused_with_what_to_use(tmp_path, small, runner):
    code, lines, heavy = _refused(tmp_path, f"--input={small}", f"--output={tmp_path / 'out'}", f"--runner={runner}")
    assert (code, heavy) == (2, False)
    assert lines[0].startswith(f"error: --runner={runner} is not one this converter runs on (") and "use --runner=DirectRunner" in lines[0]


def test_only_path_options_are_expanded():
    home = os.path.expanduser("~")
    assert preflight.as_meant(["--input=~/a", "--output=~", "--log_file=~/l", "--table_name=~x", "--input"]) == \
        [f"--input={home}/a", f"--output={home}", f"--log_file={home}/l", "--table_name=~x", "--input"]


def test_the_lists_kept_without_beam_match_beam():
    from apache_beam.options.pipeline_options import StandardOptions

    from pipelines import conversion

    ours = {option for action in cli.build_parser()._actions for option in action.option_strings}
    now = sorted(set(conversion.known_options()) - ours - beam_flags.DASK_FLAGS)
    assert sorted(beam_flags.BEAM_FLAGS) == now, "pipelines/beam_flags.py is out of date; its list is now:\n" + "\n".join(
        textwrap.wrap(" ".join(now), 140, break_on_hyphens=False, break_long_words=False))
    assert list(preflight.KNOWN_RUNNERS) == [path.rsplit(".", 1)[-1] for path in StandardOptions.ALL_KNOWN_RUNNERS]
    assert not ours & beam_flags.BEAM_FLAGS
    pytest.importorskip("dask.distributed", reason="the DaskRunner's options are Beam's only with dask installed")
    from apache_beam.options.pipeline_options import _BeamArgumentParser
    from apache_beam.runners.dask.dask_runner import DaskOptions

    dask = {option for action in conversion._add_beam_options(_BeamArgumentParser(), ours=False)._actions for option in action.option_strings
            if option.startswith("--dask")}
    assert dask == beam_flags.DASK_FLAGS and DaskOptions in conversion.PipelineOptions.__subclasses__()


def test_the_reader_validate_and_inspect_take_tilde_paths(tmp_path, small, monkeypatch):
    from formats import storage
    from formats.read.reader import open_dataset
    from pipelines import convert, inspect, validate

    monkeypatch.setenv("HOME", str(tmp_path))
    assert convert.run([f"--input={small}", "--output=~/out", "--progress=off"]) == 0
    assert storage.open_root("~/out")[1] == str(tmp_path / "out")
    assert len(open_dataset("~/out")) == 2
    assert validate.main(["~/out"]) == 0 and inspect.main(["~/out"]) == 0


def test_a_users_formats_py_and_transforms_py_do_not_break_the_documented_commands(tmp_path, small):
    """A training repository's own transforms.py / formats.py in the working folder (python puts
    the working folder first on sys.path): the commands and `from mixtrain_convert import ...` still work."""
    work = tmp_path / "training_repo"
    work.mkdir()
    (work / "transforms.py").write_text("raise SystemExit('the user transforms.py was imported')\n")
    (work / "formats.py").write_text("USERS = True\n")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "PYTHONPATH": ""}

    def run(*command):
        return subprocess.run([sys.executable, *command], cwd=work, env=env, capture_output=True, text=True, timeout=300)

    converted = run("-m", "pipelines.convert", f"--input={small}", f"--output={work / 'out'}", "--progress=off")
    assert converted.returncode == 0, converted.stderr
    assert run("-m", "pipelines.validate", str(work / "out")).returncode == 0
    read = run("-c", "from mixtrain_convert import open_dataset, torch_windows\n"
                     "ds = open_dataset('out')\nprint(len(ds), ds.sequence(ds.sequence_ids()[0])['length'])")
    assert (read.returncode, read.stdout.split()) == (0, ["2", "4"]), read.stderr
    first = run("-c", "import formats\nimport mixtrain_convert")  # theirs imported first: one clear refusal
    assert first.returncode == 1 and first.stderr.strip().splitlines()[-1] == (
        f"ImportError: {work / 'formats.py'} was imported as 'formats' before mixtrain-convert's own 'formats' package "
        f"({ROOT}); rename that file, or import mixtrain_convert first")


def test_the_public_name_converts_in_process(tmp_path, small):
    import mixtrain_convert

    assert mixtrain_convert.convert([f"--input={small}", f"--output={tmp_path / 'out'}", "--progress=off"]) == 0
    assert len(mixtrain_convert.open_dataset(str(tmp_path / "out"))) == 2
    assert mixtrain_convert.__version__ == __import__("formats").__version__


class _Unreachable:
    """fsspec filesystems standing for a store that hangs, or refuses the connection."""

    @staticmethod
    def register(monkeypatch, hang_seconds: float = 3):
        import time

        import fsspec
        from fsspec.implementations.memory import MemoryFileSystem

        class Hangs(MemoryFileSystem):
            protocol = "hangs"

            def exists(self, path, **kwargs):
                time.sleep(hang_seconds)
                return True

        class Refuses(MemoryFileSystem):
            protocol = "refuses"

            def __init__(self, *args, **kwargs):
                raise ConnectionError("Cannot connect to host store.example:443 [Name or service not known]")

        fsspec.register_implementation("hangs", Hangs, clobber=True)
        fsspec.register_implementation("refuses", Refuses, clobber=True)


def test_a_hung_store_does_not_hold_the_process_at_exit(tmp_path):
    """The thread still waiting on a store after the deadline must not keep the interpreter alive."""
    script = (f"import sys\nsys.path.insert(0, {str(ROOT)!r})\nfrom tests.pipelines.test_preflight import _Unreachable\n"
              "from formats import storage\nstorage.REACH_SECONDS = 0.5\n_Unreachable.register(None, hang_seconds=60)\n"
              "try:\n    storage.open_reachable('hangs://bucket/data')\nexcept Exception as error:\n    print(type(error).__name__)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=30)  # hangs 60 s if held
    assert done.stdout.strip() == "FormatError", done.stderr


def test_an_unreachable_store_is_one_line_within_the_deadline(monkeypatch):
    from formats import storage
    from formats.errors import FormatError

    _Unreachable.register(monkeypatch)
    monkeypatch.setattr(storage, "REACH_SECONDS", 0.5)
    with pytest.raises(FormatError) as hung:
        storage.open_reachable("hangs://bucket/data")
    assert str(hung.value) == ("hangs://bucket/data: the store did not answer in 0.5 s; check the network (a proxy or a firewall) "
                               "and the credentials, then retry")
    with pytest.raises(FormatError) as refused:
        storage.open_reachable("refuses://bucket/data")
    assert str(refused.value) == ("refuses://bucket/data: cannot reach the store (Cannot connect to host store.example:443 [Name or "
                                  "service not known]); check the network, the URL and the credentials")


def test_the_dataflow_dry_run_of_the_docs_offline_is_one_line(tmp_path):
    """docs/dataflow.md's command with placeholders, offline: one `error:` line naming the URL, not
    an internal error after a minute of retries."""
    env = {key: value for key, value in os.environ.items() if key != "STORAGE_EMULATOR_HOST"}
    done = subprocess.run([sys.executable, "-m", "pipelines.convert", "--input=gs://BUCKET/datasets/so100",
                           "--output=gs://BUCKET/mixtrain/so100", "--runner=DataflowRunner", "--project=PROJECT", "--region=REGION",
                           "--temp_location=gs://BUCKET/dataflow/tmp", "--setup_file=./setup.py", "--dry_run=True"],
                          cwd=ROOT, env={**env, "XDG_CACHE_HOME": str(tmp_path / "cache")}, capture_output=True, text=True, timeout=60)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert lines[0].startswith("error: gs://BUCKET/datasets/so100: ") and "internal error" not in lines[0]


def test_a_hub_dataset_id_gets_the_hf_url_and_the_download_alternative(tmp_path):
    code, lines, heavy = _refused(tmp_path, "--input=lerobot/svla_so100_pickplace", f"--output={tmp_path / 'out'}")
    assert (code, heavy) == (1, False)
    assert lines == [f"error: {ROOT}/lerobot/svla_so100_pickplace: input not found; a Hugging Face Hub dataset id? pass "
                     "--input=hf://datasets/lerobot/svla_so100_pickplace (pip install 'mixtrain-convert[hub]'), or download it "
                     "first: huggingface-cli download lerobot/svla_so100_pickplace --repo-type=dataset --local-dir DIR"]
    assert not preflight.looks_like_hub_id("./a/b") and not preflight.looks_like_hub_id("a/b/c") and not preflight.looks_like_hub_id("a")


class _LocalHub:
    """The `hf` protocol served from a local folder (huggingface_hub's HfFileSystem names files
    `datasets/<owner>/<name>/...` the same way): the conversion's hf:// path without the network."""

    @staticmethod
    def register(hub_root: pathlib.Path, monkeypatch):
        from fsspec.implementations.dirfs import DirFileSystem
        from fsspec.implementations.local import LocalFileSystem

        class LocalHub(DirFileSystem):
            protocol = "hf"

            def __init__(self, *args, **kwargs):
                super().__init__(path=str(hub_root), fs=LocalFileSystem())

            @classmethod
            def _strip_protocol(cls, path):
                return path[len("hf://"):] if isinstance(path, str) and path.startswith("hf://") else path

            def unstrip_protocol(self, name):
                return f"hf://{name}"

        monkeypatch.setitem(sys.modules["fsspec.registry"]._registry, "hf", LocalHub)  # for this test only


def test_an_hf_url_converts_through_the_hub_filesystem(tmp_path, small, monkeypatch):
    from pipelines import convert

    hub = tmp_path / "hub"
    (hub / "datasets/someone").mkdir(parents=True)
    os.symlink(small, hub / "datasets/someone/tiny")
    _LocalHub.register(hub, monkeypatch)
    assert convert.run(["--input=hf://datasets/someone/tiny", f"--output={tmp_path / 'out'}", "--progress=off"]) == 0
    sidecar = __import__("json").loads((tmp_path / "out/mixtrain.json").read_text())
    assert sidecar["num_sequences"] == 2 and sidecar["source"]["uri"] == "hf://datasets/someone/tiny"


def test_an_hf_url_without_huggingface_hub_names_the_extra(tmp_path):
    import importlib.util

    if importlib.util.find_spec("huggingface_hub") is not None:
        pytest.skip("huggingface_hub is installed here: the message for its absence cannot be shown")
    done = subprocess.run([sys.executable, "-m", "pipelines.convert", "--input=hf://datasets/lerobot/pusht", f"--output={tmp_path / 'o'}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr.strip().splitlines()[0]) == (
        2, "error: --input=hf://datasets/lerobot/pusht: this protocol needs a package that is not installed: pip install "
           "'mixtrain-convert[hub]'")


@pytest.mark.parametrize("script, usage", [("mixtrain-convert", "usage: mixtrain-convert "), ("mixtrain-validate", "usage: mixtrain-validate "),
                                           ("mixtrain-inspect", "usage: mixtrain-inspect "), ("mixtrain-export", "usage: mixtrain-export ")])
def test_console_scripts_name_themselves_in_their_usage(script, usage):
    path = pathlib.Path(sys.executable).with_name(script)
    if not path.exists():
        pytest.skip(f"{script} is not installed beside this interpreter (pip install -e . installs it)")
    done = subprocess.run([str(path), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith(usage)


def test_importing_the_reader_leaves_a_users_transforms_py_theirs(tmp_path):
    """A training script's own transforms.py (augmentations) stays the one it imports after
    `from mixtrain_convert import open_dataset`: only `formats` is the product's there."""
    work = tmp_path / "training_repo"
    work.mkdir()
    (work / "transforms.py").write_text("OWNER = 'theirs'\n")
    done = subprocess.run([sys.executable, "-c", "from mixtrain_convert import open_dataset\nimport transforms\nprint(transforms.OWNER)"],
                          cwd=work, env={**os.environ, "PYTHONPATH": ""}, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout.strip()) == (0, "theirs"), done.stderr


@pytest.mark.parametrize(("extra", "expected"), [
    (["--dry_run=True"], "error: --dry_run has no effect on the local runner (it runs the conversion here); it is for "
                         "--runner=DataflowRunner"),
    (["--project=p"], "error: --project has no effect on the local runner (it runs the conversion here); it is for --runner=DataflowRunner"),
    (["--region", "europe-west1"], "error: --region has no effect on the local runner (it runs the conversion here); it is for "
                                   "--runner=DataflowRunner"),
    (["--runner=DirectRunner", "--machine_type=n2-standard-4"],
     "error: --machine_type has no effect on the local runner (it runs the conversion here); it is for --runner=DataflowRunner"),
    (["--max_num_workers=10"], "error: --max_num_workers has no effect on the local runner (it runs the conversion here); it is for "
                               "--runner=DataflowRunner"),
    (["--overwrite", "--incremental"], "error: --overwrite and --incremental cannot be combined: --incremental replaces the dataset "
                                       "too, reusing its unchanged sequences; --overwrite converts every sequence again"),
    (["--direct_num_workers=-1"], "error: --direct_num_workers=-1: expected 0 (one worker per CPU) or more"),
    (["--direct_num_workers=two"], "error: --direct_num_workers=two: expected a whole number"),
    (["--direct_num_workers=100000"], f"error: --direct_num_workers=100000: this machine has {os.cpu_count()} CPU(s); at most "
                                      f"{8 * os.cpu_count()} local workers (8 per CPU), each a process of its own"),
])
def test_options_a_local_run_would_ignore_or_cannot_serve_are_refused_at_once(tmp_path, small, extra, expected):
    code, lines, heavy = _refused(tmp_path, f"--input={small}", f"--output={tmp_path / 'out'}", *extra)
    assert (code, heavy, lines) == (2, False, [expected])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("extra", "expected"), [
    (["--dask_npartitions=-5"], "error: --dask_npartitions=-5: expected a whole number of at least 1"),
    (["--dask_connection_timeout=soon"], "error: --dask_connection_timeout=soon: expected a whole number of at least 1 (seconds)"),
    (["--dask_scheduler_file=/nonexistent/scheduler.json"],
     "error: --dask_scheduler_file=/nonexistent/scheduler.json: no such file (the one `dask scheduler --scheduler-file` writes)"),
])
def test_dask_values_are_checked_like_ours(tmp_path, small, extra, expected):
    """Beam's DaskOptions took any value (a timeout of "soon" became dask's default, -5 partitions went on)."""
    code, lines, heavy = _refused(tmp_path, f"--input={small}", f"--output={tmp_path / 'out'}", "--runner=DaskRunner", *extra)
    assert (code, heavy, lines) == (2, False, [expected])
