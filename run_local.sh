#!/usr/bin/env bash
# One command to set up and run mixtrain-convert locally.
#   ./run_local.sh                 set up .venv, write a synthetic LeRobot v3 sample, convert it, validate it, write its HTML report
#   ./run_local.sh test            set up .venv and run the whole test suite (and ruff)
#   ./run_local.sh bench [ARGS]    set up .venv and run the benchmark suite bench/run.py (minutes, not part of the tests)
#   ./run_local.sh fuzz [N|Ns] [HARNESS...]  set up .venv and fuzz every parser (or those named): N executions or N
#                                  seconds each (default 1000000), one after another, niced; see docs/fuzzing.md
#   ./run_local.sh ARGS...         run `python -m pipelines.convert ARGS...` inside .venv
set -euo pipefail
cd "$(dirname "$0")"
VENV=${MIXTRAIN_VENV:-.venv}
PYTHON=${PYTHON:-python3}

# SVT-AV1 prints its configuration on every encode; errors only.
export SVT_LOG=${SVT_LOG:-1}

setup() {
  local stamp="$VENV/.installed-$(cat setup.py BEAM_VERSION | sha1sum | cut -c1-12)"
  if [ ! -f "$stamp" ]; then
    [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    "$VENV/bin/python" -m pip install --quiet -e ".[test]"
    touch "$stamp"
  fi
}

# The HTML report's test loads the page in headless Chromium (the Debian package). Installed here
# when missing and this runs as root with apt-get; otherwise that one test skips, saying why.
ensure_chromium() {
  if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
    return
  fi
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing chromium (apt-get) for the HTML report's browser test"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } \
      || echo "note: chromium could not be installed: the report's browser test will skip" >&2
  else
    echo "note: chromium is not installed (apt-get install chromium as root): the report's browser test will skip" >&2
  fi
}

setup
case "${1:-}" in
  "")
    rm -rf sample
    "$VENV/bin/python" -m pipelines.make_sample sample/lerobot_v3
    "$VENV/bin/python" -m pipelines.convert --input=sample/lerobot_v3 --output=sample/mixtrain \
      --direct_num_workers=2 --direct_running_mode=multi_processing
    "$VENV/bin/python" -m pipelines.validate sample/mixtrain
    "$VENV/bin/python" -m pipelines.inspect sample/mixtrain --html sample/report.html  # prints the summary and "report: PATH"
    ;;
  test)
    shift
    ensure_chromium
    "$VENV/bin/ruff" check .
    # Test files spread over the cores (--dist loadfile: a file's module fixtures are made once);
    # MIXTRAIN_TEST_PROCESSES=0 runs them in this one process. A test process that dies (a crash in a
    # native library) ends the run, failed: replaced, pytest-xdist with loadfile was seen to wait for ever.
    "$VENV/bin/python" -m pytest -q -n "${MIXTRAIN_TEST_PROCESSES:-auto}" --maxprocesses=4 --dist loadfile --max-worker-restart=0 "$@"
    ;;
  bench)
    shift
    "$VENV/bin/python" bench/run.py "$@"  # the suite; bench/bench_*.py are run one by one
    ;;
  fuzz)
    shift
    budget=1000000
    if [[ "${1:-}" =~ ^[0-9]+s?$ ]]; then budget=$1; shift; fi
    exec nice -n 19 "$VENV/bin/python" -m fuzz.run --budget "$budget" --work "${FUZZ_WORK:-fuzz-work}" "$@"
    ;;
  *)
    exec "$VENV/bin/python" -m pipelines.convert "$@"
    ;;
esac
