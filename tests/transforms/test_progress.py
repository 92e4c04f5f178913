"""Workers' progress reports: summed and sent at most every SEND_SECONDS, the rest sent soon after."""

import json
import os
import socket
import time
import uuid

from transforms import progress


def test_reports_are_summed_into_few_datagrams_and_the_last_ones_still_arrive(monkeypatch):
    name = f"mixtrain-progress-test-{os.getpid()}-{uuid.uuid4().hex}"
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind("\0" + name)
    receiver.settimeout(2.0)
    monkeypatch.setenv(progress.ENV, name)
    monkeypatch.setattr(progress, "_last_sent", 0.0)
    try:
        for _ in range(500):
            progress.report(sequences=1, timesteps=50)
        started = time.monotonic()
        datagrams, totals = 0, {"sequences": 0, "timesteps": 0}
        while totals["sequences"] < 500:
            counts = json.loads(receiver.recv(4096))
            datagrams += 1
            for key, value in counts.items():
                totals[key] += value
        assert totals == {"sequences": 500, "timesteps": 25_000}
        assert datagrams <= 3  # the first at once, the rest summed by the sending thread
        assert time.monotonic() - started < 1.0
    finally:
        receiver.close()


def test_two_runs_in_one_process_each_get_their_own_counts(monkeypatch):
    """Counts pending for one run's socket never go to another's (two conversions 0.1 s apart in
    one process), and flush sends them at once."""
    receivers = {}
    for run in ("a", "b"):
        name = f"mixtrain-progress-test-{run}-{os.getpid()}-{uuid.uuid4().hex}"
        receivers[run] = (name, socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM))
        receivers[run][1].bind("\0" + name)
        receivers[run][1].settimeout(2.0)
    try:
        monkeypatch.setattr(progress, "_last_sent", time.monotonic())  # the next reports wait for the thread
        monkeypatch.setenv(progress.ENV, receivers["a"][0])
        progress.report(sequences=3)
        monkeypatch.setenv(progress.ENV, receivers["b"][0])
        progress.report(sequences=5)
        progress.flush()
        assert json.loads(receivers["a"][1].recv(4096)) == {"sequences": 3}
        assert json.loads(receivers["b"][1].recv(4096)) == {"sequences": 5}
    finally:
        for _, receiver in receivers.values():
            receiver.close()


def test_the_launchers_receiver_counts_every_report_sent_before_the_run_ends_and_stops_at_once(monkeypatch):
    """The receiver waits on its socket RECEIVE_SECONDS (0.2 s) at a time; leaving the run wakes
    it, after it has read what was queued (it cost every run up to 0.2 s at its end). The wait is
    made 5 s here, so that a receiver left to its timeout cannot pass for a woken one."""
    import io

    from pipelines import progress as launcher_progress
    from pipelines.progress import Progress

    monkeypatch.setattr(launcher_progress, "RECEIVE_SECONDS", 5.0)

    with Progress(io.StringIO(), "off", 60, 1000, 1) as receiver:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
            time.sleep(0.05)
            for number in range(200):
                if number == 190:  # a stray empty datagram (anyone can send one) is not taken for the end of the run
                    sender.sendto(b"", "\0" + os.environ[progress.ENV])
                sender.sendto(json.dumps({"sequences": 1, "timesteps": 7}).encode(), "\0" + os.environ[progress.ENV])
        leaving = time.monotonic()
    assert time.monotonic() - leaving < 1.0
    assert receiver.totals["sequences"] == 200 and receiver.totals["timesteps"] == 1400


def test_the_receiver_outlives_hostile_datagrams_and_leaving_never_blocks():
    """Anyone on the machine can send to the abstract socket: a deeply nested JSON array (a
    RecursionError, which killed the receiver) is ignored and the reports after it counted; a queue
    filled past its length while nobody reads it does not block leaving the run."""
    import io
    import threading

    from pipelines.progress import Progress

    receiver = Progress(io.StringIO(), "off", 60, 10, 1).__enter__()
    address = "\0" + os.environ[progress.ENV]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
        sender.sendto(b"[" * 4000, address)
        for _ in range(5):
            sender.sendto(json.dumps({"sequences": 2}).encode(), address)
        deadline = time.monotonic() + 2
        while receiver.totals["sequences"] < 10 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert receiver.totals["sequences"] == 10
        assert all(thread.is_alive() for thread in receiver._threads)
        sender.sendto(b"", address)  # an empty datagram is no end-of-run signal: the receiver goes on
        sender.sendto(json.dumps({"sequences": 1}).encode(), address)
        deadline = time.monotonic() + 2
        while receiver.totals["sequences"] < 11 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert receiver.totals["sequences"] == 11 and receiver._threads[0].is_alive()
    receiver._stop.set()  # the receiver stopped for good, then its queue filled by others
    receiver._wake()
    receiver._threads[0].join(timeout=2)
    assert not receiver._threads[0].is_alive()
    full = False
    for _ in range(10_000):  # fresh senders until even a fresh one finds no room (the queue's length, not a sender's buffer)
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as filler:
            filler.setblocking(False)
            try:
                filler.sendto(b"{}", address)
            except BlockingIOError:
                full = True
                break
            try:
                while True:
                    filler.sendto(b"{}", address)
            except BlockingIOError:
                pass
    assert full
    leaving = threading.Thread(target=receiver.__exit__, args=(None, None, None), daemon=True)
    leaving.start()
    leaving.join(timeout=2.5)
    assert not leaving.is_alive()


def test_reports_from_outside_the_run_are_ignored_whatever_they_hold():
    """A process the run did not start (here one reparented away from this one) is not counted,
    even with well-formed counts; and a count no run reaches (a 4,000-digit number, which killed
    the drawing thread) is dropped from a report of the run's own."""
    import io
    import subprocess
    import sys

    from pipelines.progress import Progress

    with Progress(io.StringIO(), "lines", 0.05, 10, 1) as receiver:
        address = "\0" + os.environ[progress.ENV]
        outsider = ("import os, socket, sys, time\n"
                    "if os.fork(): os._exit(0)\n"  # the child is reparented: not below the launcher any more
                    "time.sleep(0.2)\n"
                    "with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:\n"
                    "    s.sendto(b'{\"sequences\": 5}', '\\0' + sys.argv[1])\n"
                    "    print('sent', flush=True)\n"
                    "    time.sleep(1)\n")  # alive while its datagram is read (one from a process gone by then is judged by its user)
        done = subprocess.run([sys.executable, "-c", outsider, os.environ[progress.ENV]], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0 and done.stdout == "sent\n"  # run() waited for the reparented sender to close the pipe
        time.sleep(0.3)
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
            sender.sendto(json.dumps({"sequences": 1, "timesteps": int("9" * 4000)}).encode(), address)
            sender.sendto(json.dumps({"sequences": 2, "bytes": True}).encode(), address)
        deadline = time.monotonic() + 2
        while receiver.totals["sequences"] < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        assert receiver.totals == {**receiver.totals, "sequences": 3, "timesteps": 0, "bytes": 0}
        assert all(thread.is_alive() for thread in receiver._threads)
