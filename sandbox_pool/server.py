"""The sandbox-pool HTTP service (aiohttp): native /v1 API, code-judge endpoints, health, metrics.

Guarantees: every admitted call gets exactly one answer. Past ``max_pending`` admitted calls a
native request is answered 429 with ``Retry-After``; a code-judge submission waits for room, up
to its queue deadline (``/run``, ``/batch``: ``queue_wait_s``; ``/long-batch``:
``long_batch_wait_s``), then is answered ``queue_timeout`` (what code-judge clients retry on),
never dropped silently. Waiting submissions are admitted in arrival order. Bad input is a 4xx
with a one-line reason, never a 500: 400 on /v1, 422 with FastAPI's ``detail`` list on
code-judge's endpoints (see :mod:`sandbox_pool.codejudge`); bodies are held to strict JSON
(:func:`sandbox_pool.protocol.decode_body`), a body past ``max_body_mb`` is 413, one that
stops short of its Content-Length is 408 after ``body_read_timeout_s``, and our GET endpoints
refuse a query (code-judge's ignore one, as FastAPI does). ``/healthz`` and ``/ping`` never
wait for the executor. ``/status`` has code-judge's two fields only; ``/v1/status`` has ours.
With a token configured, every other endpoint needs ``Authorization: Bearer <token>``.

Draining (:meth:`SandboxServer.drain`, on SIGTERM): calls that have not started are handed back
as 503 with ``Retry-After`` (new ones, and those the executor hands back: a batch with one is
answered 503 whole, so the client sends it again, to the restarted service), running ones
finish, and ``/healthz`` answers 503; so a stop takes as long as the longest running call.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from sandbox_pool import codejudge as cj
from sandbox_pool.pool import PoolDraining
from sandbox_pool.protocol import STATUSES, ExecRequest, ExecResult, ProtocolError, decode_body

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_log = logging.getLogger("sandbox_pool.server")
T = TypeVar("T")
_OPEN_PATHS = frozenset({"/healthz", "/ping"})


class Executor(Protocol):
    """What the server runs calls on: the embedded pool, or the Redis dispatcher."""

    async def execute(self, request: ExecRequest) -> ExecResult: ...

    def status(self) -> dict[str, Any]: ...


@dataclass(frozen=True, kw_only=True)
class ServerConfig:
    max_pending: int = 1024  # admitted calls (running + waiting) before 429 / queue_timeout
    max_body_mb: int = 16
    body_read_timeout_s: float = 30.0  # a body shorter than its Content-Length: 408 after this
    max_code_chars: int = 1_000_000
    max_batch: int = 1024
    token: str | None = None
    retry_after_s: int = 1
    codejudge: cj.CodeJudgeSettings = field(default_factory=cj.CodeJudgeSettings)


class _Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.calls = Counter(
            "sandbox_calls", "Finished calls by status", ["status"], registry=self.registry
        )
        self.rejected = Counter(
            "sandbox_rejected", "Calls refused by admission control", registry=self.registry
        )
        self.latency = Histogram(
            "sandbox_call_seconds",
            "Wall time of a call inside the server",
            buckets=(0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        self.in_flight = Gauge("sandbox_in_flight", "Admitted calls", registry=self.registry)
        self.queue_depth = Gauge(
            "sandbox_queue_depth", "Calls waiting for an executor", registry=self.registry
        )


class SandboxServer:
    """Owns admission control and the HTTP handlers; the executor does the work."""

    def __init__(self, executor: Executor, config: ServerConfig | None = None) -> None:
        self.executor = executor
        self.config = config or ServerConfig()
        self.metrics = _Metrics()
        self.pending = 0
        self.draining = False
        self.handed_back = 0  # requests answered 503 while draining
        self._room: deque[asyncio.Future[bool]] = deque()  # code-judge calls waiting for room
        for status in STATUSES:
            self.metrics.calls.labels(status=status)

    def build_app(self) -> web.Application:
        app = web.Application(
            client_max_size=self.config.max_body_mb * 1024 * 1024,
            middlewares=[self._auth_middleware, _errors_middleware, self._drain_middleware],
        )
        app.router.add_post("/v1/execute", self._execute)
        app.router.add_post("/v1/execute/batch", self._execute_batch)
        app.router.add_get("/v1/status", self._v1_status)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/metrics", self._metrics)
        for path in ("/run", "/judge"):
            app.router.add_post(path, self._cj_single)
            app.router.add_post(f"{path}/batch", self._cj_batch)
            app.router.add_post(f"{path}/long-batch", self._cj_long_batch)
        app.router.add_get("/ping", self._ping)
        app.router.add_get("/status", self._status)
        return app

    def drain(self) -> None:
        """Take no more calls (see the module docstring); the executor is drained by its
        owner."""
        self.draining = True

    # ---- admission ----

    def _admit(self, n: int) -> bool:
        """Admit ``n`` calls while below ``max_pending`` (so admitted work is bounded by
        ``max_pending + max_batch``, and a batch larger than ``max_pending`` still gets in)."""
        if self.pending >= self.config.max_pending or self._room:
            self.metrics.rejected.inc(n)
            return False
        self.pending += n
        self.metrics.in_flight.set(self.pending)
        return True

    async def _admit_within(self, wait_s: float) -> bool:
        """Admit one call as soon as there is room (first come, first served), or False after
        ``wait_s``."""
        if self.pending < self.config.max_pending and not self._room:
            self.pending += 1
            self.metrics.in_flight.set(self.pending)
            return True
        loop = asyncio.get_running_loop()
        room: asyncio.Future[bool] = loop.create_future()
        timer = loop.call_later(wait_s, _settle, room, False)
        self._room.append(room)
        try:
            admitted = await room
        finally:
            timer.cancel()
        if not admitted:
            self.metrics.rejected.inc()
        return admitted

    def _hand_off(self) -> None:
        """Give freed room to the oldest waiting code-judge call (counted for it here)."""
        while self._room and self.pending < self.config.max_pending:
            room = self._room.popleft()
            if not room.done():
                self.pending += 1
                room.set_result(True)
        self.metrics.in_flight.set(self.pending)

    async def _run(self, request: ExecRequest) -> ExecResult:
        """Run one admitted call; it has already been counted in ``pending``."""
        start = time.perf_counter()
        try:
            result = await self.executor.execute(request)
        except PoolDraining:  # it did not run: the whole request is answered 503
            raise
        except Exception as exc:  # an executor failure is still an answer
            result = ExecResult(status="internal_error", stderr=f"{type(exc).__name__}: {exc}")
        finally:
            self.pending -= 1
            self._hand_off()
        self.metrics.calls.labels(status=result.status).inc()
        self.metrics.latency.observe(time.perf_counter() - start)
        return result

    async def _run_many(self, requests: list[ExecRequest]) -> list[ExecResult]:
        return list(await asyncio.gather(*(self._run(r) for r in requests)))

    # ---- native API ----

    async def _read(self, request: web.Request) -> bytes:
        """The whole body, or 408 when it stops short of its Content-Length for
        ``body_read_timeout_s`` (413 past ``max_body_mb`` comes from aiohttp)."""
        try:
            return await asyncio.wait_for(request.read(), self.config.body_read_timeout_s)
        except TimeoutError:
            reason = f"body incomplete after {self.config.body_read_timeout_s:g} s"
            raise web.HTTPRequestTimeout(
                text=json.dumps({"error": reason}), content_type="application/json"
            ) from None

    async def _json(self, request: web.Request) -> Any:
        """The body's JSON value (native API); 400 with a one-line reason otherwise."""
        try:
            return decode_body(await self._read(request))
        except ProtocolError as exc:
            raise _bad_request(str(exc)) from None

    async def _execute(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        call = self._parse(body)
        if not self._admit(1):
            return self._too_busy()
        return web.json_response((await self._run(call)).to_json())

    async def _execute_batch(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        calls = self._parse_items(body, "requests", self._parse)
        if not self._admit(len(calls)):
            return self._too_busy()
        results = await self._run_many(calls)
        return web.json_response({"results": [r.to_json() for r in results]})

    def _parse_items(self, body: Any, key: str, parse: Callable[[Any], T]) -> list[T]:
        """``body[key]`` as a non-empty list of at most max_batch items, each parsed; a bad item
        is a 400 naming its index."""
        items = body.get(key) if isinstance(body, dict) else None
        if not isinstance(items, list) or not items:
            raise _bad_request(f"'{key}' must be a non-empty list")
        if len(items) > self.config.max_batch:
            raise _bad_request(f"at most {self.config.max_batch} {key} per batch")
        parsed = []
        for i, item in enumerate(items):
            try:
                parsed.append(parse(item))
            except web.HTTPBadRequest as exc:
                raise _bad_request(f"{key}[{i}]: {exc.reason}") from None
        return parsed

    def _parse(self, body: Any) -> ExecRequest:
        try:
            return ExecRequest.from_json(body, max_code_chars=self.config.max_code_chars)
        except ProtocolError as exc:
            raise _bad_request(str(exc)) from None

    def _unavailable(self) -> web.Response:
        self.handed_back += 1
        return web.json_response(
            {"error": "the sandbox service is stopping; retry"},
            status=503,
            headers={"Retry-After": str(self.config.retry_after_s)},
        )

    def _too_busy(self) -> web.Response:
        return web.json_response(
            {"error": "too many pending calls; retry later"},
            status=429,
            headers={"Retry-After": str(self.config.retry_after_s)},
        )

    # ---- health and metrics ----

    async def _healthz(self, request: web.Request) -> web.Response:
        _no_query(request)
        if self.draining:
            return web.json_response({"status": "draining", "pending": self.pending}, status=503)
        return web.json_response({"status": "ok", "pending": self.pending})

    async def _metrics(self, request: web.Request) -> web.Response:
        _no_query(request)
        status = self.executor.status()
        self.metrics.queue_depth.set(status.get("queued", 0))
        return web.Response(
            body=generate_latest(self.metrics.registry),
            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
        )

    # ---- code-judge compatibility ----

    async def _ping(self, request: web.Request) -> web.Response:
        return web.json_response("pong")

    async def _status(self, request: web.Request) -> web.Response:
        """code-judge's /status: exactly ``queue`` (calls not yet running) and ``num_workers``."""
        status = self.executor.status()
        queued = int(status.get("queued", 0)) + self._waiting()
        return web.json_response({"queue": queued, "num_workers": int(status["num_workers"])})

    async def _v1_status(self, request: web.Request) -> web.Response:
        _no_query(request)
        status = self.executor.status()
        return web.json_response({"pending": self.pending, "waiting": self._waiting(), **status})

    def _waiting(self) -> int:
        """code-judge calls waiting for room (timed-out ones stay queued until a hand-off)."""
        return sum(not room.done() for room in self._room)

    async def _cj_single(self, request: web.Request) -> web.Response:
        sub = cj.parse(cj.Submission, await self._read(request))
        result = await self._judge(sub, self.config.codejudge.queue_wait_s)
        judge_only = request.path.startswith("/judge")
        return web.json_response(cj.judge_view(result) if judge_only else result)

    async def _cj_batch(self, request: web.Request) -> web.Response:
        return await self._cj_many(request, self.config.codejudge.queue_wait_s)

    async def _cj_long_batch(self, request: web.Request) -> web.Response:
        return await self._cj_many(request, self.config.codejudge.long_batch_wait_s)

    async def _cj_many(self, request: web.Request, wait_s: float) -> web.Response:
        batch = cj.parse(cj.BatchSubmission, await self._read(request))
        if len(batch.submissions) > self.config.max_batch:
            raise _unprocessable(f"at most {self.config.max_batch} submissions per batch")
        results = await asyncio.gather(*(self._judge(s, wait_s) for s in batch.submissions))
        judge_only = request.path.startswith("/judge")
        return web.json_response(
            {
                "sub_id": cj.sub_id_of(batch),
                "results": [cj.judge_view(r) if judge_only else r for r in results],
            }
        )

    async def _judge(self, sub: cj.Submission, wait_s: float) -> dict[str, Any]:
        """One submission's SubmissionResult: waits for room up to ``wait_s``, then runs."""
        start = time.perf_counter()
        sub_id = cj.sub_id_of(sub)
        if sub.type == "math":  # code-judge has no executor for it either
            return cj.failed_result(sub_id, "internal_error", 0.0)
        if not await self._admit_within(wait_s):
            return cj.failed_result(sub_id, "queue_timeout", time.perf_counter() - start)
        result = await self._run(cj.to_request(sub, self.config.codejudge))
        return cj.submission_result(sub, sub_id, result, self.config.codejudge)

    @web.middleware
    async def _drain_middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self.draining and request.method == "POST":
            return self._unavailable()
        try:
            return await handler(request)
        except PoolDraining:
            return self._unavailable()

    # ---- auth ----

    @web.middleware
    async def _auth_middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        token = self.config.token
        authorized = request.headers.get("Authorization", "") == f"Bearer {token}"
        if token and request.path not in _OPEN_PATHS and not authorized:
            return web.json_response(
                {"error": "missing or wrong bearer token"},
                status=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
        return await handler(request)


def _no_query(request: web.Request) -> None:
    """400 when a GET of ours is sent a query (it takes none: a typo should not pass)."""
    if request.query_string:
        names = ", ".join(sorted(set(request.query))) or request.query_string
        raise _bad_request(f"{request.path} takes no query parameters (got {names})")


def _unprocessable(reason: str) -> web.HTTPUnprocessableEntity:
    detail = [{"type": "value_error", "loc": ["body", "submissions"], "msg": reason}]
    return web.HTTPUnprocessableEntity(
        text=json.dumps({"detail": detail}), content_type="application/json"
    )


def _settle(future: asyncio.Future[bool], value: bool) -> None:
    if not future.done():
        future.set_result(value)


@web.middleware
async def _errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """code-judge's 422 for a body that does not validate; never a traceback to the client."""
    try:
        return await handler(request)
    except cj.InvalidBody as exc:
        return web.json_response({"detail": exc.detail}, status=422)
    except web.HTTPException:
        raise
    except Exception as exc:  # a bug: logged with its traceback, one line to the client
        _log.exception("unhandled error in %s %s", request.method, request.path)
        return web.json_response({"error": f"internal error: {type(exc).__name__}"}, status=500)


def _bad_request(reason: str) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(
        text=json.dumps({"error": reason}), content_type="application/json", reason=reason
    )
