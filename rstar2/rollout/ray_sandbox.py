"""The embedded sandbox pool inside a Ray actor, so tool execution can live on any node.

``RaySandbox.create(config)`` starts a :class:`SandboxActor` (an async Ray actor hosting a
:class:`~sandbox_pool.pool.SandboxPool`) and returns a client with the agent loop's
``execute(request)``; requests and results travel as Ray objects. Needs a running ``ray.init()``.
"""

from __future__ import annotations

from typing import Any

from sandbox_pool.pool import PoolConfig, SandboxPool
from sandbox_pool.protocol import ExecRequest, ExecResult


class SandboxActor:
    """The actor body (wrapped with ``ray.remote`` by :meth:`RaySandbox.create`)."""

    def __init__(self) -> None:
        self._pool: SandboxPool | None = None

    async def start(self, config: PoolConfig) -> int:
        self._pool = SandboxPool(config)
        await self._pool.start()
        return config.resolved_workers()

    async def execute(self, request: ExecRequest) -> ExecResult:
        if self._pool is None:
            raise RuntimeError("the sandbox actor was not started")
        return await self._pool.execute(request)

    async def aclose(self) -> None:
        if self._pool is not None:
            await self._pool.aclose()


class RaySandbox:
    """Client of one :class:`SandboxActor`; satisfies the agent loop's ``Sandbox`` protocol."""

    def __init__(self, actor: Any, num_workers: int) -> None:
        self._actor = actor
        self.num_workers = num_workers

    @classmethod
    async def create(cls, config: PoolConfig, *, num_cpus: float = 1) -> RaySandbox:
        import ray

        # the actor serves many calls at once: its pool bounds them, not Ray's default of 1000
        remote: Any = ray.remote(num_cpus=num_cpus)(SandboxActor)
        actor = remote.options(max_concurrency=4096).remote()
        try:
            workers = await actor.start.remote(config)
        except BaseException:
            ray.kill(actor)
            raise
        return cls(actor, int(workers))

    async def execute(self, request: ExecRequest) -> ExecResult:
        result: ExecResult = await self._actor.execute.remote(request)
        return result

    async def aclose(self) -> None:
        """Close the pool, then stop the actor (idempotent)."""
        import ray

        if self._actor is None:
            return
        try:
            await self._actor.aclose.remote()
        finally:
            ray.kill(self._actor)
            self._actor = None
