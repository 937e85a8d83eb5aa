"""The GPU tier's list (tests/gpu_tier.txt) is exactly the `gpu`-marked tests: a test marked
`gpu` and left off the list, or listed and gone, fails here, on CPU, before any GPU run."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO


def test_the_gpu_tier_list_is_every_gpu_marked_test() -> None:
    modules = sorted(
        str(p.relative_to(REPO))
        for p in (REPO / "tests").rglob("test_*.py")
        if "pytest.mark.gpu" in p.read_text()
    )
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", *modules],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    collected = sorted(line for line in res.stdout.splitlines() if "::" in line)
    listed = [
        line
        for line in (REPO / "tests" / "gpu_tier.txt").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert listed == sorted(listed), "keep tests/gpu_tier.txt sorted"
    assert collected == listed
