"""A lake table whose catalog entry or log is lost or cut (an Iceberg catalog.db emptied or
deleted; a Delta _delta_log deleted, emptied, or with an entry cut) is refused with one line
saying how to recover, and nothing is written: a run never starts a new table over committed
runs, orphaning their snapshots. Following the printed recovery, --incremental continues the history."""

from __future__ import annotations

import io
import pathlib
import re
import shutil

import pytest

from formats.mixtrain.tables import TableSettings, lake
from formats.sources.ortf.sample import SyntheticORTF, write_dataset
from pipelines import conversion

pytest.importorskip("pyiceberg")
pytest.importorskip("deltalake")


def _run(src, dst, table_format: str, *extra: str) -> tuple[int, str]:
    console = io.StringIO()
    code = conversion.run([f"--input={src}", f"--output={dst}", "--progress=off", f"--table_format={table_format}", *extra],
                          out=io.StringIO(), console=console)
    return code, console.getvalue()


def _files(dst: pathlib.Path) -> dict:
    """Every file's bytes but an emptied catalog.db's (opening it lays out pyiceberg's empty tables)."""
    return {p.relative_to(dst).as_posix(): p.read_bytes() for p in sorted(dst.rglob("*")) if p.is_file() and p.name != "catalog.db"}


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    """An ORTF source and a Delta table with two committed runs."""
    root = tmp_path_factory.mktemp("lost")
    src = root / "src"
    write_dataset(str(src), SyntheticORTF(lengths=(5, 4), cameras=("cam_wrist",), depth_format=None, annotations=False,
                                          failed_episodes=()))
    made = {}
    for table_format in ("delta",):
        dst = root / table_format
        assert _run(src, dst, table_format)[0] == 0
        assert _run(src, dst, table_format, "--overwrite")[0] == 0
        made[table_format] = dst
    return src, made


def _newest_log_entry(dst):
    return sorted((dst / "_delta_log").glob("*.json"))[-1]


DAMAGE = {
    ("iceberg", "catalog emptied"): (lambda dst: (dst / "catalog.db").write_bytes(b""), "catalog.db has no Iceberg table"),
    ("iceberg", "catalog deleted"): (lambda dst: (dst / "catalog.db").unlink(), "catalog.db has no Iceberg table"),
    # "²" is a digit to str.isdigit, not to int(): the newest-metadata pick raised ValueError
    ("iceberg", "catalog deleted, a stray metadata file"): (
        lambda dst: ((dst / "catalog.db").unlink(), (dst / "metadata" / "\u00b2-x.metadata.json").write_text("{}")),
        "catalog.db has no Iceberg table"),
    ("delta", "log deleted"): (lambda dst: shutil.rmtree(dst / "_delta_log"), "_delta_log: not found, but 2 committed run(s)"),
    ("delta", "log emptied"): (lambda dst: [p.unlink() for p in (dst / "_delta_log").iterdir()], "_delta_log: the Delta log cannot"),
    ("delta", "first entry deleted"): (lambda dst: sorted((dst / "_delta_log").glob("*.json"))[0].unlink(),
                                       "_delta_log: the Delta log cannot"),
    ("delta", "newest entry emptied"): (lambda dst: _newest_log_entry(dst).write_bytes(b""), ".json is cut: 0 bytes)"),
    ("delta", "newest entry cut"): (lambda dst: _newest_log_entry(dst).write_bytes(_newest_log_entry(dst).read_bytes()[:90]),
                                    ".json is cut: 90 bytes)"),
}


@pytest.mark.parametrize("table_format, damage", sorted(DAMAGE), ids=[f"{f}-{d}" for f, d in sorted(DAMAGE)])
def test_a_lost_or_cut_catalog_or_log_is_refused_not_started_over(tmp_path, tables, table_format, damage):
    src, made = tables
    dst = tmp_path / "out"
    if table_format == "iceberg":  # its metadata names absolute paths: a table of its own, not a copy
        assert _run(src, dst, table_format)[0] == 0 and _run(src, dst, table_format, "--overwrite")[0] == 0
    else:
        shutil.copytree(made[table_format], dst)
    damaged, expected = DAMAGE[(table_format, damage)]
    damaged(dst)
    before = _files(dst)
    for extra in ("--incremental", "--overwrite"):
        code, console = _run(src, dst, table_format, extra)
        line = console.splitlines()[0]
        assert code == 1 and line.startswith("error: ") and expected in line, console
        assert "Traceback" not in console and _files(dst) == before  # nothing written
    if table_format == "iceberg":  # the printed recovery works, and the history goes on
        metadata = re.search(r"register_table\('default.dataset', '([^']+)'\)", line).group(1)
        _register(dst, metadata)
        assert _run(src, dst, table_format, "--incremental")[0] == 0
        history = lake.versions(str(dst), TableSettings(format="iceberg"))
        assert len(history) == 3 and len({entry["run"] for entry in history}) == 3


def _register(dst: pathlib.Path, metadata) -> None:
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("mixtrain", uri=f"sqlite:///{dst}/catalog.db", warehouse=f"file://{dst}")
    catalog.create_namespace_if_not_exists("default")
    catalog.register_table("default.dataset", str(metadata))
