"""Plan in a forked process while the launcher imports Beam (issue 28's serial head).

A conversion's first second and a half went to importing Beam (1.3-1.5 s, one core) and the next
one to planning (reading the source's metadata, 0.75 s at 20,000 LeRobot episodes, plus 0.25 s of
fingerprints), one after the other, while every other core waited. Neither needs the other: the
plan is made without Beam (`pipelines.plan`). So `convert` forks this planner right after reading
its command line, before the heavy import, and the launcher asks for the plan where it would have
made it (`pipelines.conversion.build_pipeline`), after checking the command line against Beam's
options and preparing the output exactly as before.

The early plan is only ever a head start, never a different plan: it is `make_plan` on the same
command line, used only where the launcher would have called `make_plan` with the same arguments
(the same output URL; its created_at is when it planned) and only when the planner is done by then (GRACE_SECONDS, below: a plan that
takes longer than Beam's import is too big to be worth sending). An --incremental run is planned
on the launcher, as before: it reads the previous output, which must wait for the launcher's
check that no other run is publishing there. A refusal the planner hit is raised in the launcher
as it was raised there, at the moment the launcher would have planned, so the checks before
planning still answer first; a refusal that does not cross a pipe whole (one with a cause or a
context, which pickling drops: the launcher names a full disk from them), a crash, a kill, or a planner not done in time make
the launcher plan itself, as it did before. The planner sends only its answer, through a pipe
(its log lines and warnings go to the run's log like the launcher's), takes SIGINT and SIGTERM
with the default action (it just ends), dies with the launcher (PR_SET_PDEATHSIG), and is killed
when the launcher no longer needs it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import signal
import struct
import sys
import threading
import traceback
import warnings
from collections.abc import Callable
from typing import Any

from pipelines import local_workers

__all__ = ["EarlyPlan", "wanted"]

_LOG = logging.getLogger("mixtrain-convert")
_LENGTH = struct.Struct(">Q")
# How long a ready launcher waits for a planner that is not done. The plan crosses the pipe
# pickled (2-3 us a LeRobot ref each way, and the planner's copy of it in memory meanwhile), so a
# planner still at work when the launcher is ready has a plan too big to be worth sending (when
# the launcher always waited: 1.33x its time at 100,000 episodes, 1.5x at 400,000). It is stopped
# and the launcher plans, as it did without it: a large plan loses at most this, a small one
# gains up to the whole of its planning.
GRACE_SECONDS = 0.2
# And a plan of more refs than this is not sent even when it is done in time (a slow import):
# the fingerprints it carries (computed in the planner) would stay in the launcher's memory.
MAX_REFS = 100_000
_PR_SET_PDEATHSIG = 1
_REFUSAL, _OTHER = b"E", b"P"  # after the length: whether the answer is a refusal (read at once, see `start`)


def wanted(args: Any) -> bool:
    """Whether to plan early: where the launcher can fork, and not for --incremental (see the
    module docstring)."""
    return local_workers.can_fork() and not args.incremental


def _crosses_whole(error: BaseException) -> bool:
    """The refusal reads the same in the launcher: no cause or context (which pickling drops and
    the launcher's messages search), and type, arguments and attributes equal after the trip."""
    if error.__cause__ is not None or error.__context__ is not None:
        return False
    try:
        back = pickle.loads(pickle.dumps(error, protocol=pickle.HIGHEST_PROTOCOL))  # noqa: S301 - our own bytes
    except Exception:  # noqa: BLE001
        return False
    return type(back) is type(error) and back.args == error.args and vars(back) == vars(error) and str(back) == str(error)


def _outcome(args: Any) -> tuple:
    """What the planner sends back: the output URL it planned for, then ("plan", plan), ("error",
    exception, its traceback text), or ("replan", why) when the launcher should plan itself."""
    from formats import storage  # here, not above: the launcher forks before importing anything heavy
    from pipelines import plan as planning

    try:
        output_url = storage.url_for(*storage.open_root(args.output))
    except Exception as error:  # noqa: BLE001 - the launcher's own checks say it, before planning
        return (None, "replan", f"{type(error).__name__} opening the output")
    try:
        plan = planning.make_plan(args, output_url=output_url, created_at=planning.created_now())
    except Exception as error:  # noqa: BLE001 - sent back whole when it can be, else the launcher replans
        if not _crosses_whole(error):
            return (output_url, "replan", f"the planner's {type(error).__name__} does not cross a pipe whole")
        return (output_url, "error", error, "".join(traceback.format_exception(type(error), error, error.__traceback__)))
    if len(plan.refs) > MAX_REFS:
        return (output_url, "replan", f"{len(plan.refs)} refs: more than {MAX_REFS} are planned on the launcher")
    # The fingerprints as the publish step will read them, computed here too (a quarter of
    # planning at 20,000 episodes): the same units, in the same order.
    return (output_url, "plan", dataclasses.replace(plan, fingerprints=dataclasses.replace(plan.fingerprints, known=plan.fingerprints.units)))


def _die_with(parent: int) -> None:
    """SIGKILL this process when the launcher's thread that forked it (its main thread: the
    whole launcher) ends; a planner blocked on a slow store would otherwise live on, holding the
    launcher's stdout open."""
    try:
        import ctypes

        if ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
            _LOG.info("the early planner could not ask to die with the launcher (prctl failed)")
    except (ImportError, OSError, AttributeError):  # no prctl: the launcher's cancel and the broken pipe still end it
        _LOG.info("the early planner could not ask to die with the launcher (no prctl)")
    if os.getppid() != parent:  # the launcher died before the line above
        os._exit(1)


def _planner(args: Any, write_fd: int, parent: int) -> None:
    """The forked child: plan, write the answer, leave without any clean-up of the launcher's."""
    code = 0
    try:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGINT, signal.SIGTERM))
        _die_with(parent)
        outcome = _outcome(args)
        kind = _REFUSAL if outcome[1] == "error" else _OTHER
        try:
            data = pickle.dumps(outcome, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as error:  # noqa: BLE001 - a plan that cannot be pickled: the launcher plans itself
            kind, data = _OTHER, pickle.dumps((None, "replan", f"the plan does not pickle: {type(error).__name__}"),
                                              protocol=pickle.HIGHEST_PROTOCOL)
        with os.fdopen(write_fd, "wb") as pipe:
            pipe.write(_LENGTH.pack(len(data)) + kind)
            pipe.write(data)
    except BaseException:  # noqa: BLE001 - the launcher went away (a broken pipe) or anything else: just end
        code = 1
    os._exit(code)


class EarlyPlan:
    """A planner process forked before the launcher's heavy imports; see the module docstring."""

    def __init__(self) -> None:
        self._pid: int | None = None
        self._answer: tuple[bytes, bytes] | None = None  # (kind, pickled outcome), once received
        self._received = threading.Event()
        self._reader: threading.Thread | None = None
        self._refusing = threading.Lock()  # held by the reader while it says a refusal and ends the process
        self._launcher_went_on = False  # once the launcher is past Beam's import, a refusal waits for `result`

    def start(self, args: Any, on_refusal: Callable[[BaseException], None] | None = None) -> bool:
        """Fork the planner for the command line `args` (what `cli.parse` returned); False when
        the fork fails (the launcher then plans itself). SIGINT and SIGTERM wait until the fork is
        done and each side holds what it needs (the child its own signal handling, this object the
        child's pid, for `cancel`): an interrupt in between would unwind the child through the
        launcher's clean-up, or lose the child. (Blocked in this thread; the launcher's one other
        thread, --verbose's log copier, blocks them for good.)

        A thread receives the answer as raw bytes while the launcher imports Beam (never unpickling
        a plan there: a fork of the launcher meanwhile must find no lock held); a refusal, small,
        is unpickled at once and handed to `on_refusal` when given, which may end the launcher
        without waiting for Beam's import (`pipelines.convert`)."""
        read_fd, write_fd = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        parent = os.getpid()
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGINT, signal.SIGTERM))
        try:
            try:
                with warnings.catch_warnings():  # Python 3.12+ warns of forking with threads (--verbose's log copier)
                    warnings.simplefilter("ignore", DeprecationWarning)
                    pid = os.fork()
            except OSError:
                os.close(read_fd)
                os.close(write_fd)
                return False
            if pid == 0:
                os.close(read_fd)
                _planner(args, write_fd, parent)
            os.close(write_fd)
            self._pid = pid
            self._reader = threading.Thread(target=self._receive, args=(read_fd, on_refusal), name="mixtrain-early-plan",
                                            daemon=True)
            self._reader.start()
            return True
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def result(self, *, output_url: str, grace: float | None = GRACE_SECONDS):
        """The plan the planner made, when it was done (or is within `grace` seconds; None: however
        long it takes) and made for this output URL; raises what the planner raised; None when the
        launcher must plan itself."""
        if self._pid is None and self._reader is None:
            return None
        try:
            received = self._received.wait(grace)
            if not received:
                _LOG.info("planning on the launcher: the early planner was not done when the launcher was ready")
        finally:
            self.cancel()
        if not received or self._answer is None:
            return None
        try:
            outcome = pickle.loads(self._answer[1])  # noqa: S301 - written by our own forked child, never read from storage
        except Exception:  # noqa: BLE001
            return None
        planned_url, kind, *rest = outcome
        if kind == "replan":
            _LOG.info("planning on the launcher: %s", rest[0])
            return None
        if planned_url != output_url:
            _LOG.info("planning on the launcher: the early plan was made for %s, not %s", planned_url, output_url)
            return None
        if kind == "error":
            error, text = rest
            _LOG.info("the early planner refused the input; its traceback:\n%s", text)
            raise error
        _LOG.info("the plan was made by the early planner while Beam was imported")
        return rest[0]

    def _receive(self, read_fd: int, on_refusal: Callable[[BaseException], None] | None) -> None:
        """The reader thread: the planner's answer as bytes (nothing when it ends without one)."""
        try:
            with os.fdopen(read_fd, "rb", closefd=True) as pipe:
                header = pipe.read(_LENGTH.size + 1)
                if len(header) != _LENGTH.size + 1:
                    _LOG.info("planning on the launcher: the early planner ended without an answer")
                    return
                remaining, chunks = _LENGTH.unpack(header[:-1])[0], []
                while remaining:
                    chunk = pipe.read(min(remaining, 1 << 24))
                    if not chunk:
                        return
                    chunks.append(chunk)
                    remaining -= len(chunk)
            self._answer = (header[-1:], b"".join(chunks))
        finally:
            self._received.set()
        if self._answer[0] == _REFUSAL and on_refusal is not None:
            try:
                _, kind, error, text = pickle.loads(self._answer[1])  # noqa: S301 - our own child's bytes
            except Exception:  # noqa: BLE001 - said where the launcher plans, as before
                return
            with self._refusing:
                if self._launcher_went_on:  # it may have written (a staging folder): it says the refusal itself
                    return
                _LOG.info("the early planner refused the input; its traceback:\n%s", text)
                on_refusal(error)  # ends the process

    def launcher_goes_on(self) -> None:
        """The launcher is past Beam's import and about to touch the output: from now on a refusal
        is raised by `result`, in the launcher's own order, never said early (after waiting for a
        reader that is saying one, and so ends the process)."""
        with self._refusing:
            self._launcher_went_on = True

    def cancel(self) -> None:
        """Stop the planner (if it still runs), reap it and let the reader thread end; idempotent."""
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
        if self._reader is not None and self._reader is not threading.current_thread():
            self._reader.join(timeout=5)  # the pipe's writer is gone: its read ends
