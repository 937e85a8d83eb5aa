"""``SandboxClient(url)``: the remote twin of :class:`SandboxPool` (same ``run`` / ``run_batch``).

- One pooled aiohttp session (keep-alive, ``max_connections``).
- Retries with exponential backoff (capped at 2 s) on 429 (honouring ``Retry-After``), 5xx and
  connection errors until ``max_wait_s`` after the call was sent, so a service that restarts
  (or a server killed with calls in flight, which run again on the new one) costs latency, not
  a call; past it the call is answered ``internal_error``: ``run`` never raises for the
  service's trouble, only :class:`PoolClosed` for use after :meth:`close`.
- Micro-batching: concurrent ``run`` calls issued within ``batch_window_s`` of each other are
  sent together to ``/v1/execute/batch`` (at most ``max_batch``); a lone call uses ``/v1/execute``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from sandbox_pool.api import SandboxAPI
from sandbox_pool.pool import PoolClosed
from sandbox_pool.protocol import ExecRequest, ExecResult

_RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


@dataclass(frozen=True, kw_only=True)
class ClientConfig:
    # the server's bearer token; default: SANDBOX_POOL_TOKEN, as `sandbox-pool serve` reads it
    token: str | None = field(default_factory=lambda: os.environ.get("SANDBOX_POOL_TOKEN") or None)
    max_connections: int = 64
    # a call the service has not answered this long after it was first sent is internal_error
    max_wait_s: float = 600.0
    backoff_s: float = 0.05  # first retry delay; doubles each time, capped at 2 s
    batch_window_s: float = 0.001
    max_batch: int = 64
    request_timeout_s: float = 600.0


class SandboxClient(SandboxAPI):
    def __init__(self, url: str, config: ClientConfig | None = None) -> None:
        self.url = url.rstrip("/")
        self.config = config or ClientConfig()
        self._session: aiohttp.ClientSession | None = None
        self._pending: list[tuple[ExecRequest, asyncio.Future[ExecResult]]] = []
        self._flush_handle: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self.batches_sent = 0

    async def __aenter__(self) -> SandboxClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Send what is queued, wait for in-flight requests, close the session."""
        if self._closed:
            return
        self._closed = True
        self._flush()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    async def execute(self, request: ExecRequest) -> ExecResult:
        if self._closed:
            raise PoolClosed("SandboxClient is closed")
        future: asyncio.Future[ExecResult] = asyncio.get_running_loop().create_future()
        self._pending.append((request, future))
        if len(self._pending) >= self.config.max_batch:
            self._flush()
        elif self._flush_handle is None:
            loop = asyncio.get_running_loop()
            self._flush_handle = loop.call_later(self.config.batch_window_s, self._flush)
        return await future

    async def health(self) -> dict[str, Any]:
        async with self._ensure_session().get(f"{self.url}/healthz") as resp:
            resp.raise_for_status()
            data: dict[str, Any] = await resp.json()
            return data

    def _flush(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        while self._pending:
            batch = self._pending[: self.config.max_batch]
            del self._pending[: self.config.max_batch]
            task = asyncio.get_running_loop().create_task(self._send(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: list[tuple[ExecRequest, asyncio.Future[ExecResult]]]) -> None:
        results: list[ExecResult]
        try:
            if len(batch) == 1:
                data, error = await self._post("/v1/execute", _request_json(batch[0][0]))
                results = [ExecResult.from_json(data)] if error is None else []
            else:
                body = {"requests": [_request_json(r) for r, _ in batch]}
                data, error = await self._post("/v1/execute/batch", body)
                self.batches_sent += 1
                results = (
                    [ExecResult.from_json(r) for r in data["results"]] if error is None else []
                )
        except Exception as exc:  # a malformed answer is an answer too
            error = f"internal_error: bad response from the sandbox service: {exc}"
        if error is not None:
            status, _, message = error.partition(": ")
            failed = ExecResult(status=status, stderr=message)  # type: ignore[arg-type]
            results = [failed] * len(batch)
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)

    async def _post(self, path: str, body: dict[str, Any]) -> tuple[Any, str | None]:
        """POST with retries: ``(json, None)``, or ``(None, "status: reason")`` on failure."""
        delay = self.config.backoff_s
        error = "internal_error: sandbox service unavailable"
        give_up = time.monotonic() + self.config.max_wait_s
        while True:
            wait = delay
            try:
                async with self._ensure_session().post(f"{self.url}{path}", json=body) as resp:
                    if resp.status < 400:
                        return await resp.json(), None
                    if resp.status not in _RETRY_STATUSES:  # retrying cannot help
                        return None, f"rejected: HTTP {resp.status}: {await resp.text()}"
                    error = f"internal_error: HTTP {resp.status} after retries"
                    with contextlib.suppress(ValueError, TypeError):
                        wait = max(wait, float(resp.headers.get("Retry-After", 0)))
            except (TimeoutError, aiohttp.ClientConnectionError) as exc:
                error = f"internal_error: sandbox service unreachable ({type(exc).__name__})"
            left = give_up - time.monotonic()
            if left <= 0:
                return None, error
            await asyncio.sleep(min(wait, left))
            delay = min(delay * 2, 2.0)

    def _ensure_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            headers = {}
            if self.config.token:
                headers["Authorization"] = f"Bearer {self.config.token}"
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.config.max_connections),
                timeout=aiohttp.ClientTimeout(total=self.config.request_timeout_s),
                headers=headers,
            )
        return self._session


def _request_json(request: ExecRequest) -> dict[str, Any]:
    """The request's fields, defaults left out (a server without a field still understands)."""
    defaults = ExecRequest(code="")
    body: dict[str, Any] = {"code": request.code, "stdin": request.stdin}
    for name, value in request.to_json().items():
        if name not in body and value != getattr(defaults, name):
            body[name] = value
    return body
