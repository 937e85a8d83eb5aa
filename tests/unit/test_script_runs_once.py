"""A user's plain script (no main guard) that calls the reward or the sandbox runs exactly once:
their worker processes start from our entry points, never by re-importing the script."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REWARD_SCRIPT = """
from rstar2.reward import samples, score

print("SCRIPT-RAN", flush=True)
cases = [("0.5", "\\\\frac{1}{2}"), ("\\\\frac{2}{4}", "0.5"), ("3", "4"), ("x^2+1", "1+x^2")]
print("SCORES", [score(samples.response(p), t) for p, t in cases], flush=True)
"""

SANDBOX_SCRIPT = """
import asyncio

from sandbox_pool import PoolConfig, SandboxPool

print("SCRIPT-RAN", flush=True)


async def go():
    async with SandboxPool(PoolConfig(num_workers=2)) as pool:
        results = await asyncio.gather(*(pool.run(f"print({i} * 2)") for i in range(4)))
    return [r.stdout.strip() for r in results]


print("OUT", asyncio.run(go()), flush=True)
"""


def _run(tmp_path: Path, source: str) -> str:
    script = tmp_path / "plain.py"
    script.write_text(source)
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Warning" not in done.stderr, done.stderr  # the user's console stays clean
    return done.stdout


def test_a_plain_script_scoring_runs_once_and_every_score_is_right(tmp_path):
    out = _run(tmp_path, REWARD_SCRIPT)
    assert out.count("SCRIPT-RAN") == 1, out
    assert "SCORES [1.0, 1.0, 0.0, 1.0]" in out


def test_a_plain_script_using_the_sandbox_runs_once(tmp_path):
    out = _run(tmp_path, SANDBOX_SCRIPT)
    assert out.count("SCRIPT-RAN") == 1, out
    assert "OUT ['0', '2', '4', '6']" in out
