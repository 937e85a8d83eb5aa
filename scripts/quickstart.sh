#!/usr/bin/env bash
# README command 1: install rstar2, then run the main job on its embedded CPU default.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec .venv/bin/rstar2 demo --config configs/toy/cpu.yaml "$@"
