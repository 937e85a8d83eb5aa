#!/usr/bin/env bash
# README command 2: install rstar2 with its dev tools, then lint, type-check and run the tests
# (and, with no arguments, the benchmarks once as a smoke test).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh dev
export PATH="$(pwd)/.venv/bin:$PATH"
ruff check .
ruff format --check .
mypy
pytest -q "$@"
if [[ $# == 0 ]]; then
  # the benchmarks as a smoke test (no timing gate): each micro benchmark once, the quick suite
  pytest -q -p no:cacheprovider perf --benchmark-disable
  python -m perf run --quick --out "$(mktemp -d)"
fi
