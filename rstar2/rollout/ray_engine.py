"""A vLLM engine inside a Ray actor, behind the :class:`~rstar2.rollout.engine.Engine` protocol.

``RayEngine.create(config, tasks)`` starts an :class:`EngineActor` (an async Ray actor hosting a
:class:`~rstar2.rollout.vllm_engine.VLLMEngine`) on whatever node Ray places it and returns a
client whose ``generate`` / weight-update calls are actor calls; weight buckets travel through
Ray's object store. ``kv_stats()`` is synchronous in the protocol, so the client keeps the
actor's latest stats, refreshed every ``stats_interval_s`` by a task in the caller's task group
(the runtime's: a failed refresh, e.g. a dead actor, fails the group instead of going
unnoticed; without one, a task of the running loop that ``aclose`` awaits). An actor
that fails to start is killed. Needs a running ``ray.init()``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Sequence
from typing import Any

from rstar2.rollout.engine import Generation, KVStats, SamplingSettings
from rstar2.rollout.vllm_engine import VLLMEngine, VLLMEngineConfig


class EngineActor:
    """The actor body (wrapped with ``ray.remote`` by :meth:`RayEngine.create`)."""

    def __init__(self) -> None:
        self._engine: VLLMEngine | None = None

    async def start(self, config: VLLMEngineConfig) -> dict[str, int]:
        self._engine = await VLLMEngine.create(config)
        return {"block_size": self._engine.block_size}

    def _get(self) -> VLLMEngine:
        if self._engine is None:
            raise RuntimeError("the engine actor was not started")
        return self._engine

    async def generate(self, prompt_ids: list[int], sampling: SamplingSettings) -> Generation:
        return await self._get().generate(prompt_ids, sampling)

    def kv_stats(self) -> KVStats:
        return self._get().kv_stats()

    async def begin_weight_update(self) -> None:
        await self._get().begin_weight_update()

    async def update_weights(self, named_tensors: list[tuple[str, Any]]) -> None:
        await self._get().update_weights(named_tensors)

    async def finish_weight_update(self) -> None:
        await self._get().finish_weight_update()

    async def weight_checksum(self) -> str:
        return await self._get().weight_checksum()

    async def aclose(self) -> None:
        if self._engine is not None:
            await self._engine.aclose()
            self._engine = None


class RayEngine:
    """Client of one :class:`EngineActor`; satisfies the Engine protocol."""

    def __init__(
        self,
        actor: Any,
        block_size: int,
        stats: KVStats,
        interval_s: float,
        tasks: asyncio.TaskGroup | None,
    ) -> None:
        self._actor = actor
        self._block_size = block_size
        self._stats = stats
        self._interval_s = interval_s
        spawn = tasks.create_task if tasks else asyncio.get_running_loop().create_task
        self._refresher = spawn(self._refresh())

    @property
    def block_size(self) -> int:
        return self._block_size

    @classmethod
    async def create(
        cls,
        config: VLLMEngineConfig,
        tasks: asyncio.TaskGroup | None = None,
        *,
        num_cpus: float = 1,
        num_gpus: float = 0,
        stats_interval_s: float = 0.05,
    ) -> RayEngine:
        import ray

        remote: Any = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus)(EngineActor)
        actor = remote.remote()
        try:
            info = await actor.start.remote(config)
            stats = await actor.kv_stats.remote()
        except BaseException:
            ray.kill(actor)
            raise
        return cls(actor, int(info["block_size"]), stats, stats_interval_s, tasks)

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingSettings) -> Generation:
        result: Generation = await self._actor.generate.remote(list(prompt_ids), sampling)
        return result

    def kv_stats(self) -> KVStats:
        return self._stats

    async def begin_weight_update(self) -> None:
        await self._actor.begin_weight_update.remote()

    async def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        await self._actor.update_weights.remote(list(named_tensors))

    async def finish_weight_update(self) -> None:
        await self._actor.finish_weight_update.remote()

    async def weight_checksum(self) -> str:
        checksum: str = await self._actor.weight_checksum.remote()
        return checksum

    async def aclose(self) -> None:
        """Stop the stats task, the engine, and the actor (idempotent)."""
        import ray

        if self._actor is None:
            return
        self._refresher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._refresher
        try:
            await self._actor.aclose.remote()
        finally:
            ray.kill(self._actor)
            self._actor = None

    async def _refresh(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            self._stats = await self._actor.kv_stats.remote()
