"""The source contract (formats/sources/__init__.py), tested once for every source, zarr-python's StoreTests way:
a test class subclasses `SourceContract` and provides the `source_id` fixture (the built-in
sources: tests/formats/test_sources.py; a source registered from a test: tests/pipelines/test_toy_source.py).
Each source's input is its registered sample (formats/samples), converted with its `convert_args`.
"""

from __future__ import annotations

import dataclasses
import json
import pickle

import numpy as np
import pytest

from formats import mixtrain, samples, sources, storage
from formats.sequence import FILE, VIDEO, ImageFrames, VideoSegment, base_columns
from formats.sources import SourceRef
from pipelines import cli, convert, validate
from pipelines.plan import source_options


class SourceContract:
    """What every registered source must do; subclasses set the `source_id` fixture."""

    @pytest.fixture
    def source_id(self) -> str:
        raise NotImplementedError("a contract test class provides the source_id fixture")

    @pytest.fixture
    def dataset(self, source_id, tmp_path):
        path = tmp_path / "src"
        samples.get(source_id).small(str(path))
        return path

    @pytest.fixture
    def planned(self, source_id, dataset):
        """(source, fs, root, meta, planned refs, expanded refs, reader) with the sample's options."""
        source = sources.get(source_id)
        args, _ = cli.parse([f"--input={dataset}", "--output=unused", *samples.get(source_id).convert_args])
        fs, root = storage.open_root(str(dataset))
        meta, refs = source.plan(fs, root, source_options(source, args))
        reader = source.open(fs, root, meta)
        expanded = [record for ref in refs for record in reader.expand(ref)]
        return source, fs, root, meta, refs, expanded, reader

    def test_detect_picks_this_source_alone(self, source_id, dataset):
        fs, root = storage.open_root(str(dataset))
        assert sources.detect(fs, root) == source_id

    def test_plan_describes_the_output_and_publishes_only_json(self, source_id, planned):
        source, fs, root, meta, refs, expanded, _ = planned
        assert meta.format == source_id == meta.source["format"]
        assert [spec.name for spec in meta.columns[:4]] == [spec.name for spec in base_columns()]
        assert len({spec.name for spec in meta.columns}) == len(meta.columns)
        def published(of):
            return json.loads(json.dumps(mixtrain.sidecar(of, num_sequences=0, num_timesteps=0, num_shards=1, converter_version="x",
                                                          options={}, created_at="now")))
        # Planning data for the reader stays private: the sidecar is the same without it.
        assert published(meta) == published(dataclasses.replace(meta, private={}))
        assert not set(meta.private) & set(published(meta)["source"])

    def test_a_reader_opened_from_pickled_plan_data_loads_the_same_sequences(self, planned):
        """What Dataflow does: the source and its plan travel pickled to another process."""
        source, fs, root, meta, refs, expanded, reader = planned
        copied_source, copied_meta = pickle.loads(pickle.dumps((source, meta)))
        copied = copied_source.open(*storage.open_root(storage.url_for(fs, root)), copied_meta)
        first = expanded[0]
        mine, theirs = reader.load(first), copied.load(pickle.loads(pickle.dumps(first)))
        assert theirs.sequence_id == mine.sequence_id and theirs.length == mine.length
        for name, values in mine.trajectories.items():
            assert np.array_equal(np.asarray(theirs.trajectories[name]), np.asarray(values), equal_nan=True), name

    def test_refs_are_small_picklable_and_relative_to_the_root(self, dataset, planned):
        source, fs, root, meta, refs, expanded, _ = planned
        assert refs and all(isinstance(ref, SourceRef) for ref in refs + expanded)
        for ref in refs + expanded:
            assert pickle.loads(pickle.dumps(ref)) == ref
            leaked = [text for text in _strings(ref, []) if str(dataset) in text or text.startswith("/")]
            assert leaked == []  # workers get the root as a URL and paths relative to it
            assert all(fs.exists(storage.join(root, path)) for path in ref.unit_files if path)
        assert meta.uri.startswith("file://")

    def test_reader_loads_every_planned_sequence_as_planned(self, planned):
        source, fs, root, meta, refs, expanded, reader = planned
        count = sources.sequence_count(refs)
        assert count is None or count == len(expanded)
        loaded = [reader.load(ref) for ref in expanded]
        assert [sequence.sequence_id for sequence in loaded] == [ref.sequence_id for ref in expanded]
        assert len({sequence.sequence_id for sequence in loaded}) == len(loaded)
        for ref, sequence in zip(expanded, loaded):
            if ref.estimated_steps is not None:
                assert sequence.length == ref.estimated_steps
            assert len(sequence.timestamp) == sequence.length and sequence.timestamp[0] == 0.0
        media = [spec.name for spec in meta.columns if spec.kind in (VIDEO, FILE)]  # written by the video/copy step
        for sequence in loaded:
            assert all(isinstance(sequence.videos[name], (VideoSegment, ImageFrames)) for name in media if name in sequence.videos)
            assert set(sequence.videos) <= set(media) and set(sequence.files) <= set(media)
        table = mixtrain.sequences_to_table(loaded, [spec for spec in meta.columns if spec.name not in media])
        assert table.num_rows == len(loaded)  # every other value fits the planned schema

    def test_every_sequence_belongs_to_exactly_one_incremental_unit(self, planned):
        source, fs, root, meta, refs, expanded, reader = planned
        units, shared = source.incremental_units(refs)
        assert len({unit.key for unit, _ in units}) == len(units) == len(refs)
        for ref in expanded:
            assert sum(unit.owns(ref.sequence_id) for unit, _ in units) == 1

    def test_converts_validates_and_reruns_incrementally(self, source_id, dataset, tmp_path):
        extra = list(samples.get(source_id).convert_args)
        dst = tmp_path / "out"
        assert convert.run([f"--input={dataset}", f"--output={dst}", "--progress=off", *extra]) == convert.EXIT_OK
        assert validate.validate(str(dst)) == []
        findings, _ = validate.deep_check(str(dst))
        assert findings == []
        sidecar = json.loads((dst / "mixtrain.json").read_text())
        assert sidecar["source"]["format"] == source_id and sidecar["num_sequences"] > 0
        assert convert.run([f"--input={dataset}", f"--output={dst}", "--progress=off", "--incremental", *extra]) == convert.EXIT_OK
        again = json.loads((dst / "mixtrain.json").read_text())
        assert again["incremental"]["converted_units"] == 0
        assert again["incremental"]["reused_sequences"] == again["num_sequences"] == sidecar["num_sequences"]


def _strings(value, found: list) -> list:
    if isinstance(value, str):
        found.append(value)
    elif dataclasses.is_dataclass(value):
        for field in dataclasses.fields(value):
            _strings(getattr(value, field.name), found)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _strings(item, found)
    return found
