#!/usr/bin/env bash
# Check `sandbox-pool serve` against code-judge's own test suite and the public rStar2 client,
# unchanged, fetched by the caller (nothing of theirs is kept in this repository):
#   CODE_JUDGE_DIR=/path/to/code-judge (at f809f35)  RSTAR2_DIR=/path/to/rStar  bash run.sh
# Needs redis-server for the Redis mode, and rstar2's .venv (README command 2).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
py="$repo/.venv/bin/python"
work="$(mktemp -d)"
trap 'rm -rf "$work"; pkill -f "sandbox-pool serve --port 8188" || true' EXIT
mkdir -p "$work/tests"
cp "$CODE_JUDGE_DIR/tests/test_main.py" "$work/tests/"
cp "$here/codejudge_conftest.py" "$work/tests/conftest.py"
touch "$work/tests/__init__.py"
for mode in embedded redis; do
  echo "== code-judge tests/test_main.py against sandbox-pool serve ($mode)"
  (cd "$work" && CJ_MODE=$mode RSTAR2_REPO="$repo" "$py" -m pytest -q -p no:cacheprovider tests)
done
export RSTAR2_TOOLS="$RSTAR2_DIR/rstar2_agent/tools" RSTAR2_DIR
"$repo/.venv/bin/sandbox-pool" serve --port 8188 >"$work/serve.log" 2>&1 &
for _ in $(seq 100); do curl -sf localhost:8188/ping >/dev/null && break; sleep 0.2; done
echo "== rStar2 client: formatted tool responses of 12 cells"
"$py" "$here/client_cells.py" cells 8188
echo "== rStar2 RequestProcessor: 2,000 calls, concurrency 64, batches of 32"
"$py" "$here/client_cells.py" load 8188
if "$py" -c "import fused_compute_score" 2>/dev/null; then
  echo "== rStar2 reward path (fused_compute_score)"
  "$py" "$here/client_reward.py" 8188
else
  echo "== rStar2 reward path skipped: pip install --no-deps -e \$RSTAR2_DIR (and pylatexenc) first"
fi
