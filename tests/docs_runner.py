"""Runs one page's code blocks in order, as a reader pastes them: `python tests/docs_runner.py BLOCKS.json RESULTS.json`.

Python blocks share one namespace (a page's later block continues its earlier ones, as a reader's
session does) and run in this process; bash blocks run with `bash -e -o pipefail` in a subprocess.
Stops at the first block that fails. Writes [{"line", "lang", "ok", "out", "err"}] for the blocks run.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import traceback


def main(blocks_path: str, results_path: str) -> int:
    # Not tests/ first on sys.path, as `python tests/docs_runner.py` puts it: its `formats` test
    # package would shadow the product's, which a reader's session never sees.
    sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or ".") != os.path.dirname(os.path.abspath(__file__))]
    blocks = json.loads(open(blocks_path).read())
    namespace: dict = {"__name__": "__main__"}
    results = []
    for block in blocks:
        if block["lang"] == "python":
            out, err = io.StringIO(), io.StringIO()
            ok = True
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    exec(compile(block["code"], f"{block['file']}:{block['line']}", "exec"), namespace)  # noqa: S102 - the documented block
                except BaseException:  # noqa: BLE001 - reported with the block's line
                    ok = False
                    traceback.print_exc()
            results.append({"line": block["line"], "lang": "python", "ok": ok, "out": out.getvalue(), "err": err.getvalue()})
        else:
            done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block["code"]], capture_output=True, text=True)
            results.append({"line": block["line"], "lang": "bash", "ok": done.returncode == 0, "out": done.stdout,
                            "err": done.stderr + (f"\n(exit status {done.returncode})" if done.returncode else "")})
        if not results[-1]["ok"]:
            break
    with open(results_path, "w") as handle:
        json.dump(results, handle)
    return 0


if __name__ == "__main__":
    code = main(*sys.argv[1:])
    # The results are written: no interpreter teardown, in which a native thread of a block's remote
    # read (Arrow over an fsspec file, docs/storage.md) was once seen to abort the runner (SIGABRT,
    # "terminate called without an active exception") after every block had passed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
