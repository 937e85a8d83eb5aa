#!/usr/bin/env bash
# The GPU tier: every `gpu`-marked test (the list is tests/gpu_tier.txt), run on a GPU machine
# with a CUDA vLLM, one pytest process per test module, each writing pytest's junit XML.
#   bash scripts/gpu_tier.sh                 every module, one after another
#   bash scripts/gpu_tier.sh sync_gpu ...    only these modules (tests/integration/test_NAME.py)
#   bash scripts/gpu_tier.sh train_gpu:torch  a module's tests matching a pytest -k expression
# Results go to $GPU_TIER_OUT (default: $OUT where the device tool sets it, else gpu-tier-results/):
# junit-NAME.xml per module, log.txt (every module's output), versions.txt (card, driver, torch, vLLM, Ray, commit).
# On the lent GPU host the vLLM staged by ../shared/gpu/stage-vllm.sh is used (/root/vllm), and
# installed from /root/staged first if it is not yet (see ../shared/notes/vllm-gpu.md).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${GPU_TIER_OUT:-${OUT:-gpu-tier-results}}
mkdir -p "$out"
: >"$out/log.txt"
if [[ -d /root/staged && ! -d /root/vllm/vllm && -f .gpu/install.sh ]]; then
  bash .gpu/install.sh >"$out/install.txt" 2>&1 || { tail -20 "$out/install.txt"; exit 1; }
fi
if [[ -d /root/vllm/vllm ]]; then
  export PYTHONPATH="/root/vllm:$PWD${PYTHONPATH:+:$PYTHONPATH}"
  export VLLM_USE_FLASHINFER_SAMPLER=${VLLM_USE_FLASHINFER_SAMPLER:-0}  # FlashInfer is not staged
fi
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
modules=("$@")
if [[ ${#modules[@]} -eq 0 ]]; then
  mapfile -t modules < <(sed -n 's#^tests/integration/test_\([a-z_0-9]*\)\.py::.*#\1#p' tests/gpu_tier.txt | uniq)
fi
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
  $py -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  $py -c "import vllm; print('vllm', vllm.__version__)" 2>/dev/null || echo "vllm: not importable"
  $py -c "import ray; print('ray', ray.__version__)" 2>/dev/null || echo "ray: not importable"
  echo "commit ${RSTAR2_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)} (set RSTAR2_COMMIT where the checkout travels without its .git)"
} >"$out/versions.txt"
cat "$out/versions.txt"
# nothing passes by skipping: the tier needs a GPU, vLLM and Ray here
$py -c "import torch, vllm, ray; assert torch.cuda.is_available(), 'no CUDA device'" \
  || { echo "gpu_tier: needs a CUDA GPU, vLLM and Ray in this Python" >&2; exit 1; }
status=0
for arg in "${modules[@]}"; do
  m=${arg%%:*}; k=(); [[ "$arg" == *:* ]] && k=(-k "${arg#*:}")
  start=$(date +%s)
  $py -m pytest -q -p no:cacheprovider -m gpu "tests/integration/test_$m.py" "${k[@]}" -s \
    --junitxml="$out/junit-${arg//[^a-zA-Z0-9_]/_}.xml" -o junit_suite_name="gpu-$m" >"$out/log-$m.part" 2>&1
  rc=$?
  { echo "===== $m: exit $rc"; cat "$out/log-$m.part"; } >>"$out/log.txt"
  echo "$m: exit $rc in $(( $(date +%s) - start )) s: $(tail -1 "$out/log-$m.part")"
  rm -f "$out/log-$m.part"
  [[ $rc -ne 0 ]] && status=1
done
exit $status
