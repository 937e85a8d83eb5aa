"""The sandbox-pool HTTP service (aiohttp): native /v1 API, code-judge endpoints, health, metrics.

Guarantees: every admitted call gets exactly one answer; past ``max_pending`` admitted calls a
native request is answered 429 with ``Retry-After`` and a code-judge submission with reason
``queue_timeout`` (what code-judge clients retry on), never dropped silently. Bad JSON, unknown
fields and over-size bodies are 4xx with a reason. ``/healthz`` and ``/ping`` never wait for the
executor. With a token configured, every other endpoint needs ``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from sandbox_pool.protocol import STATUSES, ExecRequest, ExecResult, ProtocolError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
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
    max_code_chars: int = 1_000_000
    max_batch: int = 1024
    token: str | None = None
    retry_after_s: int = 1


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
        for status in STATUSES:
            self.metrics.calls.labels(status=status)

    def build_app(self) -> web.Application:
        app = web.Application(
            client_max_size=self.config.max_body_mb * 1024 * 1024,
            middlewares=[self._auth_middleware],
        )
        app.router.add_post("/v1/execute", self._execute)
        app.router.add_post("/v1/execute/batch", self._execute_batch)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/metrics", self._metrics)
        for path in ("/run", "/judge"):
            app.router.add_post(path, self._cj_single)
            app.router.add_post(f"{path}/batch", self._cj_batch)
            app.router.add_post(f"{path}/long-batch", self._cj_batch)
        app.router.add_get("/ping", self._ping)
        app.router.add_get("/status", self._status)
        return app

    # ---- admission ----

    def _admit(self, n: int) -> bool:
        """Admit ``n`` calls while below ``max_pending`` (so admitted work is bounded by
        ``max_pending + max_batch``, and a batch larger than ``max_pending`` still gets in)."""
        if self.pending >= self.config.max_pending:
            self.metrics.rejected.inc(n)
            return False
        self.pending += n
        self.metrics.in_flight.set(self.pending)
        return True

    async def _run(self, request: ExecRequest) -> ExecResult:
        """Run one admitted call; it has already been counted in ``pending``."""
        start = time.perf_counter()
        try:
            result = await self.executor.execute(request)
        except Exception as exc:  # an executor failure is still an answer
            result = ExecResult(status="internal_error", stderr=f"{type(exc).__name__}: {exc}")
        finally:
            self.pending -= 1
            self.metrics.in_flight.set(self.pending)
        self.metrics.calls.labels(status=result.status).inc()
        self.metrics.latency.observe(time.perf_counter() - start)
        return result

    async def _run_many(self, requests: list[ExecRequest]) -> list[ExecResult]:
        return list(await asyncio.gather(*(self._run(r) for r in requests)))

    # ---- native API ----

    async def _execute(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        call = self._parse(body)
        if not self._admit(1):
            return self._too_busy()
        return web.json_response((await self._run(call)).to_json())

    async def _execute_batch(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
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

    def _too_busy(self) -> web.Response:
        return web.json_response(
            {"error": "too many pending calls; retry later"},
            status=429,
            headers={"Retry-After": str(self.config.retry_after_s)},
        )

    # ---- health and metrics ----

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "pending": self.pending})

    async def _metrics(self, request: web.Request) -> web.Response:
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
        status = self.executor.status()
        return web.json_response(
            {"queue": status.get("queued", 0), "pending": self.pending, **status}
        )

    async def _cj_single(self, request: web.Request) -> web.Response:
        sub = _submission(await _json_body(request))
        judge_only = request.path.startswith("/judge")
        result = (await self._judge_all([sub]))[0]
        return web.json_response(_cj_view(result, judge_only))

    async def _cj_batch(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        parsed = self._parse_items(body, "submissions", _submission)
        judge_only = request.path.startswith("/judge")
        results = await self._judge_all(parsed)
        return web.json_response(
            {
                "sub_id": body.get("sub_id") or str(uuid.uuid4()),
                "results": [_cj_view(r, judge_only) for r in results],
            }
        )

    async def _judge_all(self, subs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Run what can be admitted; the rest is answered ``queue_timeout`` (clients retry)."""
        runnable = [s for s in subs if s["type"] == "python"]
        admitted = runnable if self._admit(len(runnable)) else []
        results = await self._run_many(
            [ExecRequest(code=s["solution"], stdin=s.get("input") or "") for s in admitted]
        )
        by_id = {id(s): r for s, r in zip(admitted, results, strict=True)}
        return [_cj_result(s, by_id.get(id(s))) for s in subs]

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


def _submission(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise _bad_request("a submission must be a JSON object")
    if not isinstance(body.get("solution"), str):
        raise _bad_request("'solution' must be a string")
    kind = body.get("type", "python")
    if kind not in ("python", "cpp", "math"):
        raise _bad_request("'type' must be one of python, cpp, math")
    stdin = body.get("input")
    if stdin is not None and not isinstance(stdin, str):
        raise _bad_request("'input' must be a string")
    return {**body, "type": kind, "sub_id": body.get("sub_id") or str(uuid.uuid4())}


def _cj_result(sub: dict[str, Any], result: ExecResult | None) -> dict[str, Any]:
    """code-judge's SubmissionResult for one submission."""
    base = {"sub_id": sub["sub_id"], "stdout": "", "stderr": "", "cost": 0.0}
    if sub["type"] != "python":
        err = f"unsupported submission type '{sub['type']}' (this server runs python)"
        return {**base, "success": False, "run_success": False, "reason": "", "stderr": err}
    if result is None:
        return {**base, "success": False, "run_success": False, "reason": "queue_timeout"}
    run_success = result.status == "ok" and result.exit_code == 0
    expected = sub.get("expected_output")
    success = run_success and (expected is None or result.stdout.strip() == str(expected).strip())
    reason = {"timeout": "worker_timeout", "internal_error": "internal_error"}.get(
        result.status, ""
    )
    return {
        **base,
        "success": success,
        "run_success": run_success,
        "cost": result.duration_s,
        "reason": reason,
        "stdout": result.stdout,
        "stderr": result.stderr,
    }


def _cj_view(result: dict[str, Any], judge_only: bool) -> dict[str, Any]:
    if judge_only:
        return {k: result[k] for k in ("sub_id", "success", "run_success", "cost", "reason")}
    return result


async def _json_body(request: web.Request) -> Any:
    try:
        return await request.json(loads=json.loads)
    except json.JSONDecodeError as exc:
        raise _bad_request(f"body is not valid JSON ({exc.msg})") from None
    except UnicodeDecodeError:
        raise _bad_request("body is not UTF-8") from None


def _bad_request(reason: str) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(
        text=json.dumps({"error": reason}), content_type="application/json", reason=reason
    )
