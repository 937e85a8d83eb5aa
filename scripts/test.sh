#!/usr/bin/env bash
# README command 2: install rstar2 with its dev tools, then lint, type-check and run the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh dev
export PATH="$(pwd)/.venv/bin:$PATH"
ruff check .
ruff format --check .
mypy
pytest -q "$@"
