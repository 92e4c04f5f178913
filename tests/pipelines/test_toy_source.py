"""A fifth source added from a test alone (tests/toy_source/): registered here, it converts,
validates and passes the source contract with no other file of the product changed."""

from __future__ import annotations

import pathlib
import subprocess

import numpy as np
import pyarrow.parquet as pq
import pytest

from formats import samples, sources, storage
from pipelines import convert, make_sample
from tests import toy_source
from tests.contract import SourceContract

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def toy():
    toy_source.register()
    yield toy_source
    toy_source.unregister()


class TestToySource(SourceContract):
    @pytest.fixture
    def source_id(self, toy):
        return toy_source.FORMAT


def test_toy_values_arrive_unchanged(toy, tmp_path):
    truth = toy_source.write_dataset(str(tmp_path / "src"), lengths=(4, 6))
    assert convert.run([f"--input={tmp_path / 'src'}", f"--output={tmp_path / 'out'}", "--progress=off"]) == convert.EXIT_OK
    table = pq.read_table(tmp_path / "out/data").sort_by("sequence_id")
    assert table.column("sequence_id").to_pylist() == ["episode_000", "episode_001"]
    for row, arrays in zip(table.to_pylist(), [truth[name] for name in sorted(truth)]):
        assert np.array_equal(np.array(row["obs_state"], np.float32), arrays["state"])
        assert np.array_equal(np.array(row["action"], np.float32), arrays["action"])
        assert row["length"] == len(arrays["timestamp"]) and (tmp_path / "out" / row["video_front"]).is_file()


def test_make_sample_writes_every_registered_sample(toy, tmp_path, capsys):
    assert make_sample.main([str(tmp_path / "toy"), f"--format={toy_source.FORMAT}", "--episodes=3"]) == 0
    assert capsys.readouterr().out.strip() == f"wrote an {toy_source.FORMAT} sample with 3 episodes (18 steps) to {tmp_path / 'toy'}"
    assert sources.detect(*storage.open_root(str(tmp_path / "toy"))) == toy_source.FORMAT


def test_registration_lasts_only_while_registered(toy):
    toy_source.unregister()
    assert toy_source.FORMAT not in sources.SOURCES and toy_source.FORMAT not in samples.SAMPLES
    toy_source.register()


def test_no_product_file_names_the_toy_source():
    found = subprocess.run(["grep", "-rl", toy_source.FORMAT, "formats", "transforms", "pipelines", "setup.py"], cwd=ROOT,
                           capture_output=True, text=True)
    assert found.stdout == ""


def test_the_toy_source_is_accepted_by_name_and_an_unknown_id_lists_it(toy, tmp_path, capsys):
    toy_source.write_dataset(str(tmp_path / "src"), lengths=(4,))
    assert convert.run([f"--input={tmp_path / 'src'}", f"--output={tmp_path / 'out'}", "--progress=off",
                        f"--source={toy_source.FORMAT}"]) == convert.EXIT_OK
    capsys.readouterr()
    assert convert.run([f"--input={tmp_path / 'src'}", f"--output={tmp_path / 'other'}", "--source=nosuch"]) == convert.EXIT_USAGE
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith("error: argument --source: invalid choice: 'nosuch' (choose from 'auto', ")
    assert f"'{toy_source.FORMAT}'" in first and not (tmp_path / "other").exists()


def test_an_option_the_command_line_does_not_have_is_one_line(toy, tmp_path, capsys, monkeypatch):
    from formats.sources import SourceOption

    toy_source.write_dataset(str(tmp_path / "src"), lengths=(4,))
    monkeypatch.setattr(type(sources.get(toy_source.FORMAT)), "options", (SourceOption("scale", "scale", float),))
    assert convert.run([f"--input={tmp_path / 'src'}", f"--output={tmp_path / 'out'}", "--progress=off"]) == convert.EXIT_FAILED
    assert capsys.readouterr().err.splitlines()[0] == (f"error: the {toy_source.FORMAT} source declares --scale, which this command "
                                                        "line does not have (pipelines/cli.py lists every option)")
