"""Micro benchmarks of the hot pure parts and the sandbox's fork, for pytest-benchmark:

    pytest perf --benchmark-only                      # run, print the table
    pytest perf --benchmark-only --benchmark-autosave # keep the run under .benchmarks/
    pytest perf --benchmark-only --benchmark-compare  # against the last saved run
    pytest perf --benchmark-disable                   # each once, as a test (CI)

Every benchmark asserts its result, so a fast wrong answer fails rather than looks good.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Iterator
from typing import Any

import pytest

from perf.roc import _groups, _select_and_advantage
from rstar2.agent.tools import ToolCall, parse_tool_calls
from rstar2.config import DownSamplingConfig
from rstar2.learner.packing import pack, plan
from rstar2.learner.protocol import TrainSequence
from rstar2.reward.verify import verify_answer
from scheduler.core import Scheduler, SchedulerSettings


def test_reward_verification(benchmark: Any) -> None:
    verify_answer("1/2", "0.5")  # warm math-verify's parsers
    assert benchmark(verify_answer, "\\frac{3}{6}", "0.5") is True


def test_roc_selection_and_advantages(benchmark: Any) -> None:
    groups = _groups(64, 32, random.Random(0))
    kept = benchmark(_select_and_advantage, groups, DownSamplingConfig(down_sample_to_n=16))
    assert 0 < kept <= 64 * 16  # at most 16 per group; equal-reward groups dropped


def test_one_scheduling_decision(benchmark: Any) -> None:
    """One turn boundary and the placement it allows, 8 engines x 2,000 live trajectories."""
    sched = Scheduler([2_000_000] * 8, SchedulerSettings(policy="kv_affinity"))
    rng = random.Random(0)
    for i in range(2000):
        sched.submit(f"t{i}", prompt_tokens=rng.randint(150, 600), max_response_tokens=12_288)
    running = [a.traj_id for a in sched.schedule()]
    context = dict.fromkeys(running, 1000)

    def boundary() -> int:
        tid = running.pop(0)
        sched.generation_finished(tid, 64)
        context[tid] += 64
        sched.turn_ready(tid, context[tid])
        placed = sched.schedule()
        running.extend(a.traj_id for a in placed)
        return len(placed)

    benchmark(boundary)
    # no trajectory lost: every one is running (placed) or waiting for KV
    assert len(set(running)) == len(running)
    assert len(running) + sched.num_waiting == 2000


def test_packing(benchmark: Any) -> None:
    rng = random.Random(0)
    batch = []
    for _ in range(64):
        n = rng.randint(200, 2000)
        mask = [0] * 100 + [1] * (n - 100)
        batch.append(TrainSequence(list(range(n)), mask, [0.0] * n, advantage=1.0))

    def pack_all() -> int:
        return sum(
            pack(batch, idx).num_tokens for idx in plan([len(s.token_ids) for s in batch], 16_384)
        )

    assert benchmark(pack_all) == sum(len(s.token_ids) for s in batch)


def test_tool_call_parsing(benchmark: Any) -> None:
    body = json.dumps(
        {"name": "python_code_with_standard_io", "arguments": {"code": "print(1+1)\n" * 20}}
    )
    turn = "Let me compute.\n" * 30 + f"<tool_call>{body}</tool_call>" * 2
    calls = benchmark(parse_tool_calls, turn)
    assert len(calls) == 2 and all(isinstance(c, ToolCall) for c in calls)


@pytest.fixture(scope="module")
def pool() -> Iterator[tuple[asyncio.AbstractEventLoop, object]]:
    import os

    from sandbox_pool import PoolConfig, SandboxPool

    if os.geteuid() != 0:  # per-call uids and namespaces need root
        pytest.skip("the isolated fork path needs root")
    loop = asyncio.new_event_loop()
    sandbox = SandboxPool(PoolConfig(num_workers=1))
    loop.run_until_complete(sandbox.start())
    yield loop, sandbox
    loop.run_until_complete(sandbox.aclose())
    loop.close()


def test_zygote_fork_call(benchmark: Any, pool: tuple[asyncio.AbstractEventLoop, object]) -> None:
    """One isolated call end to end: a child forked ahead from the warm zygote runs
    ``print(1+1)``, is reaped, and the next child is forked."""
    from sandbox_pool import ExecRequest, SandboxPool

    loop, sandbox = pool
    assert isinstance(sandbox, SandboxPool)
    request = ExecRequest(code="print(1+1)")
    result = benchmark(lambda: loop.run_until_complete(sandbox.execute(request)))
    assert (result.status, result.stdout) == ("ok", "2\n")
