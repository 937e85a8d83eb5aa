"""The runtime: one run's components as typed handles, opened under one exit stack.

    async with Runtime(placement_for(cfg)) as runtime:
        learner = runtime.open_learner(settings)                 # Learner
        async with runtime.services(spec, learner) as services:  # engines, dispatcher,
            ...                                                  # sandbox, scorer, weights

Guarantees:
- Every handle is registered for closing the moment it exists, so a failure at any point
  (a sandbox that refuses to start after the engines came up, a learner that cannot load)
  closes what was opened, in reverse order, and leaves no process or actor behind.
- Background tasks (the dispatcher's stats poller, Ray engines' stats refreshers) belong to
  one :class:`asyncio.TaskGroup` per :meth:`Runtime.services`; one that fails cancels the
  work inside and its error is raised from the ``async with``, never lost.
- Where things run is the :class:`~rstar2.runtime.placement.Placement`'s business
  (:func:`~rstar2.runtime.placement.placement_for`); nothing outside reads ``cluster.ray``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rstar2.config import (
    ConfigError,
    HttpSandboxConfig,
    RedisSandboxConfig,
    RewardConfig,
    SandboxConfig,
    SchedulerConfig,
)
from rstar2.runtime.placement import ClosableSandbox, Placement, placement_for

if TYPE_CHECKING:
    from rstar2.agent.loop import AgentSettings, Trajectory
    from rstar2.agent.template import ChatTemplate
    from rstar2.learner.build import LearnerSettings
    from rstar2.learner.protocol import Learner
    from rstar2.reward.scorer import RewardScorer
    from rstar2.rollout.dispatch import Dispatcher
    from rstar2.rollout.engine import Engine
    from rstar2.rollout.openai_engine import OpenAIServerConfig
    from rstar2.rollout.vllm_engine import VLLMEngineConfig
    from rstar2.sync import SyncStats, WeightSync

__all__ = ["Placement", "Runtime", "Services", "ServicesSpec", "placement_for"]

_PROBE_TIMEOUT_S = 30.0
# the key and hint of the error raised when an embedded pool cannot isolate calls
_REFUSAL = (
    "sandbox.unsafe_weak_isolation",
    "set it to true to run tool code with weaker isolation",
)


@dataclass(frozen=True, kw_only=True)
class ServicesSpec:
    """What :meth:`Runtime.services` opens: ``num_engines`` engines of ``engine`` (a vLLM engine
    the placement starts, or a running server), a sandbox, a scorer and a dispatcher."""

    engine: VLLMEngineConfig | OpenAIServerConfig
    num_engines: int = 1
    sandbox: SandboxConfig
    reward: RewardConfig
    scheduler: SchedulerConfig
    sandbox_refusal: tuple[str, str] = _REFUSAL
    weight_sync_bucket_bytes: int = 512 * 2**20


MAX_ENGINE_RESTARTS = 3  # per engine slot; then the run goes on without it
# a failed engine's close, and its replacement's start, give up after these (a hung actor or
# driver must not hang the weight sync that joins the replacement); a start that times out
# counts as a failed restart
ENGINE_CLOSE_TIMEOUT_S = 120.0
ENGINE_START_TIMEOUT_S = 1800.0
log = logging.getLogger(__name__)


@dataclass
class Services:
    """The rollout side of a run: engines behind one dispatcher, the sandbox, the scorer, and
    the weight sync from the run's learner into the engines (None: opened without one).

    ``restart`` starts a replacement for a failed engine. It starts in the background the
    moment the dispatcher takes the engine down (rollouts go on on the others meanwhile;
    at most :data:`MAX_ENGINE_RESTARTS` tries per slot), and joins at the next
    :meth:`sync_weights`, which gives it the current weights before it takes requests."""

    engines: list[Engine]
    dispatcher: Dispatcher
    sandbox: ClosableSandbox
    scorer: RewardScorer
    weight_sync: WeightSync | None = None
    restart: Callable[[], Awaitable[Engine]] | None = None
    restarts: dict[int, int] = field(default_factory=dict)  # engine slot -> restarts tried
    _starting: dict[int, asyncio.Task[Engine | None]] = field(default_factory=dict)
    _closed: bool = False

    def __post_init__(self) -> None:
        self.dispatcher.on_engine_down = self._restart_soon

    def _restart_soon(self, slot: int) -> None:
        """Start a replacement for the engine in ``slot`` (unless one is starting, the slot
        has used its tries, or the weight sync cannot take a replacement)."""
        tried = self.restarts.get(slot, 0)
        if self._closed or self.restart is None or slot in self._starting:
            return
        if tried >= MAX_ENGINE_RESTARTS:
            return
        if self.weight_sync is None or not self.weight_sync.replaces_engines:
            return  # the sync says why when it skips the engine
        self.restarts[slot] = tried + 1
        self._starting[slot] = asyncio.get_running_loop().create_task(self._replace(slot, tried))

    async def _replace(self, slot: int, tried: int) -> Engine | None:
        assert self.restart is not None
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.engines[slot].aclose(), ENGINE_CLOSE_TIMEOUT_S)
        try:
            return await asyncio.wait_for(self.restart(), ENGINE_START_TIMEOUT_S)
        except Exception as exc:  # the run goes on with fewer engines
            reason = (
                f"no engine after {ENGINE_START_TIMEOUT_S:.0f} s"
                if isinstance(exc, TimeoutError)
                else str(exc)
            )
            log.warning("rollout engine %d did not restart (try %d): %s", slot, tried + 1, reason)
            return None

    async def aclose(self) -> None:
        """Stop the restarts still under way (their engines close with the services); no
        restart starts after this."""
        self._closed = True
        for task in self._starting.values():
            task.cancel()
        await asyncio.gather(*self._starting.values(), return_exceptions=True)
        self._starting.clear()

    async def sync_weights(self) -> tuple[SyncStats, list[int]]:
        """The weight sync, after the replacements of failed engines have started (each
        restart joins here: it gets the current weights with the others and takes requests
        again). An engine that dies during the sync is taken down (its replacement starts at
        once); when none took the weights, the restarts and the sync run again. Returns the
        stats and the restarted slots that took the weights."""
        from rstar2.rollout.dispatch import AllEnginesDown
        from rstar2.rollout.engine import EngineDown

        scheduler = self.dispatcher.scheduler
        for i, engine in enumerate(self.engines):  # died while idle: no request has seen it
            if not scheduler.engines[i].down and not engine.alive():
                dead = EngineDown("found dead before the weight sync")
                self.dispatcher.engine_failed(i, dead, last_stops=False)
        restarted: list[int] = []
        while True:
            restarted += await self._join_restarts()
            down = frozenset(i for i, e in enumerate(scheduler.engines) if e.down) - set(restarted)
            if len(down) == len(self.engines):
                raise AllEnginesDown(f"all {len(self.engines)} rollout engines are down")
            stats = await self.weights.sync(skip=down)
            for i in stats.failed:  # died during the sync: restarted before the next one
                if i in restarted:
                    restarted.remove(i)
                    self._restart_soon(i)
                else:
                    dead = EngineDown("died during the weight sync")
                    self.dispatcher.engine_failed(i, dead, last_stops=False)
            if len(down | set(stats.failed)) < len(self.engines):
                break  # the run goes on with those that took the weights
        for i in restarted:
            self.dispatcher.engine_up(i, self.engines[i])
        return stats, restarted

    async def _join_restarts(self) -> list[int]:
        """Wait for the replacements under way (starting one for any down slot that has
        tries left and none under way) and swap them in; returns their slots."""
        for i, state in enumerate(self.dispatcher.scheduler.engines):
            if state.down:
                self._restart_soon(i)
        restarted = []
        for i, task in list(self._starting.items()):
            engine = await task
            del self._starting[i]
            if engine is None:
                continue
            self.engines[i] = engine
            self.weights.replace_engine(i, engine)
            restarted.append(i)
        return restarted

    @property
    def weights(self) -> WeightSync:
        """The weight sync; only services opened with a learner have one."""
        if self.weight_sync is None:
            raise RuntimeError("these services were opened without a learner")
        return self.weight_sync

    async def run(
        self, template: ChatTemplate, prompt: Sequence[int], agent: AgentSettings
    ) -> Trajectory:
        """One scheduled trajectory."""
        from rstar2.rollout.dispatch import run_scheduled

        return await run_scheduled(self.dispatcher, self.sandbox, template, prompt, agent)


class Runtime:
    """Owns a placement and every handle opened through it (see the module docstring)."""

    def __init__(self, placement: Placement) -> None:
        self.placement = placement
        self._stack = contextlib.AsyncExitStack()

    async def __aenter__(self) -> Runtime:
        await self._stack.__aenter__()
        try:
            self.placement.open()
            self._stack.callback(self.placement.close)
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def __aexit__(self, *exc: Any) -> bool | None:
        return await self._stack.__aexit__(*exc)

    def open_learner(self, settings: LearnerSettings) -> Learner:
        """The learner, closed with the runtime."""
        learner = self.placement.start_learner(settings)
        self._stack.callback(learner.close)
        return learner

    @contextlib.asynccontextmanager
    async def engines(
        self, spec: VLLMEngineConfig | OpenAIServerConfig, count: int = 1
    ) -> AsyncIterator[tuple[list[Engine], asyncio.TaskGroup]]:
        """``count`` started engines and the task group their background work runs in."""
        async with contextlib.AsyncExitStack() as stack:
            tasks = await stack.enter_async_context(_task_group())
            engines: list[Engine] = []
            for _ in range(count):
                engine = await self._start_engine(spec, tasks)
                stack.push_async_callback(engine.aclose)
                engines.append(engine)
            yield engines, tasks

    @contextlib.asynccontextmanager
    async def sandbox(
        self,
        section: SandboxConfig,
        refusal: tuple[str, str] = _REFUSAL,
    ) -> AsyncIterator[ClosableSandbox]:
        """The sandbox ``section`` names: a sandbox-pool server (``http``), a Redis queue its
        workers serve (``redis``), else an embedded pool where the placement puts it. A remote
        service that does not answer, or a pool that cannot isolate calls, is a ConfigError
        (the latter under ``refusal``'s key, with its hint)."""
        sandbox = await self._start_sandbox(section, refusal)
        try:
            yield sandbox
        finally:
            await sandbox.aclose()

    @contextlib.asynccontextmanager
    async def services(
        self, spec: ServicesSpec, learner: Learner | None = None
    ) -> AsyncIterator[Services]:
        """Engines, sandbox, scorer and dispatcher (and with ``learner``, the weight sync from
        it into the engines), closed in reverse order on exit."""
        from rstar2.reward.scorer import RewardScorer
        from rstar2.rollout.dispatch import Dispatcher
        from scheduler.core import SchedulerSettings

        async with contextlib.AsyncExitStack() as stack:
            engines, tasks = await stack.enter_async_context(
                self.engines(spec.engine, spec.num_engines)
            )
            sandbox = await stack.enter_async_context(
                self.sandbox(spec.sandbox, spec.sandbox_refusal)
            )
            r = spec.reward
            scorer = stack.enter_context(
                RewardScorer(
                    timeout_s=r.timeout_s, num_workers=r.num_workers, cache_size=r.cache_size
                )
            )
            settings = SchedulerSettings(
                policy=spec.scheduler.policy,
                block_size_tokens=engines[0].block_size,
                split_turns=spec.scheduler.split_turns,
            )
            dispatcher = await stack.enter_async_context(
                Dispatcher(
                    engines,
                    settings,
                    tasks=tasks,
                    stall_timeout_s=spec.scheduler.engine_stall_timeout_s,
                )
            )
            weights = None
            if learner is not None:
                bucket = spec.weight_sync_bucket_bytes
                weights = self.placement.weight_sync(learner, engines, bucket)
                stack.push_async_callback(weights.aclose)

            async def restart() -> Engine:
                engine = await self._start_engine(spec.engine, tasks)
                stack.push_async_callback(engine.aclose)
                return engine

            services = Services(engines, dispatcher, sandbox, scorer, weights, restart)
            stack.push_async_callback(services.aclose)
            yield services

    async def _start_engine(
        self, spec: VLLMEngineConfig | OpenAIServerConfig, tasks: asyncio.TaskGroup
    ) -> Engine:
        from rstar2.rollout.openai_engine import (
            OpenAIServerConfig,
            OpenAIServerEngine,
            ServerUnreachable,
        )

        if isinstance(spec, OpenAIServerConfig):
            try:
                return await OpenAIServerEngine.create(spec.url, spec.model, tasks=tasks)
            except ServerUnreachable as exc:  # a wrong URL is the user's, not a crash
                raise ConfigError("--server", str(exc)) from None
        return await self.placement.start_engine(spec, tasks)

    async def _start_sandbox(
        self, section: SandboxConfig, refusal: tuple[str, str]
    ) -> ClosableSandbox:
        if isinstance(section, HttpSandboxConfig):
            from sandbox_pool.client import ClientConfig, SandboxClient

            client = SandboxClient(section.url, ClientConfig(max_wait_s=section.max_wait_s))
            await _reachable(client, client.health(), "sandbox.url", section.url)
            return client
        if isinstance(section, RedisSandboxConfig):
            from sandbox_pool.redis_queue import RedisConfig, RedisDispatcher

            queue_config = RedisConfig(url=section.redis_url, max_wait_s=section.max_wait_s)
            queue = RedisDispatcher(queue_config)
            await _reachable(queue, queue.start(), "sandbox.redis_url", section.redis_url)
            return queue
        from sandbox_pool.pool import PoolConfig
        from sandbox_pool.protocol import Limits
        from sandbox_pool.zygote_client import IsolationUnavailable

        config = PoolConfig(
            allow_weak_isolation=section.unsafe_weak_isolation,
            num_workers=section.num_workers,
            limits=Limits(
                timeout_s=section.max_execution_time_s,
                memory_mb=section.max_memory_mb,
                max_output_chars=section.max_output_chars,
            ),
        )
        try:
            return await self.placement.start_sandbox(config)
        except IsolationUnavailable as exc:
            key, hint = refusal
            raise ConfigError(key, f"{exc}; {hint}") from None


async def _reachable(
    sandbox: ClosableSandbox, probe: Awaitable[object], key: str, address: str
) -> None:
    """Await ``probe``; a service that does not answer is a ConfigError under ``key`` (a run
    must not start with every tool call failing), and ``sandbox`` is closed."""
    try:
        await asyncio.wait_for(probe, _PROBE_TIMEOUT_S)
    except Exception as exc:  # any failure to answer means the same to a user
        await sandbox.aclose()
        reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        raise ConfigError(key, f"no sandbox service answers at {address} ({reason})") from None


@contextlib.asynccontextmanager
async def _task_group() -> AsyncIterator[asyncio.TaskGroup]:
    """A task group whose one failure is raised as itself, not wrapped in a group."""
    try:
        async with asyncio.TaskGroup() as tasks:
            yield tasks
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise
