"""Local multi-process workers forked from the warm launcher instead of started cold.

Beam's DirectRunner in multi_processing mode starts each worker as a fresh interpreter that imports
Beam, Arrow, PyAV and our modules again: about 1.2 s and 1.5 s of CPU per worker before any
work, which on a 2-core machine made 2 workers slower than 1 on every benchmark workload. Here
the launcher, once it has imported all of that, forks a "zygote" process that forks a ready
worker for each of Beam's worker command lines (the forkserver idea of Python's
multiprocessing). Nothing is imported twice.

Beam still starts and stops the workers: its command line becomes `python -m
pipelines.local_workers connect NAME LAUNCHER_PID` (NAME: an abstract Unix socket), a client that passes its environment (the
control and logging addresses Beam sets) to the zygote and exits with the forked worker's
status. If the zygote cannot fork one, the client execs Beam's own worker command instead. When
the launcher dies, the zygote kills its workers and exits, and late clients exit too.
"""

from __future__ import annotations

import json
import os
import re
import select
import shlex
import signal
import socket
import struct
import sys
import time
import uuid
import warnings

from pipelines.failures import RunnerLost

BEAM_WORKER = ("-m", "apache_beam.runners.worker.sdk_worker_main")


def can_fork() -> bool:
    """Whether this launcher forks helpers (the zygote, the early planner): on Linux; elsewhere
    fork is unavailable (Windows) or unsafe after some imports (macOS)."""
    return sys.platform.startswith("linux")


def wanted(argv: list[str]) -> bool:
    """The command line asks for local multi-process workers (DirectRunner is the default runner),
    where the launcher can fork (`can_fork`); elsewhere Beam's own cold workers are used. One
    worker too (issue 42): a user who asks for a worker process gets it warm from the zygote, not
    Beam's cold start (40 LeRobot episodes on 2 cores: 1.99 s against 3.41 s, the same bytes)."""
    if not can_fork():
        return False
    from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions

    options = PipelineOptions(argv)  # Beam's own parsing: --key=value and --key value alike
    direct = options.view_as(DirectOptions)
    return (options.view_as(StandardOptions).runner in (None, "DirectRunner", "FnApiRunner")
            and direct.direct_running_mode == "multi_processing")


def codec_threads(num_workers: int | None) -> int:
    """Threads each encode and decode may use when `num_workers` (--direct_num_workers; 0: one per
    core) convert side by side on this machine: its cores shared among them (2 cores, 2 workers:
    1 each). Left to themselves libx264 and the decoders take every core in every worker, so a
    second worker only added contention (RLDS encoding: 62 s with 2 workers, 72 s with 1). x264 and
    x265, whose bytes follow their thread count, ignore it (formats.video.FIXED_ENCODER_THREADS)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    workers = cores if num_workers == 0 else max(1, num_workers or 1)
    return max(1, cores // workers)


class Zygote:
    """The warm process, forked from the launcher after its imports; stopped when the run ends."""

    def __init__(self) -> None:
        from apache_beam.runners.worker import sdk_worker_main  # the workers' entry point, imported before the fork

        import transforms.read  # noqa: F401 - what the workers' DoFns unpickle into, imported once here
        import transforms.reuse  # noqa: F401
        import transforms.video  # noqa: F401
        import transforms.write  # noqa: F401

        # A Linux abstract socket: no file to clean up after a kill, no TMPDIR length or quoting issue.
        self.name = f"mixtrain-workers-{os.getpid()}-{uuid.uuid4().hex}"
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind("\0" + self.name)
        listener.listen(64)
        # A pipe the zygote watches: "stop" ends the run; its end without "stop" means the launcher died.
        control, self._control = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        with warnings.catch_warnings():  # Python 3.12+ warns of forking with threads: Arrow's are fork-safe
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            status = 1
            try:
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the launcher stops the zygote
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.close(self._control)
                _serve(listener, control, sdk_worker_main)
                status = 0
            finally:
                os._exit(status)  # never back into the launcher's code
        os.close(control)
        listener.close()
        self._pid = pid

    def command(self) -> str:
        """Beam's worker command line, through the zygote."""
        return f"{shlex.quote(sys.executable)} -m pipelines.local_workers connect {self.name} {os.getpid()}"

    def stop(self) -> None:
        if self._control < 0:
            return
        try:
            os.write(self._control, b"stop")
        except OSError:
            pass
        os.close(self._control)
        self._control = -1
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if os.waitpid(self._pid, os.WNOHANG)[0]:  # waited for: its and its workers' CPU time is accounted
                break
            time.sleep(0.01)
        else:
            os.kill(self._pid, signal.SIGKILL)
            os.waitpid(self._pid, 0)


def _serve(listener: socket.socket, control: int, sdk_worker_main) -> None:
    children: dict[int, socket.socket] = {}  # worker -> its client's connection, to say how it ended
    # For tests: a slower reap, so that a killed worker's death is heard well after its channel failed.
    try:
        reap_seconds = max(0.01, float(os.environ.get("MIXTRAIN_TEST_REAP_SECONDS") or REAP_SECONDS))
    except ValueError:
        reap_seconds = REAP_SECONDS
    while True:
        ready, _, _ = select.select([listener, control], [], [], reap_seconds)
        _reap(children, block=False)
        if control in ready:
            message = os.read(control, 1024)
            # "stop": the run is over, workers are finishing; end of input alone: the launcher died
            # (a worker would wait for its lost runner for a long time). Either way every worker is
            # waited for, so its CPU time counts among this process's children's.
            _stop_children(children, grace=10.0 if b"stop" in message else 0.0)
            listener.close()  # later clients (the launcher is gone) find no zygote
            return
        if listener not in ready:
            continue
        connection, _ = listener.accept()
        try:
            connection.settimeout(10)  # a client that connects and says nothing must not block the others
            environment = json.loads(_receive(connection))
            connection.settimeout(None)
            with warnings.catch_warnings():  # Python 3.12+ warns of forking with threads: Arrow's are fork-safe
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
        except (OSError, EOFError, ValueError):  # a client that left, or no fork possible: it starts cold
            connection.close()
            continue
        if pid == 0:
            _work(listener, connection, environment, sdk_worker_main)  # never returns
        children[pid] = connection


def _work(listener: socket.socket, connection: socket.socket, environment: dict, sdk_worker_main) -> None:
    """The forked child: become Beam's worker with the client's environment; always ends the process."""
    status = 1
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a worker stops on Ctrl-C, as a cold one does
        listener.close()
        os.environ.clear()
        os.environ.update(environment)
        connection.sendall(b"F")  # forked: from here on the client waits for this worker's status
        if os.environ.get("MIXTRAIN_TEST_STOP_AT") == "worker:forked":  # publish.STOP_AT, for tests: dead before it connects
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            sdk_worker_main.main([])
            status = 0
        except SystemExit as exit_:
            status = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        connection.sendall(bytes([status & 0xFF]))
    except BaseException:  # noqa: BLE001 - Beam logs its own failures; the status says it failed
        pass
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def _stop_children(children: dict[int, socket.socket], grace: float) -> None:
    deadline = time.monotonic() + grace
    while children and time.monotonic() < deadline:
        _reap(children, block=False)
        time.sleep(0.01)
    for pid in children:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _reap(children, block=True)


def _reap(children: dict[int, socket.socket], block: bool) -> None:
    """Wait for the workers that ended; a worker killed by a signal (which could not say its own
    status) is said to its client as 128 + the signal, the status a shell gives such a process."""
    for pid in list(children):
        try:
            finished, status = os.waitpid(pid, 0 if block else os.WNOHANG)
        except ChildProcessError:
            finished, status = pid, 0
        if not finished:
            continue
        connection = children.pop(pid)
        try:
            if os.WIFSIGNALED(status):
                connection.sendall(bytes([128 + os.WTERMSIG(status)]))
        except OSError:
            pass
        connection.close()


def _receive(connection: socket.socket) -> bytes:
    header = b""
    while len(header) < 4:
        chunk = connection.recv(4 - len(header))
        if not chunk:
            raise EOFError("client left")
        header += chunk
    size = struct.unpack(">I", header)[0]
    data = b""
    while len(data) < size:
        chunk = connection.recv(min(1 << 20, size - len(data)))
        if not chunk:
            raise EOFError("client left")
        data += chunk
    return data


def _connect(name: str, launcher: int) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the worker itself; this only relays its status
    try:
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        connection.connect("\0" + name)
        payload = json.dumps(dict(os.environ)).encode()
        connection.sendall(struct.pack(">I", len(payload)) + payload)
        forked = connection.recv(1) == b"F"
    except OSError:
        forked = False
    if not forked:
        if not _alive(launcher):
            return 1  # the run is over: no worker is wanted any more
        os.execv(sys.executable, [sys.executable, *BEAM_WORKER])  # no zygote to fork from: Beam's own cold start
    status = connection.recv(1)
    return status[0] if status else 1


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class WorkerDied(RunnerLost):
    """A local worker process ended while the run still needed it (the out-of-memory killer, a
    crash in a native library, a kill): Beam's runner would wait for its answer for ever."""


WATCHED_URN = "beam:env:mixtrain_watched_subprocess:v1"  # Beam's subprocess environment, its workers watched
REAP_SECONDS = 0.2  # how often the zygote looks for workers that ended
_ABORT_SECONDS = 0.2  # how often the requests a dead worker was sent are failed
DEATH_NOTICE_SECONDS = 5.0  # how long closing a worker whose channel failed waits to hear whether it died
_DEATHS: list[WorkerDied] = []  # the workers of the current run that ended before it was done
_WATCHED: list = []  # the current run's watched worker handlers


def runner(zygote: Zygote | None):
    """An FnApiRunner whose multi-process workers come from `zygote` (None: Beam's own cold
    workers), each one watched (`_watched_handler`): a worker that ends before the run is done
    fails the run in one line instead of leaving the launcher waiting for it."""
    from apache_beam.portability import python_urns
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    _register_watched_handler()

    class LocalRunner(FnApiRunner):
        def run_via_runner_api(self, pipeline_proto, options):
            for environment in pipeline_proto.components.environments.values():
                # The runner's own multi_processing worker: its payload is the command line.
                if environment.urn == python_urns.SUBPROCESS_SDK and environment.payload.decode().endswith(" ".join(BEAM_WORKER)):
                    if zygote is not None:
                        environment.payload = zygote.command().encode()
                    environment.urn = WATCHED_URN
            _DEATHS.clear()
            _WATCHED.clear()
            try:
                return super().run_via_runner_api(pipeline_proto, options)
            except Exception as error:
                # A killed worker first fails its data channel ("Channel closed prematurely"); the
                # runner has closed every worker's handler by now, each waiting to hear how its
                # worker ended (`close`): say what happened to the one that died.
                if _DEATHS and not isinstance(error, WorkerDied):
                    raise _DEATHS[0] from error
                raise

    return LocalRunner()


def how_it_ended(returncode: int | None) -> str:
    """A worker's exit status as a user reads it (a shell's 128 + N is signal N)."""
    if returncode is None:
        return "ended without an exit status"
    number = -returncode if returncode < 0 else returncode - 128 if returncode > 128 else None
    if number is None:
        return f"exited with status {returncode}"
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    return f"was killed by {name}" + (" (which the kernel's out-of-memory killer sends)" if name == "SIGKILL" else "")


def _register_watched_handler() -> None:
    """Beam's SubprocessSdkWorkerHandler, watched: when its worker process ends before the handler
    is closed, every request sent to any worker of the run, every one sent later, and every wait
    for their data fail with WorkerDied. Beam's own handler left them waiting for an answer that never comes (a worker
    that died before it connected hung the run; one that died after it, failed it on a closed
    channel, said as "RuntimeError: Channel closed prematurely")."""
    import threading

    from apache_beam.runners.portability import local_job_service
    from apache_beam.runners.portability.fn_api_runner import worker_handlers

    if WATCHED_URN in worker_handlers.WorkerHandler._registered_environments:
        return

    @worker_handlers.WorkerHandler.register_environment(WATCHED_URN, bytes)
    class WatchedWorkerHandler(worker_handlers.SubprocessSdkWorkerHandler):
        def __init__(self, *args, **kwargs):
            self._closing = threading.Event()  # set when the runner is done with the worker: its end is expected
            self._died: WorkerDied | None = None  # what its requests fail with, once a worker of the run died
            super().__init__(*args, **kwargs)
            _WATCHED.append(self)
            # Beam looks at its data channel's failure only after a second without data: a live
            # worker that streams its output steadily would be waited for to its end.
            receive = self.data_conn.input_elements

            def input_elements(*args, **kwargs):
                for element in receive(*args, **kwargs):
                    if self._died is not None:
                        raise self._died
                    yield element

            self.data_conn.input_elements = input_elements

        def start_worker(self):
            self.worker = local_job_service.SubprocessSdkWorker(self._worker_command_line, self.control_address,
                                                                self.provision_info, self.worker_id)
            self.worker_thread = threading.Thread(name="run_worker", target=self._run_watched, daemon=True)
            self.worker_thread.start()

        def _run_watched(self):
            try:
                self.worker.run()
                returncode = 0
            except Exception as error:  # noqa: BLE001 - Beam's "Worker subprocess exited with return code N", or no start
                found = re.search(r"return code (-?\d+)", str(error))
                returncode = int(found.group(1)) if found else None
            signalled = returncode is None or returncode < 0 or returncode > 128
            if self._closing.is_set() and not signalled:
                return  # the runner was done with it: its own end
            died = WorkerDied(f"a worker process of this run {how_it_ended(returncode)} before its work was done; "
                              "nothing was published")
            _DEATHS.append(died)
            # Every worker's requests fail, not only this one's: Beam's runner gathers a stage's
            # partitions in order, and would first wait for the live workers to finish their share.
            while not self._closing.is_set():
                for handler in list(_WATCHED):
                    handler._fail(died)
                self._closing.wait(_ABORT_SECONDS)  # what was sent meanwhile (a list: another thread may push)

        def _fail(self, died: WorkerDied) -> None:
            """Fail what was sent to this worker, what will be, and every wait for its data."""
            connection = self.control_conn
            if self._died is None:
                self._died, push = died, connection.push

                def failed(request):
                    future = push(request)
                    if future is not None:
                        future.abort(died)
                    return future

                connection.push = failed
                # A bundle also waits for the worker's data, polling its channel's failure every second
                # (apache_beam/runners/worker/data_plane.py, Beam 2.77: `_GrpcDataChannel._exception`).
                self.data_conn._exception = died
            for future in list(connection._futures_by_id.values()):
                future.abort(self._died)

        def close(self):
            self._closing.set()
            try:
                super().close()
            except Exception:  # noqa: BLE001 - a dead worker's channel re-raises its failure on closing, before Beam stops the worker
                # Its watcher may not have heard of the death yet (the channel can fail first, and
                # the zygote reaps every REAP_SECONDS): it is given DEATH_NOTICE_SECONDS to.
                if self._died is None:
                    self.worker_thread.join(DEATH_NOTICE_SECONDS)
                if self._died is None and not _DEATHS:
                    raise
                self.stop_worker()

if __name__ == "__main__":
    sys.exit(_connect(sys.argv[2], int(sys.argv[3])))
