"""ReadSequences: EpisodeRefs planned on the launcher -> Sequences loaded on the workers."""

from __future__ import annotations

import apache_beam as beam

from formats import storage
from formats.errors import ConversionError
from formats.sequence import DatasetMeta
from formats.source import Source
from transforms.errors import ERRORS, FAIL, skip_or_raise

__all__ = ["ReadSequences"]


class _SourceFn(beam.DoFn):
    """A DoFn over source refs: the source's reader is opened once per worker."""

    def __init__(self, source: Source, root_url: str, meta: DatasetMeta, on_error: str = FAIL):
        self._source = source
        self._root_url = root_url
        self._meta = meta
        self._on_error = on_error

    def setup(self):
        fs, root = storage.open_root(self._root_url)
        self._reader = self._source.open(fs, root, self._meta)  # once per worker: it keeps its caches


class _LoadSequenceFn(_SourceFn):
    """Loads one sequence per ref."""

    def process(self, ref):
        try:
            yield self._reader.load(ref)
        except ConversionError as error:
            yield skip_or_raise(error, self._on_error, ref.sequence_id, "load")


class _ExpandRefFn(_SourceFn):
    """Sources whose planned units hold many sequences (`Source.expands_refs`) index them on a worker."""

    def process(self, ref):
        try:
            yield from list(self._reader.expand(ref))
        except ConversionError as error:  # a unit that cannot be indexed: all its sequences, as many as planned (None: unknown)
            yield skip_or_raise(error, self._on_error, None, "index", ref.sequence_count)


class ReadSequences(beam.PTransform):
    """Create the refs, spread them over workers, load each sequence.

    Only the small refs cross the Reshuffle; sequence data is produced after it. A source with
    `expands_refs` (a unit of many sequences -> its refs) gets a second fan-out on the workers. Returns
    {"sequences": PCollection, "errors": [PCollections of error records]} (records only under
    on_error=skip; under fail the first bad sequence stops the run).

    Args:
      source: the Source (`formats.sources.get`); pickled to the workers, so a source
        registered only on the launcher works too.
      root_url: the dataset root as a URL (`storage.url_for`).
      meta: the DatasetMeta from the source's `plan`.
      refs: the EpisodeRefs from the source's `plan`.
    """

    def __init__(self, source: Source, root_url: str, meta: DatasetMeta, refs: list, on_error: str = FAIL):
        super().__init__()
        self._source = source
        self._root_url = root_url
        self._meta = meta
        self._refs = refs
        self._on_error = on_error

    def expand(self, pbegin):
        refs = pbegin | "CreateRefs" >> beam.Create(self._refs, reshuffle=False) | "SpreadRefs" >> beam.Reshuffle()
        errors = []
        if self._source.expands_refs:
            expanded = refs | "ExpandRefs" >> beam.ParDo(
                _ExpandRefFn(self._source, self._root_url, self._meta, self._on_error)).with_outputs(ERRORS, main="refs")
            refs = expanded.refs | "SpreadExpandedRefs" >> beam.Reshuffle()
            errors.append(expanded[ERRORS])
        loaded = refs | "LoadSequences" >> beam.ParDo(
            _LoadSequenceFn(self._source, self._root_url, self._meta, self._on_error)).with_outputs(ERRORS, main="sequences")
        errors.append(loaded[ERRORS])
        return {"sequences": loaded.sequences, ERRORS: errors}
