"""Sources: the contract every input format implements, and the registry that finds them.

One folder a format beside this file (`lerobot_v3/`, `lerobot_v2/`, `ortf/`, `rlds/`, `l5kit/`): its `__init__`
holds the `Source` (launcher side) and registers it, `rows.py`/`records.py` the worker-side
reader, `sample.py` the synthetic writer the tests use. A new format is one such folder.

The contract: what a format module gives the rest of the product, and nothing more.

Generic code (pipelines/, transforms/, validate) only ever talks to a `Source` object, its
`SourceReader` and the `SourceRef`s it planned; it never names a format. A format is one module
that subclasses these three and calls `formats.sources.register(TheSource())` at import.

    Source                      on the launcher (and in `validate`)
      id                        the --source name and mixtrain.json source.format
      expects                   what detect looks for, said when no format matches
      marker                    the file without which a folder is not this format (named when --source forces it)
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

import contextlib
import dataclasses
import importlib
import inspect
import logging
from collections.abc import Iterator
from importlib import metadata
from typing import Any, ClassVar

import fsspec

from formats.errors import FormatError
from formats.sequence import DatasetMeta, Sequence

__all__ = ["Source", "SourceReader", "SourceRef", "SourceOption", "register", "unregister", "registered", "get", "detect", "sequence_count"]


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


_POSITIONAL_FIELDS: dict[type, tuple[str, ...]] = {}  # a ref class -> `_positional_fields`


def _positional_fields(cls: type) -> tuple[str, ...]:
    """The field names `cls(*values)` takes, in order, when rebuilding an instance from them is
    exactly what pickling does; () when it is not (see SourceRef.__reduce_ex__): the class is a
    dataclass itself, with the constructor dataclasses wrote (exec'd, so its code comes from no
    file), no __post_init__ (it would run again), every field in the constructor by position, and
    no class of its own up the MRO that pickles its own way (a state method other than the ones
    `slots=True` writes)."""
    if "__dataclass_fields__" not in vars(cls) or "__init__" not in vars(cls) or hasattr(cls, "__post_init__"):
        return ()
    if not getattr(getattr(cls.__init__, "__code__", None), "co_filename", "").startswith("<"):
        return ()  # an __init__ written by hand, in the class body or below
    for klass in cls.__mro__:
        if klass in (object, SourceRef):
            continue
        own = vars(klass)
        if {"__reduce__", "__reduce_ex__", "__getnewargs__", "__getnewargs_ex__"} & set(own):
            return ()
        for name in ("__getstate__", "__setstate__"):
            if name in own and getattr(own[name], "__name__", "") not in ("_dataclass_getstate", "_dataclass_setstate"):
                return ()
    fields = dataclasses.fields(cls)
    names = tuple(field.name for field in fields)
    try:
        parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]
    except (TypeError, ValueError):
        return ()
    if (any(not field.init for field in fields) or [parameter.name for parameter in parameters] != list(names)
            or any(parameter.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD for parameter in parameters)):
        return ()
    return names


class SourceRef:
    """Base of every planned ref. Subclasses are frozen dataclasses that define `sequence_id`
    (a field, or a property returning None when the ref holds several sequences). No instance
    dict here, so that a subclass declared with `slots=True` has none either (a million refs are
    planned at once)."""

    __slots__ = ()
    sequence_id: str | None  # declared by every subclass

    def __reduce_ex__(self, protocol):
        """A plain dataclass ref pickles as (class, field values): a slotted frozen dataclass's own
        pickling restores each field through Python-level state handling, 1.5-1.8x the time both
        ways (plan files, the early planner's answer; 20,000 LeRobot refs: 0.13 -> 0.08 s dumped,
        0.14 -> 0.07 s loaded). Only where that rebuilds the ref exactly (`_positional_fields`:
        not kw_only fields, an InitVar, a field left out of __init__, an __init__ written by
        hand, a __post_init__, a class that pickles its own way); else the default."""
        cls = type(self)
        names = _POSITIONAL_FIELDS.get(cls)
        if names is None:
            names = _POSITIONAL_FIELDS[cls] = _positional_fields(cls)
        if not names:
            return super().__reduce_ex__(protocol)
        return (cls, tuple(getattr(self, name) for name in names))

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

    def close(self) -> None:
        """Release what the reader keeps open (the worker is done with it)."""


class Source:
    """One source format. Subclasses set the class attributes and implement detect, plan, open."""

    id: ClassVar[str]
    expects: ClassVar[str] = ""
    marker: ClassVar[str] = ""  # the file (relative to the root) without which the input is not this format
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
        from formats.mixtrain.fingerprint import Unit

        units = [(Unit(ref.unit_key, tuple(ref.unit_files), prefix=ref.unit_prefix), ref) for ref in refs]
        return units, list(self.shared_files)

    def __repr__(self) -> str:
        return f"<source {self.id}>"


# --- the registry: format id -> Source --------------------------------------------------------

class Registry:
    """A name -> entry table whose built-in entries register themselves when their modules are
    imported. Those modules are imported on first use of the table, not when this package is: a
    worker that imports one format's reader (and so this package) loads no other format, and one
    built-in module may import another without a cycle through the registry."""

    def __init__(self, builtin: tuple[str, ...], then: Any = None) -> None:
        self.builtin, self._then, self._entries = builtin, then, {}
        self._state = "unloaded"  # -> "loading" (the built-ins registering themselves) -> "loaded"

    def add(self, name: str, entry: Any) -> Any:
        """Register `entry` under `name`; returns what it replaced, or None. The built-ins are not
        loaded for it (a worker importing one format registers that one alone): an entry that
        clashes with a built-in one is refused when the built-ins load, by their own `add`."""
        replaced = self._entries.get(name)
        self._entries[name] = entry
        return replaced

    def remove(self, name: str, restore: Any = None) -> None:
        """Forget `name`, or put back `restore` (what `add` replaced)."""
        if restore is None:
            self._entries.pop(name, None)
        else:
            self._entries[name] = restore

    def registered(self, name: str) -> Any:
        """The entry under `name` so far (None: none); the built-ins are loaded on `all`."""
        return self._entries.get(name)

    def all(self) -> dict[str, Any]:
        if self._state == "unloaded":
            self._state = "loading"
            try:
                for module in self.builtin:
                    importlib.import_module(module)
                if self._then is not None:
                    self._then()
            except BaseException:
                self._state = "unloaded"  # the next use tries again (and fails the same way): never a partial table
                raise
            self._state = "loaded"
        return self._entries

    def module_attribute(self, attribute: str, module: str) -> Any:
        """A module's `__getattr__` that gives every entry as `module.<attribute>` (PEP 562)."""
        def __getattr__(name: str) -> Any:
            if name == attribute:
                return self.all()
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        return __getattr__


ENTRY_POINT_GROUP = "mixtrain_convert.sources"


def _load_plugins() -> None:
    """Any plugin's sources (entry points of ENTRY_POINT_GROUP): each registers itself when imported."""
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            entry.load()
        except Exception as error:  # noqa: BLE001 - a broken plugin must not break every command
            logging.getLogger(__name__).warning("source plugin %s could not be loaded (left out): %s: %s", entry.value,
                                                type(error).__name__, error)


_REGISTRY = Registry(("formats.sources.lerobot_v3", "formats.sources.lerobot_v2", "formats.sources.ortf", "formats.sources.l5kit",
                      "formats.sources.rlds"), then=_load_plugins)


def register(source: Source) -> Source:
    """Make `source` known to --source, auto-detection, convert, validate and the contract tests."""
    known = _REGISTRY.registered(source.id)
    if known is not None and type(known) is not type(source):
        raise ValueError(f"source id {source.id!r} is already registered by {type(known).__name__}")
    _REGISTRY.add(source.id, source)
    return source


def unregister(source_id: str) -> None:
    _REGISTRY.remove(source_id)


@contextlib.contextmanager
def registered(source: Source) -> Iterator[Source]:
    """`source` registered for the duration of a with block (tests); what it replaced is put back."""
    previous = _REGISTRY.registered(source.id)
    register(source)
    try:
        yield source
    finally:
        _REGISTRY.remove(source.id, restore=previous)


__getattr__ = _REGISTRY.module_attribute("SOURCES", __name__)  # every registered source, built-ins and plugins loaded on first use


def get(name: str) -> Source:
    known = _REGISTRY.all()
    if name not in known:
        raise FormatError(f"unknown source format {name!r}; known: {', '.join(sorted(known))}")
    return known[name]


def detect(fs: fsspec.AbstractFileSystem, root: str) -> str:
    """The id of the one format whose `detect` accepts root; a clear error for none or several."""
    if not fs.exists(root):
        raise FormatError(f"{root}: input not found")
    known = _REGISTRY.all()
    found = [name for name, source in known.items() if source.detect(fs, root)]
    if not found:
        versions = sorted(path.rstrip("/").rsplit("/", 1)[-1] for path in fs.ls(root, detail=False)
                          if fs.isdir(path) and fs.exists(f"{path.rstrip('/')}/dataset_info.json"))
        if versions:
            raise FormatError(f"{root}: a TFDS dataset folder; pass one of its version folders as --input "
                              f"({', '.join(f'{root}/{v}' for v in versions)})")
        raise FormatError(
            f"{root}: not a dataset of a known format ({', '.join(sorted(known))}); "
            + ", ".join(f"for {source.expects}" for source in known.values() if source.expects)
        )
    if len(found) > 1:
        raise FormatError(f"{root}: looks like several formats ({', '.join(found)}); pass --source")
    return found[0]


def sequence_count(refs: list[SourceRef]) -> int | None:
    """How many sequences `refs` hold, None when some ref cannot tell before it is read."""
    counts = [ref.sequence_count for ref in refs]
    return None if None in counts else sum(counts)
