"""Redis multi-node mode with a real redis-server and real worker processes."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from sandbox_pool.protocol import ExecRequest
from sandbox_pool.redis_queue import PREFIX, RedisConfig, RedisDispatcher
from tests.faults import free_port, start_redis

pytestmark = pytest.mark.skipif(
    shutil.which("redis-server") is None,
    reason="redis-server not installed (scripts/install.sh dev)",
)


@pytest.fixture
def redis_url():
    port = free_port()
    proc = start_redis(port, "--save", "", "--appendonly", "no")
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(timeout=10)


def _start_worker(redis_url: str, name: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sandbox_pool.cli",
            "worker",
            "--redis",
            redis_url,
            "--workers",
            "2",
            "--visibility-timeout",
            "2",
            "--name",
            name,
        ],
        stdout=subprocess.DEVNULL,
        start_new_session=True,  # its zygotes die with it (parent-death signal)
    )


async def _wait_for_workers(dispatcher: RedisDispatcher, n: int) -> None:
    deadline = time.monotonic() + 60
    while dispatcher.status()["num_workers"] < n:
        assert time.monotonic() < deadline, "workers did not register"
        await asyncio.sleep(0.1)


async def test_exactly_one_result_per_call_while_workers_are_killed(redis_url):
    workers = [_start_worker(redis_url, f"w{i}") for i in range(4)]
    dispatcher = RedisDispatcher(RedisConfig(url=redis_url, max_wait_s=120))
    await dispatcher.start()
    try:
        await _wait_for_workers(dispatcher, 4)
        n = 2000
        calls = [
            asyncio.create_task(dispatcher.execute(ExecRequest(code=f"print({i})")))
            for i in range(n)
        ]
        for victim in workers[:3]:  # SIGKILL three workers while calls are in flight
            await asyncio.sleep(0.7)
            os.killpg(victim.pid, signal.SIGKILL)
        results = await asyncio.gather(*calls)
        assert [r.status for r in results].count("ok") == n
        assert [r.stdout for r in results] == [f"{i}\n" for i in range(n)]
        assert dispatcher.results_received == n  # no duplicate was ever published
        client = dispatcher._client
        done_keys = [k async for k in client.scan_iter(match=PREFIX + "done:*", count=1000)]
        assert len(done_keys) == n
        assert await client.llen(PREFIX + "results:" + dispatcher.node) == 0
        # entries a dead worker answered but never acked are reclaimed, seen answered, acked
        deadline = time.monotonic() + 20
        while await client.xlen(PREFIX + "calls") and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert await client.xlen(PREFIX + "calls") == 0
        assert dispatcher.results_received == n
    finally:
        await dispatcher.aclose()
        for w in workers:
            if w.poll() is None:
                os.killpg(w.pid, signal.SIGTERM)
                w.wait(timeout=20)


async def test_the_runtime_runs_tool_calls_through_redis_and_refuses_a_dead_url(redis_url):
    """``sandbox.mode: redis`` in a run: calls reach a worker through the queue; a Redis that
    does not answer stops the run at start with the key named (not a run of failing tools)."""
    from rstar2.config import ConfigError, RedisSandboxConfig
    from rstar2.runtime import Runtime
    from rstar2.runtime.placement import LocalPlacement

    worker = _start_worker(redis_url, "runtime")
    try:
        async with Runtime(LocalPlacement()) as runtime:
            section = RedisSandboxConfig(mode="redis", redis_url=redis_url, max_wait_s=120)
            async with runtime.sandbox(section) as sandbox:
                result = await sandbox.execute(ExecRequest(code="print(6 * 7)", memory_mb=256))
            assert (result.status, result.stdout) == ("ok", "42\n")
            dead = RedisSandboxConfig(mode="redis", redis_url=f"redis://127.0.0.1:{free_port()}/0")
            with pytest.raises(ConfigError) as info:
                async with runtime.sandbox(dead):
                    pass
            assert info.value.key == "sandbox.redis_url"
            assert "no sandbox service answers" in info.value.message
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=20)
