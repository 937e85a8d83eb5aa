"""rstar2.failpoints: an armed point SIGKILLs the process there and nowhere else."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from rstar2.failpoints import ENV, parse
from tests.conftest import REPO

_SCRIPT = """
from rstar2 import failpoints
for step in (1, 2, 3):
    for point in ("rollout", "learn", "checkpoint_write"):
        print(point, step, flush=True)
        failpoints.hit(point, step)
print("done")
"""


def _run(spec: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != ENV}
    if spec is not None:
        env[ENV] = spec
    return subprocess.run(
        [sys.executable, "-c", _SCRIPT], cwd=REPO, env=env, capture_output=True, text=True
    )


def test_an_armed_point_kills_the_process_exactly_there():
    res = _run("learn@2,rollout@3")
    assert res.returncode == -signal.SIGKILL
    assert res.stdout.splitlines()[-1] == "learn 2"  # the first armed point reached


def test_unarmed_the_points_do_nothing():
    assert _run(None).stdout.splitlines()[-1] == "done"
    assert _run("learn@9").stdout.splitlines()[-1] == "done"


def test_a_malformed_spec_is_an_error_not_a_silent_no_op():
    assert parse(" rollout@3, ,learn@12") == {("rollout", 3), ("learn", 12)}
    for bad in ("rollout", "rollout@x", "sync@3", "learn@-1"):
        with pytest.raises(ValueError, match="is not <point>@<step>"):
            parse(bad)
    res = _run("rollout@three")
    assert res.returncode == 1 and "is not <point>@<step>" in res.stderr
