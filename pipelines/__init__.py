"""The command lines (convert, validate, inspect, make_sample) and their wiring."""

from mixtrain_convert import _packages

_packages.pin()  # `python -m pipelines.convert` beside a user's transforms.py: our packages, not theirs


def command_name(command: str) -> str:
    """How the user ran `command` (convert, validate, inspect), for usage lines: the console script
    `mixtrain-<command>` or `python -m pipelines.<command>`."""
    import os
    import sys

    script = f"mixtrain-{command}"
    return script if os.path.basename(sys.argv[0] or "") == script else f"python -m pipelines.{command}"


def exit_without_teardown(code: int):
    """Flush and leave the process without interpreter teardown, where FFmpeg's and Arrow's native
    threads once aborted it after the result was printed ("terminate called without an active
    exception", status 134), and where Beam's non-daemon gRPC threads could hold an interrupted run."""
    import os
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
