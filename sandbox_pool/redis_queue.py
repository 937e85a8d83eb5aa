"""Redis multi-node mode: API nodes enqueue calls into a Redis Stream, workers on any node run them.

Keys (prefix ``sandbox:``): the stream ``calls`` with consumer group ``workers``; per API node a
result list ``results:<node>``; per call a marker ``done:<call>``; per worker a heartbeat
``worker:<name>``.

Guarantees:
- At-least-once execution, exactly one result per call: a worker publishes a result only if it
  is the first to set ``done:<call>`` (SET NX, in one Lua script with the publish), then acks.
- A call whose worker dies is reclaimed (XAUTOCLAIM) by another worker once it has been pending
  longer than the visibility timeout, and re-run.
- Results and markers expire (``result_ttl_s``); workers heartbeat every second into a key that
  expires (with their number of execution slots), and :meth:`RedisDispatcher.status` lists the
  live ones, their slots in all (``num_workers``) and the calls not yet delivered (``queued``).
- A call carries the whole :class:`ExecRequest` (language, mode, output cap included).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from sandbox_pool.pool import SandboxPool
from sandbox_pool.protocol import ExecRequest, ExecResult, ProtocolError

PREFIX = "sandbox:"
STREAM = PREFIX + "calls"
GROUP = "workers"

# KEYS: done marker, result list, stream. ARGV: payload ('' = nothing to publish), ttl seconds,
# group, entry id. Publishes at most once per call, then acks and deletes the entry: one atomic
# step, so a worker dying half-way can neither publish twice nor leave an orphaned entry.
_SETTLE = """
local published = 0
if ARGV[1] ~= '' and redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[2]) then
  redis.call('RPUSH', KEYS[2], ARGV[1])
  redis.call('EXPIRE', KEYS[2], ARGV[2])
  published = 1
end
redis.call('XACK', KEYS[3], ARGV[3], ARGV[4])
redis.call('XDEL', KEYS[3], ARGV[4])
return published
"""


@dataclass(frozen=True, kw_only=True)
class RedisConfig:
    url: str
    visibility_timeout_s: float = 30.0  # a call pending this long is reclaimed by another worker
    result_ttl_s: int = 600
    max_wait_s: float = 600.0  # an API node gives up on a call after this long
    heartbeat_s: float = 1.0


_BLPOP_TIMEOUT_S = 1


def _connect(url: str, max_connections: int = 32) -> aioredis.Redis:
    """A client whose callers wait for a free connection instead of failing past the cap."""
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=max_connections, decode_responses=True
    )
    return aioredis.Redis(connection_pool=pool)


async def _ensure_group(client: aioredis.Redis) -> None:
    with contextlib.suppress(ResponseError):  # BUSYGROUP: it exists
        await client.xgroup_create(STREAM, GROUP, id="0", mkstream=True)


class RedisDispatcher:
    """API-node executor: enqueue each call, await its result from this node's result list."""

    def __init__(self, config: RedisConfig) -> None:
        self.config = config
        self.node = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._client = _connect(config.url)
        self._waiters: dict[str, asyncio.Future[ExecResult]] = {}
        self._listener: asyncio.Task[None] | None = None
        self._workers: list[str] = []
        self._slots = 0
        self._lag = 0
        self._status_task: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()
        self.results_received = 0  # every result message, duplicates included (there are none)

    async def start(self) -> None:
        await self._client.ping()
        await _ensure_group(self._client)
        self._listener = asyncio.create_task(self._listen())
        self._status_task = asyncio.create_task(self._refresh_workers())

    async def aclose(self) -> None:
        """Stop listening and close the connections. The loops are asked to stop, not
        cancelled: redis-py's asyncio client can hang when a blocking command (BLPOP) is
        cancelled mid-read (redis/redis-py#2579, #2028), so they finish their current
        one-second BLPOP and exit; a cancel is only the fallback past that."""
        self._closing.set()
        for task in (self._listener, self._status_task):
            if task is not None:
                with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                    await asyncio.wait_for(asyncio.shield(task), _BLPOP_TIMEOUT_S + 10.0)
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
        await self._client.aclose()

    async def execute(self, request: ExecRequest) -> ExecResult:
        call_id = uuid.uuid4().hex
        future: asyncio.Future[ExecResult] = asyncio.get_running_loop().create_future()
        self._waiters[call_id] = future
        payload = {"id": call_id, "node": self.node, "request": request.to_json()}
        try:
            await self._client.xadd(STREAM, {"call": json.dumps(payload)})
            return await asyncio.wait_for(future, self.config.max_wait_s)
        except TimeoutError:
            return ExecResult(status="internal_error", stderr="no worker answered in time")
        finally:
            self._waiters.pop(call_id, None)

    def status(self) -> dict[str, Any]:
        return {"num_workers": self._slots, "workers": self._workers, "queued": self._lag}

    async def refresh(self) -> None:
        """Read the live workers (and their slots) and the undelivered calls from Redis."""
        keys = [k async for k in self._client.scan_iter(match=PREFIX + "worker:*")]
        beats = await self._client.mget(keys) if keys else []
        slots = 0
        for beat in beats:
            if beat is None:  # expired between the scan and the read
                continue
            with contextlib.suppress(TypeError, ValueError, AttributeError):
                slots += int(json.loads(beat).get("num_workers", 0))
        self._workers = sorted(k.removeprefix(PREFIX + "worker:") for k in keys)
        self._slots = slots
        lag = 0
        with contextlib.suppress(ResponseError):
            for group in await self._client.xinfo_groups(STREAM):
                if group.get("name") == GROUP:
                    lag = int(group.get("lag") or 0)
        self._lag = lag

    async def _listen(self) -> None:
        key = PREFIX + "results:" + self.node
        conn = _connect(self.config.url, max_connections=1)
        try:
            while not self._closing.is_set():
                item = await conn.blpop([key], timeout=_BLPOP_TIMEOUT_S)
                if item is None:
                    continue
                msg = json.loads(item[1])
                self.results_received += 1
                future = self._waiters.get(msg.pop("id"))
                if future is not None and not future.done():
                    future.set_result(ExecResult.from_json(msg))
        finally:
            await conn.aclose()

    async def _refresh_workers(self) -> None:
        while not self._closing.is_set():
            await self.refresh()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), self.config.heartbeat_s)


class RedisWorker:
    """Runs calls from the stream on a local :class:`SandboxPool` until stopped."""

    def __init__(self, config: RedisConfig, pool: SandboxPool, name: str | None = None) -> None:
        self.config = config
        self.pool = pool
        self.name = name or f"{socket.gethostname()}-{os.getpid()}"
        self._client = _connect(config.url)
        self._settle = self._client.register_script(_SETTLE)
        self._capacity = pool.num_workers * 2  # calls held at once: running + about to run
        self._slots = asyncio.Semaphore(self._capacity)
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopping = asyncio.Event()
        self.registered = asyncio.Event()  # set once its first heartbeat is in Redis
        self.processed = 0

    async def run(self) -> None:
        """Consume until :meth:`stop`; finishes the calls it holds before returning."""
        await _ensure_group(self._client)
        loops = [self._consume(), self._reclaim(), self._heartbeat()]
        tasks = [asyncio.create_task(c) for c in loops]
        await self._stopping.wait()
        # every loop sees the stop at its next idle point (the consumer after its current
        # one-second read): cancelling a command in flight can wedge redis-py's connection
        # (see RedisDispatcher.aclose), so a cancel is only the fallback for a loop stuck past
        # the grace period
        _, stuck = await asyncio.wait(tasks, timeout=_BLPOP_TIMEOUT_S + 10.0)
        for task in stuck:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(Exception):  # best effort: the key expires on its own
            await asyncio.wait_for(self._client.delete(PREFIX + "worker:" + self.name), 5.0)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._client.aclose(), 5.0)

    def stop(self) -> None:
        self._stopping.set()

    async def _consume(self) -> None:
        while not self._stopping.is_set():
            await self._slots.acquire()  # wait for a free slot, then read as many as are free
            self._slots.release()
            free = max(1, self._capacity - len(self._tasks))
            reply: Any = await self._client.xreadgroup(  # RESP2: [[stream, messages]]
                GROUP, self.name, {STREAM: ">"}, count=free, block=_BLPOP_TIMEOUT_S * 1000
            )
            for _stream, messages in reply or []:
                for msg_id, fields in messages:
                    await self._start(msg_id, fields)

    async def _idle(self, seconds: float) -> bool:
        """Wait ``seconds`` or until :meth:`stop`; True when stopping."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)
        return self._stopping.is_set()

    async def _reclaim(self) -> None:
        idle_ms = int(self.config.visibility_timeout_s * 1000)
        while not await self._idle(self.config.visibility_timeout_s / 4):
            start = "0-0"
            while True:
                reply: list[Any] = await self._client.xautoclaim(
                    STREAM, GROUP, self.name, min_idle_time=idle_ms, start_id=start, count=64
                )
                start, messages = str(reply[0]), list(reply[1])
                for msg_id, fields in messages:
                    if fields:  # deleted entries come back empty
                        await self._start(msg_id, fields)
                if start == "0-0" or not messages:
                    break

    async def _heartbeat(self) -> None:
        key = PREFIX + "worker:" + self.name
        ttl = max(2, int(self.config.heartbeat_s * 5))
        while not self._stopping.is_set():
            info = {
                "num_workers": self.pool.num_workers,
                "in_flight": self.pool.in_flight,
                "processed": self.processed,
                "time": time.time(),
            }
            await self._client.set(key, json.dumps(info), ex=ttl)
            self.registered.set()
            await self._idle(self.config.heartbeat_s)

    async def _start(self, msg_id: str, fields: dict[str, str]) -> None:
        await self._slots.acquire()
        task = asyncio.create_task(self._handle(msg_id, fields))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _handle(self, msg_id: str, fields: dict[str, str]) -> None:
        try:
            call = json.loads(fields["call"])
            done_key = PREFIX + "done:" + call["id"]
            payload = ""
            if not await self._client.exists(done_key):  # skip work already answered
                try:
                    request = ExecRequest.from_json(call["request"])
                except ProtocolError as exc:
                    result = ExecResult(status="internal_error", stderr=f"bad call: {exc}")
                else:
                    result = await self.pool.execute(request)
                payload = json.dumps({"id": call["id"], **result.to_json()})
            result_key = PREFIX + "results:" + call["node"]
            await self._settle(
                keys=[done_key, result_key, STREAM],
                args=[payload, self.config.result_ttl_s, GROUP, msg_id],
            )
            self.processed += 1
        finally:
            self._slots.release()
