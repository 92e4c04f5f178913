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
