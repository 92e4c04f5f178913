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


def test_a_plugin_clashing_with_a_built_in_id_never_leaves_a_partial_registry():
    """Registered before the built-ins load, a plugin using a built-in's id makes every use of the
    registry fail the same way (not a table missing the formats after it), and `registered` puts
    back what it replaced."""
    import subprocess
    import sys

    script = ("from formats import sources\nclass Fake(sources.Source):\n    id = 'ortf'\nsources.register(Fake())\n"
              "for _ in range(2):\n    try:\n        sorted(sources.SOURCES)\n        print('loaded')\n"
              "    except ValueError as error:\n        print(error)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.stdout.splitlines() == ["source id 'ortf' is already registered by Fake"] * 2, done.stderr
    original = sources.get("lerobot_v3")
    replacement = type(original)()
    with sources.registered(replacement):
        assert sources.get("lerobot_v3") is replacement
    assert sources.get("lerobot_v3") is original  # was: removed, the built-in gone for the rest of the process
