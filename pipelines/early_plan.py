"""Plan in a forked process while the launcher imports Beam (issue 28's serial head).

A conversion's first second and a half went to importing Beam (1.3-1.5 s, one core) and the next
one to planning (reading the source's metadata, 0.75 s at 20,000 LeRobot episodes, plus 0.25 s of
fingerprints), one after the other, while every other core waited. Neither needs the other: the
plan is made without Beam (`pipelines.plan`). So `convert` forks this planner right after reading
its command line, before the heavy import, and the launcher asks for the plan where it would have
made it (`pipelines.conversion.build_pipeline`), after checking the command line against Beam's
options and preparing the output exactly as before.

The early plan is only ever a head start, never a different plan: it is `make_plan` on the same
command line, and it is used only where the launcher would have called `make_plan` with the same
arguments (the output's URL, and for --incremental the previous output's root: a lake table's
previous run is found in the table, so the launcher plans an --incremental lake run itself), and
only when the planner is done by then (GRACE_SECONDS, below: a plan that takes longer than Beam's
import is too big to be worth sending). A refusal the planner hit is raised in the launcher as it
was raised there, at the moment the launcher would have planned, so the checks before planning
still answer first; whatever else goes wrong with the planner (an error that does not survive
pickling, a crash, a kill, not done in time) makes the launcher plan itself, as it did before.
The planner writes nothing but its answer to a pipe, takes SIGINT and SIGTERM with the default
action (it just ends), and is killed when the launcher no longer needs it.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import pickle
import select
import signal
import struct
import sys
import traceback
import warnings
from typing import Any

__all__ = ["EarlyPlan", "wanted"]

_LOG = logging.getLogger("mixtrain-convert")
_LENGTH = struct.Struct(">Q")
# How long a ready launcher waits for a planner that is not done. The plan crosses the pipe
# pickled: 5 us a LeRobot ref each way, and 1.3 GB more memory at 400,000 episodes, so a planner
# still at work when the launcher is ready has a plan too big to be worth sending (measured:
# 1.33x the launcher's time at 100,000 episodes, 1.5x at 400,000 when the launcher always
# waited). It is stopped and the launcher plans, as it did without it: a large plan loses at
# most this, a small one gains up to the whole of its planning.
GRACE_SECONDS = 0.2


def wanted() -> bool:
    """Whether to plan early: on Linux (fork is unavailable on Windows and unsafe on macOS after
    some imports)."""
    return sys.platform.startswith("linux")


def _created_at() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _outcome(args: Any) -> tuple:
    """What the planner sends back, after the `make_plan` arguments it used (output URL, previous
    root): ("plan", plan), ("error", exception, its traceback text), or ("replan", why) when the
    launcher should plan itself."""
    from formats import storage  # here, not above: the launcher forks before importing anything heavy

    try:
        out_fs, out_root = storage.open_root(args.output)
        output_url = storage.url_for(out_fs, out_root)
    except Exception as error:  # noqa: BLE001 - the launcher's own checks say it, before planning
        return (None, None, "replan", f"{type(error).__name__} opening the output")
    arguments = (output_url, out_root)
    try:
        from pipelines.plan import make_plan

        plan = make_plan(args, output_url=output_url, previous_root=out_root, created_at=_created_at())
        # The fingerprints as the publish step will read them, computed here too (a quarter of
        # planning at 20,000 episodes): the same units, in the same order.
        plan = dataclasses.replace(plan, fingerprints=dataclasses.replace(plan.fingerprints, known=plan.fingerprints.units))
        return (*arguments, "plan", plan)
    except Exception as error:  # noqa: BLE001 - sent back whole when it survives pickling, else the launcher replans
        text = "".join(traceback.format_exception(error))
        try:
            pickle.loads(pickle.dumps(error, protocol=pickle.HIGHEST_PROTOCOL))  # noqa: S301 - our own bytes
        except Exception:  # noqa: BLE001
            return (*arguments, "replan", f"{type(error).__name__} does not survive pickling")
        return (*arguments, "error", error, text)


def _planner(args: Any, write_fd: int) -> None:
    """The forked child: plan, write the answer, leave without any clean-up of the launcher's."""
    code = 0
    try:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_DFL)
        logging.disable(logging.CRITICAL)  # the launcher's log is the launcher's
        try:
            data = pickle.dumps(_outcome(args), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as error:  # noqa: BLE001 - a plan that cannot be pickled: the launcher plans itself
            data = pickle.dumps((None, None, "replan", f"the plan does not pickle: {type(error).__name__}"), protocol=pickle.HIGHEST_PROTOCOL)
        with os.fdopen(write_fd, "wb") as pipe:
            pipe.write(_LENGTH.pack(len(data)))
            pipe.write(data)
    except BaseException:  # noqa: BLE001 - the launcher went away (a broken pipe) or anything else: just end
        code = 1
    os._exit(code)


class EarlyPlan:
    """A planner process forked before the launcher's heavy imports; see the module docstring."""

    def __init__(self, pid: int, read_fd: int):
        self._pid = pid
        self._read_fd = read_fd

    @classmethod
    def start(cls, args: Any) -> EarlyPlan | None:
        """Fork the planner for the command line `args` (what `cli.parse` returned), or None when
        the fork fails (the launcher then plans itself)."""
        read_fd, write_fd = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            with warnings.catch_warnings():  # Python 3.12+ warns of forking with threads (--verbose's log copier)
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
        except OSError:
            os.close(read_fd)
            os.close(write_fd)
            return None
        if pid == 0:
            os.close(read_fd)
            _planner(args, write_fd)
        os.close(write_fd)
        return cls(pid, read_fd)

    def result(self, *, output_url: str, previous_root: str | None, incremental: bool, grace: float | None = GRACE_SECONDS):
        """The plan the planner made, when it was done (or is within `grace` seconds; None: however
        long it takes) and made with these arguments of `make_plan`; raises what the planner
        raised; None when the launcher must plan itself."""
        if self._pid is None:
            return None
        try:
            outcome = self._receive(grace)
        finally:
            self.cancel()
        if outcome is None:
            return None
        planned_url, planned_previous, kind, *rest = outcome
        if kind == "replan":
            _LOG.info("planning on the launcher: %s", rest[0])
            return None
        if planned_url != output_url or (incremental and planned_previous != previous_root):
            _LOG.info("planning on the launcher: the early plan was made for another previous output")
            return None
        if kind == "error":
            error, text = rest
            error.add_note(f"(raised while planning in the early planner; its traceback:)\n{text}")
            raise error
        return rest[0]

    def _receive(self, grace: float | None):
        ready, _, _ = select.select([self._read_fd], [], [], grace)
        if not ready:
            _LOG.info("planning on the launcher: the early planner was not done when the launcher was ready")
            return None
        chunks = []
        with os.fdopen(self._read_fd, "rb", closefd=True) as pipe:
            self._read_fd = None
            header = pipe.read(_LENGTH.size)
            if len(header) != _LENGTH.size:
                _LOG.info("planning on the launcher: the early planner ended without an answer")
                return None
            remaining = _LENGTH.unpack(header)[0]
            while remaining:
                chunk = pipe.read(min(remaining, 1 << 24))
                if not chunk:
                    return None
                chunks.append(chunk)
                remaining -= len(chunk)
        try:
            return pickle.loads(b"".join(chunks))  # noqa: S301 - written by our own forked child, never read from storage
        except Exception:  # noqa: BLE001
            return None

    def cancel(self) -> None:
        """Stop the planner (if it still runs) and reap it; idempotent."""
        if self._read_fd is not None:
            os.close(self._read_fd)
            self._read_fd = None
        if self._pid is not None:
            try:
                os.kill(self._pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                os.waitpid(self._pid, 0)
            except ChildProcessError:
                pass
            self._pid = None
