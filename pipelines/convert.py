"""Convert a dataset to Mixtrain v1.0: the command line.

    python -m pipelines.convert --input=SRC --output=DST [options] [Beam options]
    python -m pipelines.convert --help

Parsed here without importing Beam, so `--help` and a misspelt option answer at once; the
conversion itself is `pipelines.conversion.run`. stdout carries progress and the summary; stderr
carries only failures: one `error:` line naming the file and the sequence, and at most one hint
(the path of the run's log, where Beam's and the workers' logs go; `--verbose` also prints them).

Exit status: 0 converted; 1 bad input or a failed conversion (the output left as it was); 2 bad
command line; 3 converted with --on_error=skip but some sequences were skipped (DST/_errors.jsonl);
130 / 143 interrupted by SIGINT / SIGTERM (the output left as it was, the run's staging removed).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time

STARTED = time.monotonic()  # the summary's seconds count from here, imports included

from formats.text import for_terminal  # noqa: E402
from pipelines import cli, exit_without_teardown, preflight  # noqa: E402 - after the clock starts

__all__ = ["main", "run", "EXIT_OK", "EXIT_FAILED", "EXIT_USAGE", "EXIT_SKIPPED"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_SKIPPED = cli.EXIT_OK, cli.EXIT_FAILED, cli.EXIT_USAGE, cli.EXIT_SKIPPED


def _early(argv: list[str]) -> tuple[int | None, list[str]]:
    """Answer --help, --help_beam and whatever the command line alone refuses (pipelines/preflight.py)
    before any heavy import: (exit status or None to go on, the command line as meant)."""
    try:
        argv = preflight.as_meant(argv)
        args, rest = cli.parse(argv)
        if not (args.help or args.help_beam or args.version):
            preflight.check(args, argv, rest)
    except cli.UsageError as error:
        print(f"error: {for_terminal(error)}", file=sys.stderr)
        if error.hint:
            print(error.hint, file=sys.stderr)
        return EXIT_USAGE, argv
    except preflight.Refusal as error:
        print(f"error: {for_terminal(error)}", file=sys.stderr)
        return EXIT_FAILED, argv
    if args.help:
        cli.build_parser().print_help(sys.stdout)
        return EXIT_OK, argv
    if args.version:
        import formats

        print(f"mixtrain-convert {formats.__version__}")
        return EXIT_OK, argv
    if args.help_beam:
        from pipelines import conversion

        conversion.print_beam_help(sys.stdout)
        return EXIT_OK, argv
    return None, argv


def run(argv: list[str]) -> int:
    """Convert as `argv` says, in this process, printing to this process's stdout and stderr."""
    code, argv = _early(argv)
    if code is not None:
        return code
    from pipelines import conversion

    return conversion.run(argv)


def main() -> None:
    code, argv = _early(sys.argv[1:])
    if code is not None:
        sys.exit(code)
    args, _ = cli.parse(argv)
    from pipelines import early_plan
    from pipelines.session import Interrupted, LogError, Session, new_run_id

    run_id = new_run_id()
    zygote = planner = None
    session = Session(run_id, args.log_file, args.verbose)
    try:
        session.__enter__()
    except LogError as error:
        print(f"error: {for_terminal(error)}", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    with contextlib.closing(session):
        try:
            if early_plan.wanted(args):  # the plan is made in a forked process while Beam is imported here
                planner = early_plan.EarlyPlan()
                local = preflight.is_local_path(args.input) and preflight.is_local_path(args.output)
                planner.start(args, on_refusal=(lambda error: _refused_early(error, args, session)) if local else None)
            from pipelines import conversion, local_workers

            if planner is not None:
                planner.launcher_goes_on()

            if local_workers.wanted(argv):  # local multi-process workers: forked from this process's imports
                zygote = local_workers.Zygote()
            code = conversion.run(argv, console=session.console, run_id=run_id, started=STARTED,
                                  log_path=str(session.log_path) if session.log_path else None, zygote=zygote,
                                  early_plan=planner)
        except Interrupted as interrupt:  # before the conversion began (conversion.run answers for itself after)
            print(f"error: {for_terminal(interrupt.message())}", file=session.console)
            code = interrupt.exit_code
        except Exception as error:  # noqa: BLE001 - a fault of ours: one line here, the traceback in the log
            logging.getLogger("mixtrain-convert").error("internal error", exc_info=error)
            print(f"error: internal error: {type(error).__name__}: {for_terminal(error)}", file=session.console)
            if session.log_path:
                print(f"(the traceback is in {session.log_path})", file=session.console)
            code = EXIT_FAILED
        finally:
            session.ignore_signals()
            if planner is not None:
                planner.cancel()
            if zygote is not None:
                zygote.stop()
    exit_without_teardown(code)


def _refused_early(error: BaseException, args, session) -> None:
    """What the early planner refused, said while Beam is still being imported (the planner's
    thread calls this), as `conversion.run` would say it, and the process ended: no wait for an
    import whose pipeline would never run. Local input and output only (on object stores the
    launcher reaches the stores first); a live run writing the output is still said first, as the
    launcher's check before planning says it. Only while the launcher is importing Beam
    (`EarlyPlan.launcher_goes_on`): nothing was written yet."""
    from formats import storage
    from formats.errors import ConversionError
    from formats.mixtrain import publish
    from pipelines import failures

    try:
        fs, root = storage.open_root(args.output)
        publish.check_no_live_run(fs, root)
    except ConversionError as live:
        error = live
    code = failures.report(error, session.console, output=args.output, log_path=str(session.log_path) if session.log_path else None)
    session.leave_now(code)


if __name__ == "__main__":
    main()
