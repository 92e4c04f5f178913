"""The source contract (tests/contract.py) for every built-in source, and the registry itself."""

from __future__ import annotations

import pytest

from formats import samples, sources
from formats.sources import Source
from pipelines import cli
from tests.contract import SourceContract


class TestBuiltinSources(SourceContract):
    @pytest.fixture(params=sorted(sources.SOURCES))
    def source_id(self, request):
        return request.param


def test_every_source_has_a_sample_and_declares_its_options_as_the_command_line_lists_them():
    assert set(samples.SAMPLES) == set(sources.SOURCES)
    declared = {option.flag: source.id for source in sources.SOURCES.values() for option in source.options}
    assert declared == cli.SOURCE_OPTIONS  # cli.py lists them without importing the formats (fast --help)
    assert all(isinstance(source, Source) and source.id == name for name, source in sources.SOURCES.items())


def test_a_source_id_cannot_be_taken_twice():
    class Impostor(Source):
        id = "lerobot_v3"

    with pytest.raises(ValueError, match="already registered by LeRobotV3"):
        sources.register(Impostor())
    assert type(sources.get("lerobot_v3")).__name__ == "LeRobotV3"
