"""An Iceberg table whose warehouse is on gs:// (the GCS emulator), committed by the pipeline's
publish step through a catalog named the pyiceberg way (SQL catalog, fsspec FileIO)."""

from __future__ import annotations

import os

import pytest

from formats import storage
from formats.mixtrain.tables import TableSettings, lake
from formats.sources.lerobot_v3.sample import SyntheticLeRobot, write_dataset
from pipelines import convert, validate
from tests import gcs_emulator

pytest.importorskip("pyiceberg")


@pytest.fixture
def gcs(monkeypatch, tmp_path):
    """A GCS emulator on a free loopback port and a pyiceberg catalog `lake` (SQLite on this disk, files on gs://)."""
    with gcs_emulator.running() as url:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", url)
        monkeypatch.setenv("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")  # NOTES.md: no gRPC probes
        for key, value in {"TYPE": "sql", "URI": f"sqlite:///{tmp_path}/catalog.db", "PY_IO_IMPL": "pyiceberg.io.fsspec.FsspecFileIO",
                           "GCS__OAUTH2__TOKEN": "anon"}.items():
            monkeypatch.setenv(f"PYICEBERG_CATALOG__LAKE__{key}", value)
        import fsspec
        import pyiceberg.catalog
        from pyiceberg.utils.config import Config

        # pyiceberg reads PYICEBERG_* once, when first imported (a command line sets them before that;
        # earlier tests in this process imported it already).
        monkeypatch.setattr(pyiceberg.catalog, "_ENV_CONFIG", Config())
        fsspec.filesystem("gs").clear_instance_cache()
        yield tmp_path
    fsspec.filesystem("gs").clear_instance_cache()


def test_an_iceberg_warehouse_on_gcs_takes_two_nights_and_validates(gcs, capsys):
    src = gcs / "src"
    write_dataset(str(src), SyntheticLeRobot(lengths=(5, 4), codec="h264", gop=None, cameras=("observation.images.front",)))
    args = [f"--input={src}", "--output=gs://bucket/lake", "--progress=off", "--table_format=iceberg", "--catalog=lake"]
    assert convert.run(args) == 0
    assert convert.run([*args, "--incremental"]) == 0
    out = capsys.readouterr().out
    assert "Iceberg table default.dataset" in out and "load_catalog('lake')" in out
    settings = TableSettings(format="iceberg", catalog="lake")
    committed = lake.versions("gs://bucket/lake", settings)
    assert len(committed) == 2
    rows = lake.read_rows("gs://bucket/lake", settings).sort_by("sequence_id")
    fs, root = storage.open_root("gs://bucket/lake")
    for path in rows.column("video_front").to_pylist():  # reused rows keep the first night's files
        assert path.startswith(f"runs/{committed[0]['run']}/files/") and fs.exists(f"{root}/{path}")
    assert rows.column("length").to_pylist() == [5, 4]
    assert validate.validate_table(fs, root, "iceberg", settings) == []
    assert not os.path.exists(gcs / "lake")
