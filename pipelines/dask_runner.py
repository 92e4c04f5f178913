"""`--runner=DaskRunner`: Beam's DaskRunner (apache_beam/runners/dask, Beam 2.77) with its
translation of the primitives corrected, so that a pipeline gives on a Dask cluster what it gives
on the local runner.

What Beam's translation does wrong, each seen in its source (line numbers of Beam 2.77) and shown
by a minimal pipeline that fails on it (tests/pipelines/test_dask_runner.py, strict xfail):

- outputs a DoFn emits in `finish_bundle` are dropped: `apply_dofn_to_bundle` takes the bundle's
  results (transform_evaluator.py:198) before it calls `invoke_finish_bundle` (:200);
- every tagged output reaches every consumer, untagged: the ParDo's one bag is registered for the
  transform, not per output PCollection (dask_runner.py:217, `self.bags[transform_node]`), and
  `TaggingReceiver` values are unwrapped without their tag (transform_evaluator.py:198);
- only the last leaf is computed: `run_pipeline` computes `list(dask_visitor.bags.values())[-1]`
  (dask_runner.py:251), so a branch that ends elsewhere (a second write) never runs;
- a side input's upstream is computed again for every bundle that reads it:
  `DaskBagWindowedIterator.__iter__` calls `list(self.bag)` inside each task (transform_evaluator.py:95);
- a primitive it does not know becomes an identity (`TRANSLATIONS.get(..., NoOp)`, dask_runner.py:181):
  `Impulse` gives nothing, a `Read` passes None on;
- `Reshuffle` is replaced by an identity (overrides.py:117-123), so everything a `Create` of fewer
  than 128 values fans out to stays in one partition, on one worker;
- its result never closes the `Client` it opened (a launcher then waits out its reconnections).

This runner keeps Beam's option parsing (`DaskOptions`: --dask_client_address, ...), Beam's
overrides and its Create translation, and replaces the rest: one bag per output PCollection (a
bundle returns (tag, value) pairs, finish_bundle's included, split by tag), each side input
gathered once into a value every bundle receives, every leaf computed (as counts, so no data
travels to the launcher), Reshuffle as a round-robin deal over 2 partitions per thread of the cluster, GroupByKey
as Beam's op does it but always on the cluster's task shuffle (dask picks an on-disk shuffle, local
to one machine, when no default client is set), and any other primitive refused by name. Like
Beam's, it runs batch pipelines in the global window (elements travel without window or
timestamp); other windowing is refused.
"""

from __future__ import annotations

import contextlib
import functools
import json
import operator
import os
import socket
import time
from typing import Any

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.pipeline import AppliedPTransform, PipelineVisitor
from apache_beam.runners.common import DoFnContext, DoFnInvoker, DoFnSignature, Receiver, _OutputHandler
from apache_beam.runners.dask import dask_runner as beam_dask  # imports dask: an extra, pip install 'mixtrain-convert[dask]'
from apache_beam.runners.dask import overrides, transform_evaluator
from apache_beam.runners.runner import PipelineState
from apache_beam.transforms import window
from apache_beam.transforms.sideinputs import SideInputMap

from pipelines.failures import RunnerLost
from transforms import progress as progress_feed
from transforms.video import CODEC_THREADS_ENV

__all__ = ["DaskRunner", "DaskOptions"]

DaskOptions = beam_dask.DaskOptions  # --dask_client_address, ...: registered with Beam's parsers by this import

PARTITIONS_PER_THREAD = 2  # a Reshuffle spreads its elements over this many partitions per worker thread
MAX_RESHUFFLE_PIECES = 100_000  # input partitions x output partitions of one Reshuffle (tasks of the scheduler)


class _Collect(Receiver):
    """Receives one output's windowed values as (tag, value) pairs."""

    def __init__(self, tag: str | None, out: list):
        self._tag = tag
        self._out = out

    def receive(self, windowed_value) -> None:
        self._out.append((self._tag, windowed_value.value))


class _Receivers(dict):
    def __init__(self, out: list):
        super().__init__()
        self._out = out

    def __missing__(self, tag):
        receiver = self[tag] = _Collect(tag, self._out)
        return receiver


def _run_bundle(items, fn: beam.DoFn, label: str, args: list, kwargs: dict, window_fn, side_specs: list, *side_values) -> list:
    """One Dask partition as one bundle: setup, start_bundle, process each element, finish_bundle,
    teardown; returns every output, finish_bundle's included, as (tag, value) pairs."""
    items = list(items)
    if not items:  # no bundle for no elements, as Beam's runners do
        return []
    side_inputs = [SideInputMap(view, options, [transform_evaluator.get_windowed_value(value, mapping) for value in values])
                   for (view, options, mapping), values in zip(side_specs, side_values)]
    out: list = []
    receivers = _Receivers(out)
    handler = _OutputHandler(window_fn=window_fn, main_receivers=receivers[None], tagged_receivers=receivers,
                             per_element_output_counter=None, output_batch_converter=None, process_yields_batches=False,
                             process_batch_yields_elements=False)
    invoker = DoFnInvoker.create_invoker(DoFnSignature(fn), handler, context=DoFnContext(label, state=None), side_inputs=side_inputs,
                                         input_args=args, input_kwargs=kwargs, user_state_context=None,
                                         bundle_finalizer_param=beam.DoFn.BundleFinalizerParam())
    invoker.invoke_setup()
    try:
        invoker.invoke_start_bundle()
        for item in items:
            invoker.invoke_process(transform_evaluator.get_windowed_value(item, window_fn))
        invoker.invoke_finish_bundle()
    finally:
        invoker.invoke_teardown()
    return out


def _tagged(pairs, tag):
    return [value for pair_tag, value in pairs if pair_tag == tag]


def _deal(partition, parts: int, offset: int) -> list[list]:
    """A partition's elements dealt over `parts` lists, starting at list `offset` (so that the
    first elements of many small partitions do not all land in the same new partition)."""
    dealt: list[list] = [[] for _ in range(parts)]
    for index, element in enumerate(partition):
        dealt[(index + offset) % parts].append(element)
    return dealt


def _gather(pieces) -> list:
    return [element for piece in pieces for element in piece]


def _concat(partitions) -> list:
    return [value for partition in partitions for value in partition]


def _key(pair):
    return pair[0]


def _grouped(group):
    """(key, [(key, value reified with its window)]) -> (key, [value]), as Beam's GroupByKey op gives it."""
    key, pairs = group
    return key, [transform_evaluator.defenestrate(pair[1]) for pair in pairs]


def _count(partition) -> int:
    return sum(1 for _ in partition)


def _forward_progress(name: str, event) -> None:
    """A worker's progress event (timestamp, counts) -> one datagram on the launcher's progress socket."""
    _, counts = event
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
        sender.sendto(json.dumps(counts).encode(), "\0" + name)


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _set_codec_threads(threads: int) -> None:
    os.environ[CODEC_THREADS_ENV] = str(threads)


def _share_cores(client) -> None:
    """Each worker's codecs get its machine's cores divided by the worker threads on that machine,
    as the local runner's workers do (2 processes of 2 threads each decoding on 2 cores cost up
    to a quarter more, bench/bench_dask.py). Workers that join later keep the codecs' own choice."""
    workers = client.scheduler_info()["workers"]
    if not workers:
        return
    cores = client.run(_cores)
    on_host: dict[str, int] = {}
    for info in workers.values():
        on_host[info["host"]] = on_host.get(info["host"], 0) + info["nthreads"]
    for address, info in workers.items():
        client.run(_set_codec_threads, max(1, cores.get(address, 1) // max(1, on_host[info["host"]])), workers=[address])


def _global_window_only(windowing, what: str) -> None:
    if not isinstance(windowing.windowfn, window.GlobalWindows) or not windowing.is_default():
        raise NotImplementedError(f"DaskRunner runs batch pipelines in the global window; {what} uses {windowing}")


class _Translator(PipelineVisitor):
    """Every PCollection of the pipeline -> its dask Bag."""

    def __init__(self, bag_kwargs: dict, spread: int):
        self.bag_kwargs = bag_kwargs
        self.spread = spread
        self.bags: dict[pvalue.PCollection, Any] = {}
        self.consumed: set = set()

    def leaves(self) -> list:
        return [bag for pcoll, bag in self.bags.items() if pcoll not in self.consumed]

    def visit_transform(self, node: AppliedPTransform) -> None:
        transform = node.transform
        inputs = [value for value in node.inputs if not isinstance(value, pvalue.PBegin)]
        self.consumed.update(inputs)
        self.consumed.update(side.pvalue for side in node.side_inputs)
        bags = [self.bags[value] for value in inputs]
        outputs = node.outputs
        if isinstance(transform, overrides._GroupAlsoByWindow):  # Beam's GroupByKey op already grouped the values
            _global_window_only(transform.windowing, node.full_label)
            result = bags[0]
        elif isinstance(transform, overrides._Reshuffle):
            result = self._reshuffle(bags[0])
        elif isinstance(transform, beam.WindowInto):
            _global_window_only(transform.get_windowing(inputs), node.full_label)
            result = bags[0]
        elif isinstance(transform, beam.ParDo):
            self._par_do(node, bags[0])
            return
        elif isinstance(transform, overrides._Create):
            result = transform_evaluator.Create(node, bag_kwargs=self.bag_kwargs).apply(None)
        elif isinstance(transform, beam.Impulse):
            import dask.bag as db

            result = db.from_sequence([b""], npartitions=1)
        elif isinstance(transform, overrides._GroupByKeyOnly):
            result = bags[0].groupby(_key, shuffle="tasks").map(_grouped)  # Beam's GroupByKey op, on the cluster's own tasks
        elif isinstance(transform, overrides._Flatten):
            import dask.bag as db

            result = db.concat(bags) if bags else db.from_sequence([], npartitions=1)
        else:
            raise NotImplementedError(f"DaskRunner cannot run {node.full_label} ({type(transform).__name__}): not a primitive it "
                                      "translates")
        (output,) = outputs.values()
        self.bags[output] = result

    def _par_do(self, node: AppliedPTransform, bag) -> None:
        transform = node.transform
        args, kwargs = transform.raw_side_inputs
        main_input = next(iter(node.main_inputs.values()))
        window_fn = main_input.windowing.windowfn if hasattr(main_input, "windowing") else None
        specs = [(type(side), side._view_options(), side._window_mapping_fn) for side in node.side_inputs]
        # Each side input gathered once, as one value every bundle receives: a Delayed of the graph as it is (a bag's
        # Item, passed as it is, is optimised on its own, its fused upstream tasks renamed: two side inputs of one
        # upstream then computed it twice).
        values = [self.bags[side.pvalue].reduction(list, _concat, split_every=False).to_delayed(optimize_graph=False)
                  for side in node.side_inputs]
        pairs = bag.map_partitions(_run_bundle, transform.fn, transform.label, list(args), kwargs, window_fn, specs, *values)
        for tag, output in node.outputs.items():  # the main output's tag is None
            self.bags[output] = pairs.map_partitions(_tagged, tag)

    def _reshuffle(self, bag):
        """Elements dealt round-robin from every partition over `spread` new ones: each input
        partition is cut into `spread` pieces (one task, the pieces picked out where it ran) and
        new partition j gathers the j-th piece of each. At most MAX_RESHUFFLE_PIECES pieces in all."""
        import dask.bag as db
        from dask.base import tokenize
        from dask.highlevelgraph import HighLevelGraph

        parts = max(1, min(self.spread, MAX_RESHUFFLE_PIECES // bag.npartitions))
        token = tokenize(bag, parts)
        dealt, piece, name = f"reshuffle-deal-{token}", f"reshuffle-piece-{token}", f"reshuffle-{token}"
        graph: dict = {}
        for part in range(bag.npartitions):
            graph[(dealt, part)] = (_deal, (bag.name, part), parts, part)
            for target in range(parts):
                graph[(piece, part, target)] = (operator.getitem, (dealt, part), target)
        for target in range(parts):
            graph[(name, target)] = (_gather, [(piece, part, target) for part in range(bag.npartitions)])
        return db.Bag(HighLevelGraph.from_collections(name, graph, dependencies=[bag]), name, parts)


class DaskRunner(beam_dask.DaskRunner):
    """Beam's DaskRunner with the translation above; same options, same result object."""

    def run_pipeline(self, pipeline, options):
        import dask.distributed as ddist

        dask_options = options.view_as(DaskOptions).get_all_options(drop_default=True, current_only=True)
        bag_kwargs = DaskOptions._extract_bag_kwargs(dask_options)
        client = ddist.Client(**dask_options)
        try:
            progress = os.environ.get(progress_feed.ENV)
            if progress:  # the launcher draws progress from datagrams on this socket: the workers' events become them
                client.subscribe_topic(progress_feed.DASK_TOPIC, functools.partial(_forward_progress, progress))
            _share_cores(client)
            pipeline.replace_all(overrides.dask_overrides())
            threads = sum(client.nthreads().values()) or 1
            translator = _Translator(bag_kwargs, bag_kwargs.get("npartitions") or PARTITIONS_PER_THREAD * threads)
            pipeline.visit(translator)
            # Every leaf, as an element count: shared upstream work is computed once, and no data comes back.
            futures = client.compute([leaf.reduction(_count, sum, split_every=False) for leaf in translator.leaves()])
        except BaseException:
            client.close()
            raise
        return DaskRunnerResult(client, futures)


class DaskRunnerResult(beam_dask.DaskRunnerResult):
    """Beam's result, which also stops the run's other tasks when one fails or the wait is
    interrupted, and closes the client when the run ends (Beam's leaves it open: a launcher that
    exits then waits out the client's reconnection attempts).

    The wait reads each leaf future's state, which the future's own client keeps, and fetches
    nothing. Beam's wait (`as_completed(..., with_results=True)`) took a cancelled future for a
    finished one (it hands the cancellation over as a result); it tracks the futures on the
    default client's loop, which inside another client's `with` block (as in the tests) is not
    the loop of the client that owns them; and a CI run was seen waiting in it for ever with the
    launcher's loops idle."""

    def wait_until_finish(self, duration=None) -> str:
        if self._state == PipelineState.DONE:  # waited for already: its client is closed
            return self._state
        deadline = None if duration is None else time.monotonic() + duration / 1000  # Beam's unit: milliseconds
        try:
            _wait_for(self.client, self.futures, deadline)
        except TimeoutError:  # still running: the caller decides
            raise
        except BaseException:  # the rest of the run's tasks stop too
            self._state = PipelineState.FAILED
            try:
                if self.client.status not in ("closing", "closed"):  # a closed client's cancel would hide this error
                    self.client.cancel(self.futures)
                    _drain(self.client)
            finally:
                self.client.close()
            raise
        self._state = PipelineState.DONE
        self.client.close()
        return self._state

    def cancel(self) -> str:
        if self.client.status in ("closing", "closed"):
            return self._state
        try:
            return super().cancel()
        finally:
            self.client.close()


POLL_SECONDS = 0.05


def _wait_for(client, futures, deadline: float | None) -> None:
    """Until every future is finished: the first that erred raises its task's exception (with its
    traceback), one that was cancelled (a scheduler lost or restarted, someone's cancel) says
    why as RunnerLost; a deadline passed raises TimeoutError."""
    import dask.distributed as ddist

    while True:
        for future in futures:
            if future.status in ("error", "cancelled"):
                try:
                    future.result()  # raises what the future's state holds: no data travels
                except ddist.CancelledError as cancelled:  # also one that erred, then was cancelled, after the look above
                    raise RunnerLost(_cancelled(client, getattr(cancelled, "reason", None) or "unknown")) from cancelled
        if all(future.status == "finished" for future in futures):
            return
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError("the run is still going")
        time.sleep(POLL_SECONDS)


def _cancelled(client, reason: str) -> str:
    """A lost scheduler cannot say whether a publish step running on a worker will finish (a worker
    that loses its scheduler lets its running task end, for up to 30 s): the line does not say what
    the output is, and the launcher leaves that step's staging folder alone (pipelines/conversion.py)."""
    address = getattr(client.scheduler, "address", None) or "?"
    what = {"scheduler-connection-lost": f"the connection to the Dask scheduler at {address} was lost",
            "scheduler-restart": f"the Dask scheduler at {address} was restarted"}.get(
                reason, f"the Dask cluster at {address} cancelled the run's tasks ({reason})")
    return f"{what} before the run's work was done"


DRAIN_SECONDS = 60.0


def _drain(client, seconds: float = DRAIN_SECONDS) -> None:
    """Wait until the cluster runs none of the tasks it had started: cancelling stops only tasks
    that have not begun, and one already writing videos or a shard into the staging folder would
    go on after the launcher removed it (the launcher cleans up when this returns). Bounded: a
    cluster busy with other work is not waited for longer than `seconds`."""
    if client.status != "running":  # the scheduler is lost: there is no one to ask
        return
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if not any(client.processing().values()):
                return
        except Exception:  # noqa: BLE001 - the scheduler is gone: nothing left to wait for
            return
        time.sleep(0.2)
