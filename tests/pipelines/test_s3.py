"""s3:// end to end against a real S3 API on loopback (moto's server mode), reached the way a user
reaches MinIO or Ceph: the standard AWS variables (AWS_ENDPOINT_URL, keys, region) and nothing else.
Every source converts s3:// -> s3:// to the same bytes as on the local disk; the three lake table
formats commit and read back there; an unreachable store, a missing bucket or missing credentials
is one `error:` line."""

from __future__ import annotations

import io
import json
import socket

import numpy as np
import pytest

from formats import samples, storage
from formats.mixtrain.tables import TableSettings, lake
from pipelines import conversion, validate
from tests import s3_server
from tests.pipelines import test_gcs


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """The S3 server on a free loopback port, the AWS variables pointing at it (restored after)."""
    with s3_server.serving_this_process():
        yield tmp_path_factory.mktemp("s3_local")


def _run(*argv: str) -> tuple[int, str, str]:
    out, console = io.StringIO(), io.StringIO()
    code = conversion.run([*argv, "--progress=off"], out=out, console=console)
    return code, out.getvalue(), console.getvalue()


def _upload(local, url: str) -> str:
    fs, root = storage.open_root(url)
    fs.put(str(local), root, recursive=True)
    return url


def _files(url: str) -> dict[str, bytes]:
    fs, root = storage.open_root(url)
    return {path[len(root) + 1:]: fs.cat_file(path) for path in sorted(fs.find(root))}


def _comparable(sidecar: bytes) -> dict:
    """mixtrain.json without what names the run (its time) or the paths it was given."""
    value = json.loads(sidecar)
    value.pop("created_at")
    value["source"].pop("uri")
    return value


def _local_files(root) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("source", sorted(samples.SAMPLES))
def test_s3_to_s3_gives_the_bytes_of_the_local_conversion(s3, source):
    """s3:// -> s3:// against the same input converted to this disk: every file the same bytes
    (shards, stats.json, videos, _fingerprints.json; mixtrain.json but its time); and the local
    copy of the input converted locally gives the same dataset but _fingerprints.json, which
    records each input file's signature on its own store (an S3 ETag, a local mtime)."""
    sample = samples.get(source)
    local = s3 / source
    sample.small(str(local / "src"))
    src = _upload(local / "src", f"s3://bucket/sources/{source}")
    dst = f"s3://bucket/mixtrain/{source}"
    for args in ((src, dst), (src, local / "from_s3"), (local / "src", local / "dst")):
        code, _, console = _run(f"--input={args[0]}", f"--output={args[1]}", "--num_shards=2", *sample.convert_args)
        assert code == 0, console
    remote, from_s3, local_only = _files(dst), _local_files(local / "from_s3"), _local_files(local / "dst")
    assert remote.keys() == from_s3.keys() == local_only.keys()
    assert {"stats.json", "_fingerprints.json", "data/part-00000.parquet", "data/part-00001.parquet"} <= remote.keys()
    assert any(name.startswith("files/") for name in remote) or source == "l5kit"  # videos compared too
    sidecar = _comparable(remote.pop("mixtrain.json"))
    assert sidecar == _comparable(from_s3.pop("mixtrain.json")) == _comparable(local_only.pop("mixtrain.json"))
    assert [name for name in remote if remote[name] != from_s3[name]] == []  # shards, stats.json, videos, _fingerprints.json
    assert [name for name in remote if remote[name] != local_only[name]] == ["_fingerprints.json"]
    assert validate.validate(dst) == []
    findings, summary = validate.deep_check(dst, src)  # the source named: mixtrain.json's s3:// URI is not followed by itself
    assert findings == [] and not [line for line in summary if "not fetched" in line or "not reachable" in line], summary


def test_s3_output_needs_overwrite_and_an_incremental_rerun_reuses_everything(s3):
    samples.get("ortf").small(str(s3 / "nightly"))
    src = _upload(s3 / "nightly", "s3://bucket/sources/nightly")
    dst = "s3://bucket/mixtrain/nightly"
    assert _run(f"--input={src}", f"--output={dst}")[0] == 0
    code, _, console = _run(f"--input={src}", f"--output={dst}")
    assert (code, console) == (1, "error: bucket/mixtrain/nightly: output already holds a Mixtrain dataset; pass --overwrite to "
                                  "replace it, or --incremental to convert only what changed\n")
    assert _run(f"--input={src}", f"--output={dst}", "--incremental")[0] == 0
    fs, root = storage.open_root(dst)
    sidecar = json.loads(fs.cat_file(f"{root}/mixtrain.json"))
    assert sidecar["incremental"]["reused_sequences"] == 3 and sidecar["incremental"]["converted_units"] == 0
    assert sorted(fs.ls(root, detail=False)) == [f"{root}/{name}" for name in
                                                 ("_errors.jsonl", "_fingerprints.json", "_quality.jsonl", "data", "files", "mixtrain.json",
                                                  "stats.json")]
    assert validate.validate(dst) == []


def test_s3_publish_moves_every_object_in_windows_and_replaces_the_previous_dataset(s3, monkeypatch):
    test_gcs.check_publish_in_windows("s3://bucket/mixtrain/windows", monkeypatch)


def test_s3_publish_keeps_names_with_pattern_characters_and_can_be_retried(s3, monkeypatch):
    test_gcs.check_publish_of_pattern_names_and_retry("s3://bucket/mixtrain/patterns", monkeypatch)


def test_the_reader_and_inspect_on_s3_give_what_they_give_locally(s3, capsys):
    from formats.read import reader
    from formats.sources.lerobot_v3.sample import SyntheticLeRobot, write_dataset
    from pipelines import inspect

    write_dataset(str(s3 / "reader_src"), SyntheticLeRobot(lengths=(12, 9, 15), codec="h264", gop=None, episodes_per_video_file=2))
    assert _run(f"--input={s3 / 'reader_src'}", f"--output={s3 / 'reader_dst'}")[0] == 0
    url = _upload(s3 / "reader_dst", "s3://bucket/reader/lerobot")
    remote, local = reader.open_dataset(url), reader.open_dataset(str(s3 / "reader_dst"))
    assert remote.sequence_ids() == local.sequence_ids() and len(local.sequence_ids()) == 3
    sequence_id = local.sequence_ids()[1]
    got, expected = remote.sequence(sequence_id), local.sequence(sequence_id)
    assert got["action"].tobytes() == expected["action"].tobytes() and got["timestamp"].tobytes() == expected["timestamp"].tobytes()
    frames = remote.frames(sequence_id, "video_wrist", 2, 7)
    assert frames.shape == (5, 48, 64, 3) and np.array_equal(frames, local.frames(sequence_id, "video_wrist", 2, 7))
    assert remote.video_url(sequence_id, "video_wrist") == f"{url}/files/video_wrist/{sequence_id}.mp4"
    assert remote.stats() == local.stats()
    capsys.readouterr()
    assert inspect.main([url]) == 0
    remote_summary = capsys.readouterr().out
    assert inspect.main([str(s3 / "reader_dst")]) == 0
    local_summary = capsys.readouterr().out
    assert "sequences   3\n" in remote_summary and remote_summary.replace(url, "DST") == local_summary.replace(f"file://{s3 / 'reader_dst'}", "DST")


@pytest.fixture
def iceberg_catalog(s3, monkeypatch):
    """A pyiceberg catalog `lake` (SQLite on this disk) as a user names one; its files go to s3://
    through pyiceberg's default FileIO, told nothing of the endpoint but by the AWS variables."""
    pytest.importorskip("pyiceberg")
    import pyiceberg.catalog
    from pyiceberg.utils.config import Config

    monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__TYPE", "sql")
    monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__URI", f"sqlite:///{s3}/catalog.db")
    monkeypatch.setattr(pyiceberg.catalog, "_ENV_CONFIG", Config())  # read once, at first import (test_lake_gcs.py)
    return "lake"


@pytest.mark.parametrize("table_format", ["delta", "lance", "iceberg"])
def test_a_lake_table_on_s3_takes_two_runs_and_reads_back(s3, request, table_format):
    from formats.read import reader
    from formats.sources.lerobot_v3.sample import SyntheticLeRobot, write_dataset

    pytest.importorskip({"delta": "deltalake", "lance": "lance", "iceberg": "pyiceberg"}[table_format])
    catalog = request.getfixturevalue("iceberg_catalog") if table_format == "iceberg" else ""
    src = s3 / f"lake_{table_format}"
    write_dataset(str(src), SyntheticLeRobot(lengths=(5, 4), codec="h264", gop=None, cameras=("observation.images.front",)))
    dst = f"s3://bucket/lake/{table_format}"
    args = [f"--input={src}", f"--output={dst}", f"--table_format={table_format}", *([f"--catalog={catalog}"] if catalog else [])]
    first = _run(*args)
    assert first[0] == 0, first[2]
    second = _run(*args, "--incremental")
    assert second[0] == 0, second[2]
    assert "2 unchanged sequences reused" in second[1].strip().splitlines()[-1]
    fs, root = storage.open_root(dst)
    if table_format == "lance":
        dataset = reader.open_dataset(dst)
        assert dataset.version == 2 and dataset.sequence_ids() == ["episode_000000", "episode_000001"]
        assert [dataset.sequence(i)["length"] for i in dataset.sequence_ids()] == [5, 4]
        assert validate.validate(dst) == []
        return
    settings = TableSettings(format=table_format, catalog=catalog)
    committed = lake.versions(dst, settings)
    assert len(committed) == 2
    rows = lake.read_rows(dst, settings).sort_by("sequence_id")
    assert rows.column("length").to_pylist() == [5, 4]
    for path in rows.column("video_front").to_pylist():  # reused rows keep the first run's files
        assert path.startswith(f"runs/{committed[0]['run']}/files/") and fs.exists(f"{root}/{path}")
    assert validate.validate_table(fs, root, table_format, settings) == []
    if table_format == "delta":
        assert "storage_options={'aws_endpoint': 'http://127.0.0.1:" in second[1]  # how to open it, endpoint included


def _error(*argv: str) -> str:
    code, out, console = _run(*argv)
    assert code == 1 and out == "" and console.count("\n") == 1, console
    return console


ADVICE = ("the endpoint (AWS_ENDPOINT_URL for MinIO or Ceph) and the credentials (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
          "or AWS_PROFILE)")


def test_a_missing_bucket_is_one_line_before_any_work(s3):
    local = s3 / "bucketless"
    samples.get("ortf").small(str(local))
    assert _error(f"--input={local}", "--output=s3://nobucket/out") == (
        f"error: s3://nobucket/out: the bucket nobucket does not exist, or these credentials cannot see it; check the URL and {ADVICE}\n")
    assert _error("--input=s3://nobucket/ds", f"--output={s3 / 'never'}").startswith("error: s3://nobucket/ds: the bucket nobucket ")
    assert _error("--input=s3://bucket/no/such/ds", f"--output={s3 / 'never'}") == "error: s3://bucket/no/such/ds: input not found\n"
    assert not (s3 / "never").exists()


def test_missing_credentials_are_one_line(s3, monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    s3_server.clear_clients()
    try:
        assert _error("--input=s3://bucket/sources/x", f"--output={s3 / 'never'}") == (
            f"error: s3://bucket/sources/x: cannot reach the store (Unable to locate credentials); check the network, the URL and "
            f"{ADVICE}\n")
    finally:
        s3_server.clear_clients()


@pytest.fixture
def dead_endpoint(s3, monkeypatch):
    """AWS_ENDPOINT_URL on a loopback port nobody answers, and a 1 s deadline to reach it."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{dead}")
    monkeypatch.setattr(storage, "REACH_SECONDS", 1.0)
    s3_server.clear_clients()
    yield
    s3_server.clear_clients()


def test_an_endpoint_nobody_answers_is_one_line_at_the_deadline(s3, dead_endpoint):
    assert _error("--input=s3://bucket/sources/x", f"--output={s3 / 'never'}") == (
        "error: s3://bucket/sources/x: the store did not answer in 1 s; check the network (a proxy or a firewall) and "
        f"{ADVICE}, then retry\n")


def test_the_lake_libraries_get_the_endpoint_of_the_s3_specific_variable(s3, monkeypatch):
    """AWS_ENDPOINT_URL_S3 wins over AWS_ENDPOINT_URL (botocore's order); an http:// endpoint is allowed explicitly."""
    from formats.mixtrain.tables import iceberg

    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://minio.lab:9000")
    assert storage.object_store_options("s3://bucket/t") == {"aws_endpoint": "http://minio.lab:9000", "aws_allow_http": "true",
                                                               "aws_region": "us-east-1"}
    assert iceberg.store_properties("s3://bucket/t") == {"s3.endpoint": "http://minio.lab:9000", "s3.region": "us-east-1"}
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "https://ceph.lab")
    assert storage.object_store_options("s3://bucket/t") == {"aws_endpoint": "https://ceph.lab", "aws_region": "us-east-1"}
    assert storage.object_store_options("gs://bucket/t") == {} == iceberg.store_properties("gs://bucket/t")



def test_a_dask_cluster_converts_s3_to_s3_to_the_local_runners_bytes(s3):
    """The cluster way (docs/dask.md's Kubernetes example): s3:// in and out through a two-process
    LocalCluster, whose workers reach the store by the same AWS variables; every file the bytes of
    the local runner's conversion of the same input (mixtrain.json but its time)."""
    distributed = pytest.importorskip("dask.distributed", reason="the DaskRunner needs dask[distributed] (the dask extra)")
    samples.get("lerobot_v3").small(str(s3 / "dask_src"))
    src = _upload(s3 / "dask_src", "s3://bucket/sources/dask")
    local_dst, cluster_dst = "s3://bucket/mixtrain/dask_local", "s3://bucket/mixtrain/dask_cluster"
    assert _run(f"--input={src}", f"--output={local_dst}", "--num_shards=2")[0] == 0
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, host="127.0.0.1",
                                  worker_dashboard_address=None) as cluster:
        code, _, console = _run(f"--input={src}", f"--output={cluster_dst}", "--num_shards=2", "--runner=DaskRunner",
                                f"--dask_client_address={cluster.scheduler_address}")
    assert code == 0, console
    local, remote = _files(local_dst), _files(cluster_dst)
    assert local.keys() == remote.keys() and any(name.startswith("files/") for name in local)
    sidecars = [json.loads(files.pop("mixtrain.json")) for files in (local, remote)]
    for sidecar in sidecars:
        sidecar.pop("created_at")
    assert sidecars[0] == sidecars[1]
    assert [name for name in local if local[name] != remote[name]] == []  # shards, stats.json, videos, _fingerprints.json


@pytest.mark.parametrize("command", ["validate", "inspect"])
def test_validate_and_inspect_say_an_unreachable_store_in_one_line(s3, dead_endpoint, capsys, command):
    """They printed 134 lines and 3 tracebacks (EndpointConnectionError) where convert printed one."""
    from pipelines import inspect

    main = validate.main if command == "validate" else inspect.main
    assert main(["s3://bucket/mixtrain/x"]) == 1
    assert capsys.readouterr().err == ("error: s3://bucket/mixtrain/x: the store did not answer in 1 s; check the network (a proxy "
                                       f"or a firewall) and {ADVICE}, then retry\n")


def test_rlds_in_arrayrecord_shards_reads_from_s3_as_from_the_disk(s3):
    """s3fs takes a positional third argument of cat_file as a VersionId: the ArrayRecord reader's
    ranged reads failed with ParamValidationError on s3:// (every source on every store it documents)."""
    from formats.sources.rlds.sample import SyntheticRLDS
    from formats.sources.rlds.sample import write_dataset as write_rlds

    local = s3 / "arrayrecord" / "synthetic_rlds" / "1.0.0"
    write_rlds(str(local), SyntheticRLDS(file_format="array_record", splits={"train": (3, 4, 5)}, shards={"train": 2}))
    src = _upload(local, "s3://bucket/sources/arrayrecord")
    code, _, err = _run(f"--input={src}", "--output=s3://bucket/mixtrain/arrayrecord", "--fps=10", "--num_shards=2")
    assert code == 0, err
    code, _, err = _run(f"--input={local}", f"--output={s3 / 'arrayrecord-local'}", "--fps=10", "--num_shards=2")
    assert code == 0, err
    got, here = _files("s3://bucket/mixtrain/arrayrecord"), _local_files(s3 / "arrayrecord-local")
    assert _comparable(got.pop("mixtrain.json")) == _comparable(here.pop("mixtrain.json"))
    assert {k: v for k, v in got.items() if k != "_fingerprints.json"} == {k: v for k, v in here.items() if k != "_fingerprints.json"}
