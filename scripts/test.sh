#!/usr/bin/env bash
# README command 2: install rstar2 with its dev tools, then lint, type-check and run the gate:
# every test but the `full` tier, and the benchmarks once as a smoke test. The gate runs on
# RSTAR2_TEST_WORKERS pytest-xdist workers (default 2: CI's two cores), one module per worker at
# a time, the longest first, then any `serial` test alone; RSTAR2_TEST_WORKERS=1: one process.
#   bash scripts/test.sh --full   the `full` tier (the Slurm cluster, the image build), which
#                                 records what it covered in tests/full_tier.hashes on a pass
#   bash scripts/test.sh ARGS     plain `pytest ARGS`
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh dev
export PATH="$(pwd)/.venv/bin:$PATH"
# every test's duration, slowest first (one block per pytest run), and the 25 slowest printed
results="${RSTAR2_TEST_RESULTS:-test-results}"
mkdir -p "$results"
export RSTAR2_DURATIONS_FILE="$(pwd)/$results/durations.txt"
if [[ "${1:-}" == "--full" ]]; then
  pytest -q --durations=25 -m full --junitxml="$results/junit-full.xml"
  python3 scripts/full_tier.py write
  exit 0
fi
ruff check .
ruff format --check .
mypy
if [[ $# -gt 0 ]]; then
  exec pytest -q "$@"
fi
: >"$RSTAR2_DURATIONS_FILE"
if [[ "${RSTAR2_TEST_WORKERS:-2}" -gt 1 ]]; then
  pytest -q --durations=25 -n "${RSTAR2_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder \
    -m "not serial and not full" --junitxml="$results/junit-parallel.xml"
  # exit 5: no serial test in the gate (none today), which is fine
  pytest -q --durations=25 -m "serial and not full" --junitxml="$results/junit-serial.xml" \
    || [[ $? -eq 5 ]]
else
  pytest -q --durations=25 -m "not full" --junitxml="$results/junit.xml"
fi
echo "test durations: $RSTAR2_DURATIONS_FILE"
# the benchmarks as a smoke test (no timing gate): each micro benchmark once, the quick suite
pytest -q -p no:cacheprovider perf --benchmark-disable
python -m perf run --quick --out "$(mktemp -d)"
