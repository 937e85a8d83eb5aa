"""Redis mode under faults (issue #21 item 2): faults cost latency, never a call.

Real processes and real signals: a redis-server with an append-only file (fsync per write), 3
sandbox workers, ``N`` calls in flight; meanwhile a worker is SIGKILLed 5 times (its process
group: the worker and its zygotes; an operator starts a replacement under a new name), stopped
twice with SIGTERM to its process group (as systemd or Slurm stop it: it finishes the calls it
holds and exits 0, its zygotes waiting for it) and redis-server is restarted once (SIGTERM,
then started again on the same port and data dir).
Every call must yield exactly one result, the right one; an ``internal_error`` result (the
deadline passed) is counted and must not happen under these generous deadlines.

``SANDBOX_FAULTS_N`` overrides ``N`` (e.g. 10000 for a longer run).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import redis.asyncio as aioredis

from sandbox_pool.protocol import ExecRequest
from sandbox_pool.redis_queue import PREFIX, RedisConfig, RedisDispatcher
from tests.faults import RestartableRedis, kill_group, wait_answered
from tests.integration.test_sandbox_redis import (
    _start_worker,
    _wait_for_workers,
    pytestmark,  # skipped where redis-server is not installed
)

__all__ = ["pytestmark"]

N = int(os.environ.get("SANDBOX_FAULTS_N", "2000"))
WORKERS = 3
KILLS = 5
# per call, counted from its enqueue (all N are enqueued at once, so it grows with N); a call
# only gets internal_error past this
DEADLINE_S = 30.0 + N / 40
# fraction of the calls answered before each fault: "kill" a worker or "restart" Redis
# fraction of the calls answered before each fault: "kill" a worker, "term" (stop) one, or
# "restart" Redis
SCHEDULE: Sequence[tuple[float, str]] = (
    (0.10, "kill"),
    (0.20, "term"),
    (0.25, "kill"),
    (0.40, "kill"),
    (0.50, "restart"),
    (0.65, "kill"),
    (0.75, "term"),
    (0.80, "kill"),
)


async def _wait_registered(url: str, name: str) -> None:
    """Until worker ``name``'s heartbeat is in Redis (60 s at most: a loaded machine)."""
    async with aioredis.from_url(url) as client:
        deadline = time.monotonic() + 60
        while not await client.exists(PREFIX + "worker:" + name):
            assert time.monotonic() < deadline, f"worker {name} did not register"
            await asyncio.sleep(0.05)


def _terminate(proc: subprocess.Popen[bytes]) -> tuple[float, int]:
    """SIGTERM ``proc``'s process group; (seconds until it exited, its exit code). 120 s
    catches a hang, not a slow stop on a loaded machine."""
    start = time.monotonic()
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        code = proc.wait(timeout=120)
    finally:
        kill_group(proc.pid)
    return time.monotonic() - start, code


async def test_each_call_yields_exactly_one_result_through_worker_kills_and_a_redis_restart(
    tmp_path: Path,
) -> None:
    assert sum(kind == "kill" for _, kind in SCHEDULE) == KILLS
    redis = RestartableRedis(tmp_path)
    workers = {f"w{i}": _start_worker(redis.url, f"w{i}") for i in range(WORKERS)}
    dispatcher = RedisDispatcher(RedisConfig(url=redis.url, max_wait_s=DEADLINE_S))
    await dispatcher.start()
    try:
        await _wait_for_workers(dispatcher, 2 * WORKERS)  # 2 slots each
        started = time.monotonic()
        calls = [
            asyncio.create_task(dispatcher.execute(ExecRequest(code=f"print({i} * {i})")))
            for i in range(N)
        ]
        kills = 0
        stops: list[tuple[float, int]] = []  # (seconds to exit, exit code)
        for fraction, kind in SCHEDULE:
            await wait_answered(calls, fraction)
            if kind == "restart":
                redis.restart()
                continue
            name = sorted(workers)[(kills + len(stops)) % WORKERS]
            victim = workers.pop(name)
            if kind == "kill":
                kill_group(victim.pid)
                kills += 1
            else:  # an operator stops a worker that is serving (not one still starting)
                await _wait_registered(redis.url, name)
                stops.append(await asyncio.to_thread(_terminate, victim))
            name = f"r{kills + len(stops)}"  # the operator's replacement, a new consumer
            workers[name] = _start_worker(redis.url, name)
        results = await asyncio.gather(*calls)  # never raises: faults are results at worst
        wall_s = time.monotonic() - started

        internal_errors = [i for i, r in enumerate(results) if r.status == "internal_error"]
        wrong = [
            i
            for i, r in enumerate(results)
            if r.status != "internal_error" and (r.status, r.stdout) != ("ok", f"{i * i}\n")
        ]
        unique = dispatcher.results_received - dispatcher.duplicate_results
        lost = N - unique
        print(
            f"\nfaults: N={N} results={len(results)} unique={unique} "
            f"duplicates={dispatcher.duplicate_results} lost={lost} "
            f"internal_errors={len(internal_errors)} wrong={len(wrong)} "
            f"reconnects={dispatcher.reconnects} stops (s, code)={stops} wall={wall_s:.1f}s"
        )
        assert len(results) == N
        assert kills == KILLS
        assert [code for _, code in stops] == [0, 0], stops
        assert not wrong, [(i, results[i]) for i in wrong[:5]]
        assert not internal_errors, [(i, results[i]) for i in internal_errors[:5]]
        assert unique == N  # each call's result was delivered to its caller exactly once
        # no call was executed-and-published twice: one done marker per call, and the queue
        # drains (entries a killed worker held are reclaimed, seen answered, acked)
        async with aioredis.from_url(redis.url, decode_responses=True) as client:
            done = [k async for k in client.scan_iter(match=PREFIX + "done:*", count=1000)]
            assert len(done) == N
            deadline = time.monotonic() + 20
            while await client.xlen(PREFIX + "calls") and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            assert await client.xlen(PREFIX + "calls") == 0
    finally:
        try:
            await dispatcher.aclose()
        finally:
            _stop(list(workers.values()), redis)


def _stop(workers: list[subprocess.Popen[bytes]], redis: RestartableRedis) -> None:
    """SIGTERM every worker's process group (SIGKILL past 20 s), then redis-server."""
    for proc in workers:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in workers:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    redis.stop()
