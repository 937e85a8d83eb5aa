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

from rstar2.rollout.engine import EngineDown, Generation, KVStats, SamplingSettings
from rstar2.rollout.vllm_engine import RPC_TIMEOUT_S, VLLMEngine, VLLMEngineConfig

CLOSE_TIMEOUT_S = 60.0  # an engine actor's own shutdown; past it the actor is killed
# an actor call: the engine inside bounds each of its own calls at RPC_TIMEOUT_S (and says which
# one hung; a call makes two at most); this bounds an actor that does not answer at all
ACTOR_CALL_TIMEOUT_S = 2 * RPC_TIMEOUT_S + 60.0
PING_TIMEOUT_S = 30.0  # a liveness probe: no engine work behind it


class EngineActor:
    """The actor body (wrapped with ``ray.remote`` by :meth:`RayEngine.create`)."""

    def __init__(self) -> None:
        self._engine: VLLMEngine | None = None

    async def start(self, config: VLLMEngineConfig) -> dict[str, Any]:
        import ray

        self._engine = await VLLMEngine.create(config)
        return {"block_size": self._engine.block_size, "node_ip": ray.util.get_node_ip_address()}

    # vLLM's weight-sync client protocol (what its RayVLLMWeightSyncClient calls on an
    # AsyncLLM actor), so vLLM's own trainer engines can drive this actor
    async def init_weight_transfer_engine(self, request: Any) -> None:
        await self._get().init_weight_transfer(request.init_info)

    async def start_weight_update(self) -> None:
        await self._get().start_weight_transfer()

    async def finish_weight_update(self, weight_version: str | None = None) -> None:
        await self._get().finish_weight_transfer(weight_version)

    async def update_weight_version(self, version: str) -> None:
        await self._get().set_weight_version(version)

    async def sleep(self, level: int) -> None:
        await self._get().sleep(level)

    async def wake_up(self, tags: list[str] | None) -> None:
        await self._get().wake_up(tags)

    def _get(self) -> VLLMEngine:
        if self._engine is None:
            raise RuntimeError("the engine actor was not started")
        return self._engine

    async def generate(self, prompt_ids: list[int], sampling: SamplingSettings) -> Generation:
        return await self._get().generate(prompt_ids, sampling)

    def kv_stats(self) -> KVStats:
        return self._get().kv_stats()

    def alive(self) -> bool:
        return self._get().alive()

    async def begin_weight_update(self) -> None:
        await self._get().begin_weight_update()

    async def update_weights(self, named_tensors: list[tuple[str, Any]] | Any) -> None:
        """A bucket of (name, tensor) pairs (the file path), or vLLM's update request."""
        if hasattr(named_tensors, "update_info"):
            await self._get().receive_weights(named_tensors.update_info)
        else:
            await self._get().update_weights(named_tensors)

    async def finish_bucket_update(self) -> None:
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
        tensor_parallel_size: int = 1,
        node_ip: str = "",
    ) -> None:
        self._actor = actor
        self._block_size = block_size
        self.node_ip = node_ip  # the node it runs on
        self._tensor_parallel_size = tensor_parallel_size
        self._stats = stats
        self._alive = True
        self._interval_s = interval_s
        spawn = tasks.create_task if tasks else asyncio.get_running_loop().create_task
        self._refresher = spawn(self._refresh())

    @property
    def block_size(self) -> int:
        return self._block_size

    def _live(self) -> Any:
        if self._actor is None:
            raise EngineDown("the engine actor was closed")
        return self._actor

    @property
    def actor(self) -> Any:
        """The :class:`EngineActor` handle (what a learner group sends weights to)."""
        return self._actor

    @classmethod
    async def create(
        cls,
        config: VLLMEngineConfig,
        tasks: asyncio.TaskGroup | None = None,
        *,
        num_cpus: float = 1,
        num_gpus: float = 0,
        stats_interval_s: float = 0.05,
        bundle: tuple[Any, int] | None = None,
        env: dict[str, str] | None = None,
        resources: dict[str, float] | None = None,
    ) -> RayEngine:
        """``bundle``: (placement group, index) to start in; ``env``: the actor's environment
        variables (a colocated engine is pinned to its learner ranks' GPUs this way);
        ``resources``: custom Ray resources asked for too (a launched job's role)."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        remote: Any = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus, resources=resources or {})(
            EngineActor
        )
        options: dict[str, Any] = {}  # one options() call: its result has no options()
        if bundle is not None:
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                bundle[0], placement_group_bundle_index=bundle[1]
            )
        if env:
            options["runtime_env"] = {"env_vars": env}
        actor = (remote.options(**options) if options else remote).remote()
        try:
            info = await actor.start.remote(config)
            stats = await actor.kv_stats.remote()
        except BaseException:
            ray.kill(actor)
            raise
        tp = config.rollout.tensor_parallel_size
        block = int(info["block_size"])
        return cls(actor, block, stats, stats_interval_s, tasks, tp, str(info["node_ip"]))

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingSettings) -> Generation:
        import ray.exceptions

        try:
            result: Generation = await self._live().generate.remote(list(prompt_ids), sampling)
        except (ray.exceptions.ActorDiedError, ray.exceptions.ActorUnavailableError) as exc:
            raise EngineDown(f"the engine actor is gone: {exc}".splitlines()[0]) from exc
        return result

    def kv_stats(self) -> KVStats:
        return self._stats

    def alive(self) -> bool:
        """As of the last stats poll (the actor, and the vLLM engine inside it)."""
        return self._alive

    async def begin_weight_update(self) -> None:
        await self._call("a weight update", "begin_weight_update")

    async def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        await self._call("a weight update", "update_weights", list(named_tensors))

    async def finish_weight_update(self) -> None:
        await self._call("a weight update", "finish_bucket_update")

    # ---- vLLM's native weight transfer (rstar2.sync.vllm_native) ----

    @property
    def tensor_parallel_size(self) -> int:
        return self._tensor_parallel_size

    async def init_weight_transfer(self, init_info: dict[str, Any]) -> None:
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        request = WeightTransferInitRequest(init_info)
        await self._call(  # waits for the learner's side: no deadline of ours
            "the weight-transfer set-up", "init_weight_transfer_engine", request, bounded=False
        )

    async def start_weight_transfer(self) -> None:
        await self._call("a weight update", "start_weight_update")

    async def receive_weights(self, update_info: dict[str, Any]) -> None:
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        request = WeightTransferUpdateRequest(update_info)
        await self._call("a weight update", "update_weights", request)

    async def finish_weight_transfer(self, version: str | None = None) -> None:
        await self._call("a weight update", "finish_weight_update", version)

    async def set_weight_version(self, version: str) -> None:
        await self._call("a weight update", "update_weight_version", version)

    async def sleep(self, level: int) -> None:
        await self._call("sleep", "sleep", level)

    async def wake_up(self, tags: list[str] | None = None) -> None:
        await self._call("wake-up", "wake_up", tags)

    async def weight_checksum(self) -> str:
        return str(await self._call("a checksum", "weight_checksum"))

    async def ping(self, timeout_s: float = PING_TIMEOUT_S) -> None:
        """EngineDown unless the actor answers within ``timeout_s`` that its vLLM engine lives
        (an async actor answers while another of its calls waits)."""
        import ray.exceptions

        try:
            alive = await asyncio.wait_for(self._live().alive.remote(), timeout_s)
        except TimeoutError as exc:
            if isinstance(exc, ray.exceptions.RayTaskError):
                raise
            raise EngineDown(f"the engine actor did not answer in {timeout_s:g}s") from None
        except (ray.exceptions.ActorDiedError, ray.exceptions.ActorUnavailableError) as exc:
            raise EngineDown(f"the engine actor is gone: {exc}".splitlines()[0]) from exc
        if not alive:
            raise EngineDown("the vLLM engine inside the actor is dead")

    async def _call(self, what: str, method: str, *args: Any, bounded: bool = True) -> Any:
        """One call of the actor's ``method``. EngineDown when the actor is gone (killed, its
        node lost) or, ``bounded``, has not answered in ``ACTOR_CALL_TIMEOUT_S``, as the
        in-process engine raises it (the weight sync and the runtime restart an engine on
        EngineDown; any other error stops the run). An EngineDown raised inside the actor
        arrives as itself (Ray's task error is an instance of its cause's class)."""
        import ray.exceptions

        ref = getattr(self._live(), method).remote(*args)
        try:
            if not bounded:
                return await ref
            return await asyncio.wait_for(ref, ACTOR_CALL_TIMEOUT_S)
        except TimeoutError as exc:
            if isinstance(exc, ray.exceptions.RayTaskError):
                raise  # raised inside the actor, which did answer
            raise EngineDown(
                f"the engine actor did not answer {what} in {ACTOR_CALL_TIMEOUT_S:g}s"
            ) from None
        except (ray.exceptions.ActorDiedError, ray.exceptions.ActorUnavailableError) as exc:
            raise EngineDown(f"the engine actor is gone ({what}): {exc}".splitlines()[0]) from exc

    async def aclose(self) -> None:
        """Stop the stats task, the engine, and the actor (idempotent)."""
        import ray

        if self._actor is None:
            return
        self._refresher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._refresher
        try:  # a hung actor does not answer: it is killed all the same
            await asyncio.wait_for(self._actor.aclose.remote(), CLOSE_TIMEOUT_S)
        except (TimeoutError, ray.exceptions.RayError):
            pass
        finally:
            ray.kill(self._actor)
            self._actor = None

    async def _refresh(self) -> None:
        import ray.exceptions

        while self._alive:
            await asyncio.sleep(self._interval_s)
            try:
                self._stats = await self._actor.kv_stats.remote()
                self._alive = await self._actor.alive.remote()
            except (ray.exceptions.ActorDiedError, ray.exceptions.ActorUnavailableError):
                self._alive = False  # the next request or weight sync moves on without it
