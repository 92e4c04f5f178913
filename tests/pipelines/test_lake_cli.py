"""--table_format on the command line: listed, strictly parsed, refused where it cannot be faithful."""

from __future__ import annotations

import pytest

from formats.mixtrain import tables
from pipelines import cli


def test_table_format_is_an_option_with_the_standalone_layout_by_default():
    args, _ = cli.parse(["--input=a", "--output=b"])
    assert args.table_format == "parquet" == tables.DEFAULT
    help_text = cli.build_parser().format_help()
    assert "--table_format" in help_text and "{parquet,iceberg,delta,ducklake,lance}" in help_text


def test_ducklake_is_refused_with_the_reason():
    with pytest.raises(cli.UsageError) as raised:
        cli.parse(["--input=a", "--output=b", "--table_format=ducklake"])
    assert str(raised.value) == ("--table_format=ducklake is not supported: DuckLake tables have no custom table property (only a "
                                 "COMMENT), so the `mixtrain` metadata cannot be stored as the spec requires; use "
                                 "--table_format=iceberg or delta")


def test_every_accepted_table_format_has_a_publisher():
    accepted = set(cli.TABLE_FORMATS) - set(cli.REFUSED_TABLE_FORMATS)
    assert "parquet" in tables.names()
    for name in sorted(accepted & set(tables.names())):
        assert callable(tables.publisher_for(name))
    with pytest.raises(KeyError, match="unknown table format 'nope'"):
        tables.publisher_for("nope")


def test_a_registered_publisher_is_called_with_the_staging_output_sidecar_and_settings():
    calls = []
    tables.register("recording", lambda fs, staging, output, sidecar, settings: calls.append((staging, output, sidecar, settings)))
    try:
        settings = tables.TableSettings(format="recording", run_id="r1", incremental=True)
        tables.publish(None, "/s", "/o", {"mixtrain": "1.0"}, settings)
    finally:
        del tables._REGISTRY["recording"]
    assert calls == [("/s", "/o", {"mixtrain": "1.0"}, settings)]


def test_catalog_options_without_iceberg_and_the_embedded_catalog_on_an_object_store_are_refused(capsys):
    from pipelines import convert

    assert convert.run(["--input=a", "--output=b", "--catalog=sqlite:////tmp/c.db"]) == cli.EXIT_USAGE
    assert capsys.readouterr().err.splitlines()[0] == ("error: --catalog has no effect with --table_format=parquet (it names an "
                                                       "Iceberg catalog or table)")
    assert convert.run(["--input=/nonexistent", "--output=memory://lake", "--table_format=iceberg"]) == cli.EXIT_USAGE
    assert capsys.readouterr().err.splitlines()[0].startswith("error: --output=memory://lake: the embedded Iceberg catalog is an "
                                                              "SQLite file")
