"""gs:// end to end against a real GCS JSON API on loopback (gcp-storage-emulator), every source."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from formats import samples, storage
from pipelines import convert, validate
from tests import gcs_emulator


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    """A GCS emulator on a free loopback port; gcsfs reaches it through STORAGE_EMULATOR_HOST."""
    with gcs_emulator.running() as url:
        saved = {key: os.environ.get(key) for key in ("STORAGE_EMULATOR_HOST", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT")}
        os.environ["STORAGE_EMULATOR_HOST"] = url
        # Recent gcsfs probes every bucket over gRPC (60 s timeouts) unless told not to (NOTES.md).
        os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
        import fsspec

        fsspec.filesystem("gs").clear_instance_cache()
        yield tmp_path_factory.mktemp("gcs_local")
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _upload(local, url):
    fs, root = storage.open_root(url)
    fs.put(str(local), root, recursive=True)
    return url


@pytest.mark.parametrize("source", sorted(samples.SAMPLES))
def test_gs_to_gs_conversion_validates_read_back_from_gs(gcs, source):
    local = gcs / source
    samples.get(source).small(str(local))
    src = _upload(local, f"gs://bucket/sources/{source}")
    dst = f"gs://bucket/mixtrain/{source}"
    extra = list(samples.get(source).convert_args)
    assert convert.run([f"--input={src}", f"--output={dst}", "--progress=off", *extra]) == 0
    assert validate.validate(dst) == []
    findings, summary = validate.deep_check(dst, src)  # the source named: mixtrain.json's gs:// URI is not followed by itself
    assert findings == [] and not [line for line in summary if "not fetched" in line or "not reachable" in line], summary
    fs, root = storage.open_root(dst)
    names = {path.rsplit("/", 1)[-1] for path in fs.ls(root, detail=False)}
    assert {"mixtrain.json", "stats.json", "data"} <= names and "_staging" not in names


def test_gs_output_already_holding_a_dataset_needs_overwrite(gcs):
    local = gcs / "again"
    samples.get("l5kit").small(str(local))
    src = _upload(local, "gs://bucket/sources/again")
    dst = "gs://bucket/mixtrain/again"
    assert convert.run([f"--input={src}", f"--output={dst}", "--progress=off"]) == 0
    assert convert.run([f"--input={src}", f"--output={dst}", "--progress=off"]) == 1
    assert convert.run([f"--input={src}", f"--output={dst}", "--progress=off", "--overwrite"]) == 0
    assert validate.validate(dst) == []


def test_gs_incremental_rerun_reuses_everything_unchanged(gcs):
    local = gcs / "nightly"
    samples.get("ortf").small(str(local))
    src = _upload(local, "gs://bucket/sources/nightly")
    dst = "gs://bucket/mixtrain/nightly"
    assert convert.run([f"--input={src}", f"--output={dst}", "--progress=off"]) == 0
    assert convert.run([f"--input={src}", f"--output={dst}", "--progress=off", "--incremental"]) == 0
    fs, root = storage.open_root(dst)
    sidecar = json.loads(fs.cat_file(f"{root}/mixtrain.json"))
    assert sidecar["incremental"]["reused_sequences"] == 3 and sidecar["incremental"]["converted_units"] == 0
    findings, summary = validate.deep_check(dst, src)
    assert validate.validate(dst) == [] and findings == []
    assert not [line for line in summary if "not fetched" in line or "not reachable" in line], summary


def test_dataflow_dry_run_prints_the_job_and_never_touches_the_output(gcs):
    """A launch that does not wait for the job (here a dry run) reports what it built and reads no output."""
    pytest.importorskip("apache_beam.runners.dataflow.internal.apiclient", reason="apache-beam[gcp] is a dependency")
    local = gcs / "dry"
    samples.get("lerobot_v3").small(str(local))
    src = _upload(local, "gs://bucket/sources/dry")
    dst = "gs://bucket/mixtrain/dry"
    root = pathlib.Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "pipelines.convert", f"--input={src}", f"--output={dst}", "--runner=DataflowRunner",
                           "--project=my-project-123", "--region=us-central1", "--temp_location=gs://bucket/tmp", "--dry_run=True",
                           "--no_auth", "--sdk_location=container", "--setup_file=./setup.py", "--job_name=mixtrain-nightly-dry"],
                          cwd=root, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TMPDIR": str(gcs), "XDG_CACHE_HOME": str(gcs / "cache")})
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.strip().splitlines()[-1] == ("[mixtrain-convert] dry run: job mixtrain-nightly-dry was built and not submitted; "
                                                    "nothing was written to gs://bucket/tmp or to the output")
    fs, path = storage.open_root(dst)
    assert not fs.exists(path)


def test_gs_publish_moves_every_object_in_windows_and_replaces_the_previous_dataset(gcs, monkeypatch):
    check_publish_in_windows("gs://bucket/mixtrain/windows", monkeypatch)


def check_publish_in_windows(url: str, monkeypatch) -> None:
    """More objects than one window of requests (shrunk here): every staged object lands under
    its name, the previous dataset's objects that the new one lacks are gone, staging is removed,
    and mixtrain.json is the new one. (Every object store: test_s3.py runs it too.)"""
    from formats.mixtrain import publish

    monkeypatch.setattr(publish, "IN_FLIGHT", 2)
    monkeypatch.setattr(publish, "_DELETES_PER_REQUEST", 10)  # windows of 20 deletes
    fs, output = storage.open_root(url)
    fs.pipe({f"{output}/files/cam/old_{i}.mp4": b"old" for i in range(5)} | {f"{output}/mixtrain.json": b"{}",
                                                                           f"{output}/data/part-00000.parquet": b"old"})
    staging = f"{output}/_staging/run1"
    staged = {f"files/cam/episode_{i:03d}.mp4": f"video {i}".encode() for i in range(70)}  # 4 windows
    staged |= {"data/part-00000.parquet": b"new", "data/part-00001.parquet": b"new1", "stats.json": b"{}"}
    fs.pipe({f"{staging}/{name}": data for name, data in staged.items()}, batch_size=8)  # the emulator takes 5 connections at a time
    fs.invalidate_cache()
    publish.publish(fs, staging, output, {"format": "mixtrain", "run": 1})
    fs.invalidate_cache()
    published = {path[len(output) + 1:] for path in fs.find(output)}
    assert published == set(staged) | {"mixtrain.json", "_errors.jsonl", "_fingerprints.json"}
    assert fs.cat_file(f"{output}/files/cam/episode_063.mp4") == b"video 63"
    assert json.loads(fs.cat_file(f"{output}/mixtrain.json"))["run"] == 1


def test_gs_publish_keeps_names_with_pattern_characters_and_can_be_retried(gcs, monkeypatch):
    check_publish_of_pattern_names_and_retry("gs://bucket/mixtrain/patterns", monkeypatch)


def check_publish_of_pattern_names_and_retry(url: str, monkeypatch) -> None:
    """`mesh[1].stl` is a name, not a pattern (beside `mesh1.stl`), in the previous dataset and the
    new one; and a publish step that failed after moving some entries, run again (as Dataflow
    retries a bundle), publishes the complete dataset from the staging, which it still finds whole.
    (Every object store: test_s3.py runs it too.)"""
    from formats.mixtrain import publish

    fs, output = storage.open_root(url)
    fs.pipe({f"{output}/files/_dataset/robot/mesh[1].stl": b"old", f"{output}/mixtrain.json": b"{}"})
    staging = f"{output}/_staging/run1"
    staged = {"files/_dataset/robot/mesh[1].stl": b"bracket", "files/_dataset/robot/mesh1.stl": b"plain",
              "data/part-00000.parquet": b"new", "stats.json": b"{}"}
    fs.pipe({f"{staging}/{name}": data for name, data in staged.items()})
    fs.invalidate_cache()
    moved = []
    real_move = publish._move

    def failing_move(fs_, source, target):
        if source.endswith("/files"):
            raise OSError("connection reset while copying files/")
        moved.append(source)
        real_move(fs_, source, target)

    monkeypatch.setattr(publish, "_move", failing_move)
    with pytest.raises(OSError):
        publish.publish(fs, staging, output, {"run": 1})
    assert moved == [f"{staging}/data"] and not fs.exists(f"{output}/mixtrain.json")
    monkeypatch.setattr(publish, "_move", real_move)
    fs.invalidate_cache()
    publish.publish(fs, staging, output, {"run": 1})
    fs.invalidate_cache()
    published = {path[len(output) + 1:]: fs.cat_file(path) for path in fs.find(output)}
    assert {name: published[name] for name in staged} == staged
    assert not fs.exists(staging) and json.loads(published["mixtrain.json"]) == {"run": 1}



def test_gs_rlds_in_array_record_converts_as_from_the_local_disk(gcs):
    """array_record opens OS paths only: a gs:// shard is read through fsspec (gcsfs, its credentials)
    into a sparse local file holding the footer and the one episode asked for."""
    from formats.sources.rlds.sample import SyntheticRLDS, write_dataset

    local = gcs / "rlds_ar" / "synthetic_rlds" / "1.0.0"
    write_dataset(str(local), SyntheticRLDS(file_format="array_record", splits={"train": (4, 3, 5)}, shards={"train": 2}))
    src = _upload(local, "gs://bucket/sources/rlds_ar/synthetic_rlds/1.0.0")
    outputs = {"gs": gcs / "rlds_ar_from_gs", "local": gcs / "rlds_ar_from_local"}
    for where, root in (("gs", src), ("local", str(local))):
        assert convert.run([f"--input={root}", f"--output={outputs[where]}", "--fps=10", "--progress=off"]) == 0
    published = {where: {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
                 for where, out in outputs.items()}
    assert sorted(published["gs"]) == sorted(published["local"])
    same = [name for name in published["gs"] if published["gs"][name] == published["local"][name]]
    assert sorted(set(published["gs"]) - set(same)) == ["_fingerprints.json", "mixtrain.json"]  # the input's URL and signatures
    assert sum(name.endswith(".mp4") for name in same) == 6 and "stats.json" in same
    assert json.loads(published["gs"]["mixtrain.json"])["source"]["uri"] == src
