"""DoFns for the DaskRunner tests, in a module the cluster's worker processes import."""

import os
import time
import uuid

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindows


class BufferFn(beam.DoFn):
    """Emits everything in finish_bundle (as the converter's row spiller does)."""

    def start_bundle(self):
        self.items = []

    def process(self, element):
        self.items.append(element)

    def finish_bundle(self):
        for element in self.items:
            yield GlobalWindows.windowed_value(element)


class SplitFn(beam.DoFn):
    def process(self, element):
        yield beam.pvalue.TaggedOutput("odd", element) if element % 2 else element


class RecordFn(beam.DoFn):
    """Writes one file per element it sees into `folder` (what ran, seen from the launcher), and
    one per bundle into `folder`/bundles."""

    def __init__(self, folder: str):
        self.folder = folder

    def start_bundle(self):
        os.makedirs(os.path.join(self.folder, "bundles"), exist_ok=True)
        with open(os.path.join(self.folder, "bundles", uuid.uuid4().hex), "w"):
            pass

    def process(self, element):
        with open(os.path.join(self.folder, uuid.uuid4().hex), "w") as handle:
            handle.write(repr(element))
        yield element


def seen(folder: str) -> list:
    import ast

    return sorted(ast.literal_eval(open(os.path.join(folder, name)).read()) for name in os.listdir(folder) if name != "bundles")


def bundles(folder: str) -> int:
    return len(os.listdir(os.path.join(folder, "bundles")))


def _slowed(owner, name: str, seconds: float) -> None:
    """`owner.name` made to wait `seconds` before it runs (0: the original again, however often set)."""
    original = getattr(owner, f"_original_{name}", getattr(owner, name))
    setattr(owner, f"_original_{name}", original)

    def slow(*args, **kwargs):
        time.sleep(seconds)
        return original(*args, **kwargs)

    setattr(owner, name, slow if seconds else original)


def slow_loads(seconds: float) -> None:
    """Run on every worker (Client.run): each batch of refs waits `seconds` before it loads (0: as it was)."""
    from transforms import read

    _slowed(read._LoadSequenceFn, "process", seconds)


def scheduled(dask_scheduler) -> int:
    """How many tasks the scheduler holds (Client.run_on_scheduler)."""
    return len(dask_scheduler.tasks)


def codec_threads() -> str | None:
    """A worker's share of codec threads, as the DaskRunner set it (Client.run)."""
    from transforms.video import CODEC_THREADS_ENV

    return os.environ.get(CODEC_THREADS_ENV)


def slow_publish(seconds: float) -> None:
    """Run on every worker (Client.run): the publish step waits `seconds` after it removed its journal,
    before it moves the staged files into the output (0: as it was)."""
    from transforms import write

    _slowed(write.tables, "publish", seconds)
