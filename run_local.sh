#!/usr/bin/env bash
# One command to set up and run mixtrain-convert locally.
#   ./run_local.sh                 set up .venv, write a synthetic LeRobot v3 sample, convert it, validate it
#   ./run_local.sh test            set up .venv and run the whole test suite (and ruff)
#   ./run_local.sh bench [ARGS]    set up .venv and run the benchmark suite bench/run.py (minutes, not part of the tests)
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

setup
case "${1:-}" in
  "")
    rm -rf sample
    "$VENV/bin/python" -m pipelines.make_sample sample/lerobot_v3
    "$VENV/bin/python" -m pipelines.convert --input=sample/lerobot_v3 --output=sample/mixtrain \
      --direct_num_workers=2 --direct_running_mode=multi_processing
    "$VENV/bin/python" -m pipelines.validate sample/mixtrain
    ;;
  test)
    shift
    "$VENV/bin/ruff" check .
    "$VENV/bin/python" -m pytest -q "$@"
    ;;
  bench)
    shift
    "$VENV/bin/python" bench/run.py "$@"  # the suite; bench/bench_*.py are run one by one
    ;;
  *)
    exec "$VENV/bin/python" -m pipelines.convert "$@"
    ;;
esac
