"""ReadSequences: refs planned on the launcher -> Sequences loaded on the workers.

The refs do not travel in the job graph: the launcher batches them (`ref_batches`) and writes
the batches to files under the plan folder (`stage_refs`); the graph creates only the file
numbers, the workers read the files and spread the batches (each one bytes value, as the file
holds it; batches dealt to the local runner's workers, a file each, are spread with the file
numbers), and each loads a batch's refs one after another.
"""

from __future__ import annotations

import math
import numbers

import apache_beam as beam

from formats import storage
from formats.errors import ConversionError
from formats.mixtrain import resume
from formats.sequence import DatasetMeta
from formats.sources import Source, SourceRef
from transforms import progress, staged_plan
from transforms.errors import ERRORS, FAIL, skip_or_raise

__all__ = ["ReadSequences", "ref_batches", "stage_refs", "staged_refs", "MIN_BATCHES", "MAX_BATCH_REFS", "REFS_PER_FILE", "TALLIES"]

# The output of ReadSequences that says, for each planned unit whose sequences are counted only
# when a worker indexes it (Source.expands_refs, sequence_count None), how many it found: the
# publish step compares what arrived with the plan completed by these (transforms/write.py).
TALLIES = "tallies"

# A read group larger than its share is cut into consecutive pieces, so that a dataset of a few
# large groups still gives the workers at least MIN_BATCHES batches (2 x 8 workers) and no batch
# holds more than MAX_BATCH_REFS refs (one DoFn call that long cannot be rebalanced). Each extra
# piece costs one more decode of the group's shared data: at most MIN_BATCHES extra decodes from
# the first rule over the whole run, and one per MAX_BATCH_REFS refs from the second. That is the
# rule where the number of workers is not known (Dataflow, Dask); where it is (`workers`, the local
# runner), the batches are dealt to them instead (`_dealt`).
MIN_BATCHES = 16
MAX_BATCH_REFS = 2000
REFS_PER_FILE = 2000  # whole batches per plan file, until it holds this many refs (dealt batches: one a file)


def ref_batches(refs: list[SourceRef], workers: int | None = None) -> list[list[SourceRef]]:
    """The refs in plan order, cut into batches for the workers.

    `workers` None: consecutive refs of the same read group (not None) form one batch, cut into
    even pieces of at most min(MAX_BATCH_REFS, ceil(len(refs) / MIN_BATCHES)) refs; every ref
    without a group is a batch of one. `workers` N: `_dealt`."""
    if workers is not None and refs:
        return _dealt(refs, workers)
    limit = max(1, min(MAX_BATCH_REFS, math.ceil(len(refs) / MIN_BATCHES)))
    batches: list[list[SourceRef]] = []
    group: list[SourceRef] = []

    def close() -> None:
        pieces = math.ceil(len(group) / limit)
        size, extra = divmod(len(group), pieces) if pieces else (0, 0)
        start = 0
        for piece in range(pieces):
            end = start + size + (piece < extra)
            batches.append(group[start:end])
            start = end
        group.clear()

    for ref in refs:
        key = ref.read_group
        if group and (key is None or key != group[0].read_group):
            close()
        if key is None:
            batches.append([ref])
        else:
            group.append(ref)
    close()
    return batches


def _dealt(refs: list[SourceRef], workers: int) -> list[list[SourceRef]]:
    """Batches of equal work, as many per worker: the local runner hands the batches to its N
    workers in turn (Beam's FnApiRunner deals the keys of a shuffle round-robin), so N x k batches
    of equal steps end together, where batches cut by read group gave one worker a batch more
    (64 re-encoded episodes on 16 workers: 17 batches, one worker 35 CPU s, the others 20).

    Consecutive refs in plan order, cut where the running total of steps (`estimated_steps` + 1;
    each ref 1 when some ref does not know its steps) crosses a multiple of the total / (N x k),
    with k the fewest batches a worker needs for N x k batches of MAX_BATCH_REFS refs to hold them
    all. Steps set the cuts, so refs of uneven steps give batches of uneven counts (and a ref
    heavier than a share leaves a batch empty, dropped): the local runner never splits a DoFn call
    anyway. A cut may fall inside a read group: that group's shared data is then decoded by two
    readers, at most N x k - 1 times over the run. `workers`: the runner's partitions, >= 1."""
    workers = max(1, workers)
    count = min(len(refs), workers * max(1, math.ceil(len(refs) / (workers * MAX_BATCH_REFS))))
    steps = [ref.estimated_steps for ref in refs]
    known = all(isinstance(value, numbers.Integral) and value >= 0 for value in steps)
    costs = [1 + int(value) for value in steps] if known else [1] * len(refs)
    total = sum(costs)
    batches: list[list[SourceRef]] = [[] for _ in range(count)]
    done = 0
    for ref, cost in zip(refs, costs):
        # The batch that holds this ref's middle: integer arithmetic, so the cut is the same everywhere.
        batches[min(count - 1, (2 * done + cost) * count // (2 * total))].append(ref)
        done += cost
    return [batch for batch in batches if batch]


def refs_file(number: int) -> str:
    return f"refs-{number:06d}.pkl"


def staged_refs(plan_folder: staged_plan.PlanFolder):
    """Every ref `stage_refs` wrote to `plan_folder`, in plan order (read back by the publish step
    only when what arrived differs from the plan, to name what is missing)."""
    number = 0
    while staged_plan.exists(plan_folder, refs_file(number)):
        for batch in staged_plan.read_pieces(plan_folder, refs_file(number)):
            yield from batch
        number += 1


def stage_refs(refs: list[SourceRef], plan_folder: staged_plan.PlanFolder, workers: int | None = None) -> int:
    """Write the refs' batches (`ref_batches`, for `workers`) to plan files, each batch a piece;
    returns how many files. Batches dealt to known workers get a file each (the shuffle of the
    file numbers deals them: `ReadSequences(spread_batches=False)`); otherwise whole batches fill
    a file until it holds REFS_PER_FILE refs."""
    files, pending, count = 0, [], 0
    for batch in ref_batches(refs, workers):
        pending.append(batch)
        count += len(batch)
        if count >= REFS_PER_FILE or workers is not None:
            staged_plan.write_pieces(plan_folder, refs_file(files), pending)
            files, pending, count = files + 1, [], 0
    if pending:
        staged_plan.write_pieces(plan_folder, refs_file(files), pending)
        files += 1
    return files


class _ReadRefBatchesFn(beam.DoFn):
    """A plan file's number -> its batches of refs, each as one bytes value, as the file holds it
    (pickled by `stage_refs`, signature checked here): Beam's coders pickled every ref of a batch
    on its own, 6.5 times on the way through the shuffle that spreads the batches (13,000 pickles
    for 2,000 episodes); bytes cross it as they are, and the loading worker unpacks the batch once."""

    def __init__(self, plan_folder: staged_plan.PlanFolder):
        self._plan_folder = plan_folder

    def process(self, number: int):
        name = refs_file(number)
        try:
            yield from staged_plan.read_pieces(self._plan_folder, name, packed=True)
        except FileNotFoundError as error:  # not worth retrying: say which plan is gone
            raise ConversionError(f"{storage.join(self._plan_folder.url, name)}: the run's plan file is missing (its folder was "
                                  "removed or overwritten while the job ran); rerun the conversion") from error


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

    def finish_bundle(self):
        progress.flush()  # skipped sequences' counts

    def teardown(self):
        self._reader.close()


class _LoadSequenceFn(_SourceFn):
    """Loads a batch of refs, one sequence per ref, one after another (a read group's shared data
    is then decoded once by the reader); each ref fails or is skipped on its own. The batch comes
    packed (a plan file's piece, `staged_plan.unpack`) or as a list of refs."""

    def process(self, batch):
        if isinstance(batch, bytes):
            batch = staged_plan.unpack(batch)
        for ref in batch:
            try:
                yield self._reader.load(ref)
            except ConversionError as error:
                yield skip_or_raise(error, self._on_error, ref.sequence_id, "load")


class _ExpandRefFn(_SourceFn):
    """Sources whose planned units hold many sequences (`Source.expands_refs`) index them on a worker.
    A count the plan did not know is recorded in the run's resume journal too (`journal`: the
    staging folder's URL and the run's generation), so that a resumption can tell the unit whole."""

    def __init__(self, source: Source, root_url: str, meta: DatasetMeta, on_error: str = FAIL,
                 journal: tuple[str, int] | None = None):
        super().__init__(source, root_url, meta, on_error)
        self._journal = journal

    def process(self, ref):
        try:
            refs = list(self._reader.expand(ref))
        except ConversionError as error:  # a unit that cannot be indexed: all its sequences, as many as planned (None: unknown)
            yield skip_or_raise(error, self._on_error, None, "index", ref.sequence_count)
            return
        if ref.sequence_count is None:  # the plan could not count them: this is its count
            if self._journal is not None:
                fs, staging = storage.open_root(self._journal[0])
                resume.write_tally(fs, staging, self._journal[1], ref.unit_key, len(refs))
            yield beam.pvalue.TaggedOutput(TALLIES, (ref.unit_key, len(refs)))
        yield from refs


def _numbers(count: int):
    return range(count)


def _alone(ref):
    return [ref]


class ReadSequences(beam.PTransform):
    """Read the staged refs, spread their batches over workers, load each sequence.

    Only plan file numbers are in the graph and only the small refs, packed by batch, cross the
    Reshuffle that spreads them (or, dealt, a file a batch, none: the numbers' Reshuffle spreads
    them); sequence data is produced after it. A source with `expands_refs`
    (a unit of many sequences -> its refs) gets a second fan-out on the workers, one ref per element. Returns
    {"sequences": PCollection, "errors": [PCollections of error records], "tallies":
    [PCollections of (unit key, sequences) for each unit the plan could not count]} (records only
    under on_error=skip; under fail the first bad sequence stops the run).

    Args:
      source: the Source (`formats.sources.get`); pickled to the workers, so a source
        registered only on the launcher works too.
      root_url: the dataset root as a URL (`storage.url_for`).
      meta: the DatasetMeta from the source's `plan`.
      plan_folder: the folder `stage_refs` wrote the refs to.
      files: how many files it wrote.
      spread_batches: False where `stage_refs` dealt the batches to the workers, a file each:
        the shuffle of the file numbers then spreads them, and the batches need no shuffle of
        their own (one stage fewer before the first sequence).
      journal: (staging URL, generation) of the run's resume journal, where the units' counts
        found on the workers are recorded (`formats.mixtrain.resume`); None: not recorded.

    Example:
      files = stage_refs(refs, plan_folder)
      read = pipeline | ReadSequences(source, root_url, meta, plan_folder, files)
    """

    def __init__(self, source: Source, root_url: str, meta: DatasetMeta, plan_folder: staged_plan.PlanFolder, files: int,
                 on_error: str = FAIL, spread_batches: bool = True, journal: tuple[str, int] | None = None):
        super().__init__()
        self._journal = journal
        self._spread_batches = spread_batches
        self._source = source
        self._root_url = root_url
        self._meta = meta
        self._plan_folder = plan_folder
        self._files = files
        self._on_error = on_error

    def expand(self, pbegin):
        batches = (pbegin
                   | "CountPlanFiles" >> beam.Create([self._files], reshuffle=False)
                   | "PlanFiles" >> beam.FlatMap(_numbers)
                   | "SpreadPlanFiles" >> beam.Reshuffle()
                   | "ReadRefBatches" >> beam.ParDo(_ReadRefBatchesFn(self._plan_folder)))
        if self._spread_batches:
            batches = batches | "SpreadRefs" >> beam.Reshuffle()
        errors, tallies = [], []
        if self._source.expands_refs:
            expanded = batches | "Refs" >> beam.FlatMap(staged_plan.unpack) | "ExpandRefs" >> beam.ParDo(
                _ExpandRefFn(self._source, self._root_url, self._meta, self._on_error, self._journal)).with_outputs(ERRORS, TALLIES, main="refs")
            batches = expanded.refs | "SpreadExpandedRefs" >> beam.Reshuffle() | "Alone" >> beam.Map(_alone)
            errors.append(expanded[ERRORS])
            tallies.append(expanded[TALLIES])
        loaded = batches | "LoadSequences" >> beam.ParDo(
            _LoadSequenceFn(self._source, self._root_url, self._meta, self._on_error)).with_outputs(ERRORS, main="sequences")
        errors.append(loaded[ERRORS])
        return {"sequences": loaded.sequences, ERRORS: errors, TALLIES: tallies}
