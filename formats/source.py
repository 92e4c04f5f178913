"""The source contract: what a format module gives the rest of the product, and nothing more.

Generic code (pipelines/, transforms/, validate) only ever talks to a `Source` object, its
`SourceReader` and the `SourceRef`s it planned; it never names a format. A format is one module
that subclasses these three and calls `formats.sources.register(TheSource())` at import.

    Source                      on the launcher (and in `validate`)
      id                        the --source name and mixtrain.json source.format
      expects                   what detect looks for, said when no format matches
      options                   its own command-line options (`SourceOption`s)
      expands_refs              whether the reader fans a planned ref out (RLDS: shard -> records)
      detect(fs, root)          bool: is root a dataset of this format (cheap: metadata only)
      plan(fs, root, options)   (DatasetMeta, [SourceRef]) from metadata only
      open(fs, root, meta)      a SourceReader (default: its `reader` class): once per worker, owns its caches
      incremental_units(refs)   ([(fingerprint.Unit, ref)], shared files) for --incremental

    SourceReader                on a worker, opened once (`transforms/read.py` setup)
      expand(ref)               the refs a planned ref holds (default: the ref itself)
      load(ref)                 one Sequence

    SourceRef                   small, picklable, frozen: one planned unit of work
      sequence_id               str, or None while the ref stands for several (an RLDS shard)
      sequence_count            sequences it holds (1; None: unknown before it is read)
      estimated_steps           steps it will write, None when unknown (sizes the shards)
      estimated_bytes           bytes the source knows it holds beyond its steps (shard sizing)
      read_group                refs loaded one after another by one reader (None: any order)
      unit_key / unit_files / unit_prefix   its --incremental fingerprint unit

What `plan` returns is split in two by audience: `meta.source` is published as mixtrain.json's
"source" object; `meta.private` is the planning data only the source's reader needs (LeRobot's
data-file footer signatures, RLDS's decoding layout) and is never written.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any, ClassVar

import fsspec

from formats.sequence import DatasetMeta, Sequence

__all__ = ["Source", "SourceReader", "SourceRef", "SourceOption"]


@dataclasses.dataclass(frozen=True)
class SourceOption:
    """One command-line option a source reads: `--<flag>`, handed to `plan` as options[<key>].

    `parse` turns the command-line value into the plan option (the default value turns into the
    default plan option); `pipelines/cli.py` lists the flag (parsed before any format is imported)
    and a test checks the two agree.
    """

    flag: str
    key: str
    parse: Any  # Callable[[Any], Any]: the option's value -> the plan option


class SourceRef:
    """Base of every planned ref. Subclasses are frozen dataclasses that define `sequence_id`
    (a field, or a property returning None when the ref holds several sequences). No instance
    dict here, so that a subclass declared with `slots=True` has none either (a million refs are
    planned at once)."""

    __slots__ = ()
    sequence_id: str | None  # declared by every subclass

    @property
    def sequence_count(self) -> int | None:
        return 1

    @property
    def estimated_steps(self) -> int | None:
        return None

    @property
    def estimated_bytes(self) -> float:
        return 0.0

    @property
    def read_group(self) -> str | None:
        """Refs that read the same source data (a Parquet data file, a zarr chunk) share a
        read group: the pipeline hands them to one reader one after another, in plan order, so
        that the reader decodes the shared data once. None: nothing shared."""
        return None

    @property
    def unit_key(self) -> str:
        return self.sequence_id

    @property
    def unit_files(self) -> tuple[str, ...]:
        """The source files (relative to the root) this ref reads."""
        return ()

    @property
    def unit_prefix(self) -> str | None:
        """The sequence-id prefix shared by the sequences of a unit planned as one ref."""
        return None


class SourceReader:
    """A source opened on a worker: `load`s sequences, keeping whatever it caches to itself."""

    def __init__(self, fs: fsspec.AbstractFileSystem, root: str, meta: DatasetMeta):
        self.fs, self.root, self.meta = fs, root, meta

    def expand(self, ref: SourceRef) -> Iterator[SourceRef]:
        yield ref

    def load(self, ref: SourceRef) -> Sequence:
        raise NotImplementedError


class Source:
    """One source format. Subclasses set the class attributes and implement detect, plan, open."""

    id: ClassVar[str]
    expects: ClassVar[str] = ""
    options: ClassVar[tuple[SourceOption, ...]] = ()
    expands_refs: ClassVar[bool] = False
    reader: ClassVar[type[SourceReader]]  # what `open` opens, unless the source overrides `open`
    # Files every unit depends on (relative to the root; "" is the whole root) for --incremental.
    shared_files: ClassVar[tuple[str, ...]] = ()

    def detect(self, fs: fsspec.AbstractFileSystem, root: str) -> bool:
        raise NotImplementedError

    def plan(self, fs: fsspec.AbstractFileSystem, root: str, options: dict) -> tuple[DatasetMeta, list[SourceRef]]:
        raise NotImplementedError

    def open(self, fs: fsspec.AbstractFileSystem, root: str, meta: DatasetMeta) -> SourceReader:
        return self.reader(fs, root, meta)

    def plan_options(self, values: dict[str, Any]) -> dict[str, Any]:
        """The plan options from command-line values (flag -> value), for this source's options only."""
        return {option.key: option.parse(values[option.flag]) for option in self.options}

    def incremental_units(self, refs: list[SourceRef]) -> tuple[list, list[str]]:
        """One fingerprint unit per ref, in the refs' order (its key, files and id prefix), each
        paired with what its fingerprint hashes of the ref (the ref itself by default; a source may
        leave out what is not part of the unit, as ORTF does its row position), and the shared files."""
        from formats.fingerprint import Unit

        units = [(Unit(ref.unit_key, tuple(ref.unit_files), prefix=ref.unit_prefix), ref) for ref in refs]
        return units, list(self.shared_files)

    def __repr__(self) -> str:
        return f"<source {self.id}>"
