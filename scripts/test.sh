#!/usr/bin/env bash
# README command 2: install rstar2 with its dev tools, then lint, type-check and run the tests
# (and, with no arguments, the benchmarks once as a smoke test). With no arguments the tests run
# in one process (CI), or with RSTAR2_TEST_WORKERS=N > 1 on N pytest-xdist workers, one module
# per worker at a time, then the `serial` tests alone; with arguments, plain `pytest ARGS`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh dev
export PATH="$(pwd)/.venv/bin:$PATH"
ruff check .
ruff format --check .
mypy
if [[ $# -gt 0 ]]; then
  exec pytest -q "$@"
fi
# every test's duration, slowest first (one block per pytest run), and the 25 slowest printed
results="${RSTAR2_TEST_RESULTS:-test-results}"
mkdir -p "$results"
export RSTAR2_DURATIONS_FILE="$results/durations.txt"
: >"$RSTAR2_DURATIONS_FILE"
if [[ "${RSTAR2_TEST_WORKERS:-1}" -gt 1 ]]; then
  pytest -q --durations=25 -n "$RSTAR2_TEST_WORKERS" --dist loadfile --no-loadscope-reorder \
    -m "not serial"
  pytest -q --durations=25 -m serial
else
  pytest -q --durations=25 --junitxml="$results/junit.xml"
fi
echo "test durations: $RSTAR2_DURATIONS_FILE"
# the benchmarks as a smoke test (no timing gate): each micro benchmark once, the quick suite
pytest -q -p no:cacheprovider perf --benchmark-disable
python -m perf run --quick --out "$(mktemp -d)"
