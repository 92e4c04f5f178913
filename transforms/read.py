"""ReadSequences: EpisodeRefs planned on the launcher -> Sequences loaded on the workers."""

from __future__ import annotations

import apache_beam as beam

from formats import sources, storage
from formats.sequence import DatasetMeta

__all__ = ["ReadSequences"]


class _LoadSequenceFn(beam.DoFn):
    """Loads one sequence per ref; the filesystem is opened once per worker in setup()."""

    def __init__(self, source: str, root_url: str, meta: DatasetMeta):
        self._source = source
        self._root_url = root_url
        self._meta = meta

    def setup(self):
        self._module = sources.get(self._source)
        self._fs, self._root = storage.open_root(self._root_url)

    def process(self, ref):
        yield self._module.load(self._fs, self._root, ref, self._meta)


class _ExpandRefFn(beam.DoFn):
    """Sources whose planned units hold many sequences (RLDS shards) index them on a worker."""

    def __init__(self, source: str, root_url: str, meta: DatasetMeta):
        self._source = source
        self._root_url = root_url
        self._meta = meta

    def setup(self):
        self._module = sources.get(self._source)
        self._fs, self._root = storage.open_root(self._root_url)

    def process(self, ref):
        yield from self._module.expand_ref(self._fs, self._root, ref, self._meta)


class ReadSequences(beam.PTransform):
    """Create the refs, spread them over workers, load each sequence.

    Only the small refs cross the Reshuffle; sequence data is produced after it. A source with
    `expand_ref` (RLDS: a shard -> its records) gets a second fan-out on the workers.

    Args:
      source: format id (`formats.sources.SOURCES`).
      root_url: the dataset root as a URL (`storage.url_for`).
      meta: the DatasetMeta from the source's `plan`.
      refs: the EpisodeRefs from the source's `plan`.
    """

    def __init__(self, source: str, root_url: str, meta: DatasetMeta, refs: list):
        super().__init__()
        self._source = source
        self._root_url = root_url
        self._meta = meta
        self._refs = refs

    def expand(self, pbegin):
        refs = pbegin | "CreateRefs" >> beam.Create(self._refs, reshuffle=False) | "SpreadRefs" >> beam.Reshuffle()
        if hasattr(sources.get(self._source), "expand_ref"):
            refs = (
                refs
                | "ExpandRefs" >> beam.ParDo(_ExpandRefFn(self._source, self._root_url, self._meta))
                | "SpreadExpandedRefs" >> beam.Reshuffle()
            )
        return refs | "LoadSequences" >> beam.ParDo(_LoadSequenceFn(self._source, self._root_url, self._meta))
