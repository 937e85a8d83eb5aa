"""Redis multi-node mode: API nodes enqueue calls into a Redis Stream, workers on any node run them.

Keys (prefix ``sandbox:``): the stream ``calls`` with consumer group ``workers``; per API node a
result list ``results:<node>`` and a one-item hand-over list ``delivering:<node>``; per call a
marker ``done:<call>``; per worker a heartbeat ``worker:<name>``.

Guarantees (faults cost latency, not calls):
- At-least-once execution, exactly one result per call: a worker publishes a result only if it
  is the first to set ``done:<call>`` (SET NX, in one Lua script with the publish), then acks.
  The API node also drops any second result for a call (keyed by call id), so a caller sees
  exactly one.
- A call whose worker dies is reclaimed (XAUTOCLAIM) by another worker once it has been pending
  longer than the visibility timeout, and re-run. A live worker renews the lease on the calls
  it holds with every heartbeat (XCLAIM JUSTID resets their idle time), so only a dead (or
  Redis-partitioned) worker's calls are re-run.
- Redis unreachable or restarting: every Redis step (enqueue, read, settle, heartbeat) is
  retried with capped backoff; a caller retries its enqueue until its deadline
  (``max_wait_s``) and then, like a call no worker answered in time, gets an
  ``internal_error`` result, never an exception. Results move from ``results:<node>`` to
  ``delivering:<node>`` (BLMOVE) and are deleted there only after delivery, so a result in
  flight when a connection breaks is delivered after the reconnect.
- No queued call is lost across a Redis restart or crash only if Redis persists every write
  before acknowledging it: run it with ``appendonly yes`` and ``appendfsync always``. With
  ``appendfsync everysec`` a clean restart (SHUTDOWN / SIGTERM, which flushes the AOF) loses
  nothing, but a crash (SIGKILL, power loss) may lose the last second of writes; without the
  AOF a restart loses the queue. A lost call's caller gets ``internal_error`` at its deadline.
- Results and markers expire (``result_ttl_s``); workers heartbeat every second into a key that
  expires (with their number of execution slots), and :meth:`RedisDispatcher.status` lists the
  live ones, their slots in all (``num_workers``) and the calls not yet delivered (``queued``).
- A call carries the whole :class:`ExecRequest` (language, mode, output cap included).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from sandbox_pool.pool import SandboxPool
from sandbox_pool.protocol import ExecRequest, ExecResult, ProtocolError

_log = logging.getLogger(__name__)
_T = TypeVar("_T")

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
# Redis down, restarting or still loading its data (BusyLoadingError is a ConnectionError)
_TRANSIENT: tuple[type[Exception], ...] = (RedisConnectionError, RedisTimeoutError)


def backoff_s(attempt: int, base_s: float = 0.05, cap_s: float = 1.0) -> float:
    """Delay before retry number ``attempt`` (0-based): doubling from ``base_s``, capped."""
    return min(cap_s, base_s * 2 ** min(attempt, 30))


async def _retrying(op: Callable[[], Awaitable[_T]], deadline: float) -> _T:
    """``op()``, retried on transient Redis errors with :func:`backoff_s` until the monotonic
    ``deadline``; the last error is raised when the next try would start past it. Only for
    steps safe to repeat (idempotent, or deduplicated by call id)."""
    attempt = 0
    while True:
        try:
            return await op()
        except _TRANSIENT:
            delay = backoff_s(attempt)
            if time.monotonic() + delay > deadline:
                raise
            await asyncio.sleep(delay)
            attempt += 1


def _connect(url: str, max_connections: int = 32) -> aioredis.Redis:
    """A client whose callers wait for a free connection instead of failing past the cap. A
    command on a pooled connection Redis closed (e.g. it restarted) reconnects and is re-sent
    once at once; longer outages are the callers' to retry (:func:`_retrying`)."""
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=max_connections, decode_responses=True, retry=Retry(NoBackoff(), 1)
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
        self.results_received = 0  # every result message, duplicates included
        self.duplicate_results = 0  # results for a call already answered or given up: dropped
        self.reconnects = 0  # transient Redis errors the result listener waited out

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
        """The call's one result, within ``max_wait_s``; never raises for Redis faults: past the
        deadline (Redis unreachable throughout, or no worker answered) an ``internal_error``
        result. The enqueue is retried on connection errors (a repeated entry is harmless: the
        call id deduplicates it)."""
        call_id = uuid.uuid4().hex
        future: asyncio.Future[ExecResult] = asyncio.get_running_loop().create_future()
        self._waiters[call_id] = future
        payload = {"id": call_id, "node": self.node, "request": request.to_json()}
        fields = {"call": json.dumps(payload)}
        deadline = time.monotonic() + self.config.max_wait_s
        try:
            await _retrying(lambda: self._client.xadd(STREAM, fields), deadline)  # type: ignore[arg-type]
            return await asyncio.wait_for(future, max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            return ExecResult(status="internal_error", stderr="no worker answered in time")
        except RedisError as exc:
            return ExecResult(status="internal_error", stderr=f"sandbox queue unreachable: {exc}")
        finally:
            self._waiters.pop(call_id, None)

    def _deliver(self, raw: str | bytes) -> None:
        """Hand one result message to its caller; a second one for the same call is dropped."""
        msg = json.loads(raw)
        self.results_received += 1
        future = self._waiters.get(msg.pop("id"))
        if future is None or future.done():
            self.duplicate_results += 1
            return
        future.set_result(ExecResult.from_json(msg))

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
        """Deliver results until closing. Each result is moved to ``delivering:<node>`` and
        deleted there only once delivered (in the same round trip as the next move), so after a
        broken connection the item in flight is re-read from it: none is lost (a repeat is
        dropped by :meth:`_deliver`). Transient Redis errors are waited out with backoff."""
        key = PREFIX + "results:" + self.node
        handover = PREFIX + "delivering:" + self.node
        conn = _connect(self.config.url, max_connections=1)
        attempt = 0
        try:
            while not self._closing.is_set():
                try:
                    for raw in await conn.lrange(handover, 0, -1):
                        self._deliver(raw)
                    while not self._closing.is_set():
                        pipe = conn.pipeline(transaction=False)
                        pipe.delete(handover)
                        pipe.blmove(key, handover, _BLPOP_TIMEOUT_S)
                        _, raw = await pipe.execute()
                        attempt = 0
                        if raw is not None:
                            self._deliver(raw)
                except _TRANSIENT as exc:
                    self.reconnects += 1
                    _log.warning("result listener: Redis unavailable (%s); retrying", exc)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._closing.wait(), backoff_s(attempt))
                    attempt += 1
        finally:
            await conn.aclose()

    async def _refresh_workers(self) -> None:
        while not self._closing.is_set():
            with contextlib.suppress(*_TRANSIENT):  # else keep the last status known
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
        self._held: set[str] = set()  # stream ids of the calls this worker runs (its leases)
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

    async def _survive(self, what: str, attempt: int) -> int:
        """After a transient Redis error in loop ``what``: wait a backoff (or until stopping)
        and return the next attempt number."""
        if attempt == 0:
            _log.warning("worker %s: %s: Redis unavailable; retrying", self.name, what)
        await self._idle(backoff_s(attempt))
        return attempt + 1

    async def _consume(self) -> None:
        attempt = 0
        while not self._stopping.is_set():
            await self._slots.acquire()  # wait for a free slot, then read as many as are free
            self._slots.release()
            free = max(1, self._capacity - len(self._tasks))
            try:
                reply: Any = await self._client.xreadgroup(  # [[stream, messages]]
                    GROUP, self.name, {STREAM: ">"}, count=free, block=_BLPOP_TIMEOUT_S * 1000
                )
            except _TRANSIENT:
                attempt = await self._survive("read", attempt)
                continue
            except ResponseError as exc:  # NOGROUP: Redis came back without the stream
                if "NOGROUP" not in str(exc):
                    raise
                await _ensure_group(self._client)
                continue
            attempt = 0
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
            with contextlib.suppress(*_TRANSIENT):  # next round, once Redis answers again
                await self._reclaim_once(idle_ms)

    async def _reclaim_once(self, idle_ms: int) -> None:
        start = "0-0"
        while True:
            reply: list[Any] = await self._client.xautoclaim(
                STREAM, GROUP, self.name, min_idle_time=idle_ms, start_id=start, count=64
            )
            start, messages = str(reply[0]), list(reply[1])
            for msg_id, fields in messages:
                if fields and msg_id not in self._held:  # deleted entries come back empty
                    await self._start(msg_id, fields)
            if start == "0-0" or not messages:
                break

    async def _heartbeat(self) -> None:
        key = PREFIX + "worker:" + self.name
        ttl = max(2, int(self.config.heartbeat_s * 5))
        attempt = 0
        while not self._stopping.is_set():
            info = {
                "num_workers": self.pool.num_workers,
                "in_flight": self.pool.in_flight,
                "processed": self.processed,
                "time": time.time(),
            }
            try:
                await self._client.set(key, json.dumps(info), ex=ttl)
                if self._held:  # renew the leases: reset the idle time of the calls held
                    held: list[Any] = sorted(self._held)
                    await self._client.xclaim(STREAM, GROUP, self.name, 0, held, justid=True)
            except _TRANSIENT:
                attempt = await self._survive("heartbeat", attempt)
                continue
            attempt = 0
            self.registered.set()
            await self._idle(self.config.heartbeat_s)

    async def _start(self, msg_id: str, fields: dict[str, str]) -> None:
        await self._slots.acquire()
        self._held.add(msg_id)
        task = asyncio.create_task(self._handle(msg_id, fields))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _handle(self, msg_id: str, fields: dict[str, str]) -> None:
        """Run one call and settle it. Redis faults are retried (each step is idempotent: the
        settle publishes at most once per call); if Redis stays away past ``max_wait_s`` the
        entry stays pending and is reclaimed and settled by a worker later."""
        deadline = time.monotonic() + self.config.max_wait_s
        try:
            call = json.loads(fields["call"])
            done_key = PREFIX + "done:" + call["id"]
            payload = ""
            try:
                answered = bool(await self._client.exists(done_key))
            except _TRANSIENT:
                answered = False  # run it: the settle still publishes at most once
            if not answered:  # skip work already answered
                try:
                    request = ExecRequest.from_json(call["request"])
                except ProtocolError as exc:
                    result = ExecResult(status="internal_error", stderr=f"bad call: {exc}")
                else:
                    result = await self.pool.execute(request)
                payload = json.dumps({"id": call["id"], **result.to_json()})
            result_key = PREFIX + "results:" + call["node"]
            args: list[str | int] = [payload, self.config.result_ttl_s, GROUP, msg_id]
            await _retrying(
                lambda: self._settle(keys=[done_key, result_key, STREAM], args=args), deadline
            )
            self.processed += 1
        except RedisError as exc:  # left pending: reclaimed once its lease expires
            _log.warning("worker %s: call %s not settled: %s", self.name, msg_id, exc)
        finally:
            self._held.discard(msg_id)
            self._slots.release()
