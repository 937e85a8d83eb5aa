"""The rollout dispatcher: drives real engines through the :mod:`scheduler` state machine.

Every generation turn of every trajectory goes through it::

    async with Dispatcher(engines, SchedulerSettings(policy="kv_affinity")) as dispatcher:
        traj = await run_scheduled(dispatcher, sandbox, template, ids, agent_settings)

``trajectory()`` yields an :class:`~rstar2.rollout.engine.Engine` bound to one trajectory: its
``generate`` waits for the scheduler's placement, runs the request on the chosen engine, and
reports back. When the scheduler caps a dispatch below the turn's token budget (``kv_affinity``
segments), a turn that reaches the cap continues in a further dispatch and the pieces come
back as one :class:`~rstar2.rollout.engine.Generation`, so the agent loop never sees segments.
Live KV stats are polled from every engine and fed to the scheduler; each poll also feeds
``metrics`` (:class:`~rstar2.rollout.sched_metrics.SchedMetrics`: KV use, waiting turns,
migrations, preemptions, prefix-cache hits), read per window by :meth:`Dispatcher.take_metrics`
and live by the Prometheus endpoint.

Engine failure: a request that raises :class:`~rstar2.rollout.engine.EngineDown` marks its
engine down in the scheduler and runs again, on another engine, from the trajectory's committed
tokens (the prompt and every finished segment; the failed request's tokens are dropped) with
the same per-request seed, so a trajectory is token-exact and nothing is duplicated. With no
engine left, :class:`AllEnginesDown` is raised. ``failures`` records each engine failure.

A hung engine (alive, but making no progress: a stopped process, a wedged driver) is one too:
with ``stall_timeout_s`` set, an engine with requests in flight whose progress marker (its
engine steps, :attr:`KVStats.steps`, plus the requests it finished) has not moved for that long
is marked down and its requests are abandoned (cancelled; EngineDown to their callers), so
they move like a dead engine's. Engines that count no steps (``steps`` None: a served engine,
where one long request is indistinguishable from a hung one) are not watched.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from rstar2.agent.loop import AgentSettings, Observer, Sandbox, Trajectory, run_trajectory
from rstar2.agent.template import ChatTemplate
from rstar2.errors import UserError
from rstar2.rollout.engine import Engine, EngineDown, Generation, KVStats, SamplingSettings
from rstar2.rollout.sched_metrics import SchedMetrics, SchedSample, sample
from scheduler.core import Assignment, Scheduler, SchedulerSettings

_SEGMENT_SEED_STRIDE = 1_000_003  # continuation segments must not replay the first's randomness
_ABANDON_WAIT_S = 5.0  # how long a hung engine's cancelled request may take to unwind
log = logging.getLogger(__name__)


class DispatcherClosed(RuntimeError):
    """The dispatcher was closed."""


class AllEnginesDown(UserError, RuntimeError):
    """Every engine failed; no request can run."""

    kind: ClassVar[str] = "rollout stopped"
    exit_code: ClassVar[int] = 1


@dataclass(frozen=True)
class EngineFailure:
    engine_id: int
    at_s: float  # time.monotonic() when the dispatcher saw it
    reason: str


class Dispatcher:
    """Owns one :class:`scheduler.core.Scheduler` over ``engines`` (see the module docstring)."""

    def __init__(
        self,
        engines: Sequence[Engine],
        settings: SchedulerSettings,
        *,
        stats_interval_s: float = 0.05,
        tasks: asyncio.TaskGroup | None = None,
        stall_timeout_s: float | None = None,
    ) -> None:
        """``tasks``: the task group that owns the stats poller (the runtime's, so a poller
        that fails fails the run); None: a task of the running loop, awaited by close().
        ``stall_timeout_s``: an engine without progress that long is down (None: never)."""
        if not engines:
            raise ValueError("at least one engine is needed")
        if stall_timeout_s is not None and stall_timeout_s <= 0:
            raise ValueError(f"stall_timeout_s must be positive, not {stall_timeout_s}")
        self.engines = list(engines)
        capacities = [max(e.kv_stats().capacity_tokens, 1) for e in self.engines]
        self.scheduler = Scheduler(capacities, settings)
        self.stats_interval_s = stats_interval_s
        self._waiters: dict[str, asyncio.Future[Assignment]] = {}
        self._placed: dict[str, Assignment] = {}  # placed before its generate() asked
        self._ids = itertools.count()
        self._poller: asyncio.Task[None] | None = None
        self._tasks = tasks
        self._closed = False
        self.failures: list[EngineFailure] = []
        self.stall_timeout_s = stall_timeout_s
        now = time.monotonic()
        self._finished = [0] * len(self.engines)  # requests each engine answered
        self._marks = [(-1, now)] * len(self.engines)  # (progress marker, since when)
        self._stalled = [asyncio.Event() for _ in self.engines]
        self.on_engine_down: Callable[[int], None] | None = None  # e.g. a background restart
        self.metrics = SchedMetrics(len(self.engines))

    async def __aenter__(self) -> Dispatcher:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def start(self) -> None:
        """Start polling engine stats (idempotent; needs a running loop)."""
        if self._closed:
            raise DispatcherClosed("the dispatcher is closed")
        if self._poller is None:
            spawn = (
                self._tasks.create_task if self._tasks else asyncio.get_running_loop().create_task
            )
            self._poller = spawn(self._poll_stats())

    async def aclose(self) -> None:
        self._closed = True
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
            self._poller = None
        for fut in self._waiters.values():
            if not fut.done():
                fut.set_exception(DispatcherClosed("the dispatcher closed"))

    @contextlib.asynccontextmanager
    async def trajectory(
        self,
        *,
        prompt_tokens: int,
        max_response_tokens: int,
        session_id: str | None = None,
    ) -> AsyncIterator[ScheduledEngine]:
        """Register one trajectory for its lifetime; yields the engine its turns run on."""
        if self._closed:
            raise DispatcherClosed("the dispatcher is closed")
        self.start()
        traj_id = f"traj-{next(self._ids)}"
        bound = ScheduledEngine(self, traj_id)
        self.scheduler.submit(
            traj_id,
            prompt_tokens=prompt_tokens,
            max_response_tokens=max_response_tokens,
            session_id=session_id,
        )
        try:
            yield bound
        finally:
            self._waiters.pop(traj_id, None)
            if self._placed.pop(traj_id, None) is not None or bound.running:
                # placed but never run (the caller stopped early): give the placement back
                self.scheduler.generation_finished(traj_id, 0, turn_complete=True)
            self.scheduler.finish(traj_id)
            self._pump()

    # ---- internals used by ScheduledEngine ----

    async def _placement(self, traj_id: str) -> Assignment:
        if self.scheduler.engines_up == 0:
            raise AllEnginesDown(f"all {len(self.engines)} rollout engines are down")
        self._pump()
        placed = self._placed.pop(traj_id, None)
        if placed is not None:
            return placed
        fut: asyncio.Future[Assignment] = asyncio.get_running_loop().create_future()
        self._waiters[traj_id] = fut
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self._placed[traj_id] = fut.result()  # placed as we were cancelled: give it back
            raise

    def _pump(self) -> None:
        for a in self.scheduler.schedule():
            fut = self._waiters.pop(a.traj_id, None)
            if fut is not None and not fut.done():
                fut.set_result(a)
            else:
                self._placed[a.traj_id] = a

    def engine_failed(self, engine_id: int, exc: BaseException, *, last_stops: bool = True) -> None:
        """Take a failed engine out of scheduling (once); raise AllEnginesDown when it was the
        last one (unless ``last_stops`` is False: the caller restarts engines first)."""
        if not self.scheduler.engines[engine_id].down:
            self.scheduler.engine_down(engine_id)
            self.failures.append(EngineFailure(engine_id, time.monotonic(), str(exc)))
            log.warning("rollout engine %d is down (%s); its requests move", engine_id, exc)
            if self.on_engine_down is not None:
                self.on_engine_down(engine_id)
        if self.scheduler.engines_up == 0 and last_stops:
            error = AllEnginesDown(
                f"all {len(self.engines)} rollout engines are down; the last: {exc}"
            )
            for fut in self._waiters.values():  # nothing will place them
                if not fut.done():
                    fut.set_exception(error)
            raise error from exc

    def engine_up(self, engine_id: int, engine: Engine) -> None:
        """``engine`` (started, with the current weights) serves slot ``engine_id`` again."""
        self.engines[engine_id] = engine
        self._stalled[engine_id] = asyncio.Event()
        self._marks[engine_id] = (-1, time.monotonic())
        capacity = engine.kv_stats().capacity_tokens
        self.scheduler.engine_up(engine_id, capacity or None)
        self._pump()

    async def _generate_on(
        self, engine_id: int, ids: Sequence[int], sampling: SamplingSettings
    ) -> Generation:
        """One request on one engine; EngineDown also when the engine is found hung meanwhile
        (the request is cancelled and given up on after at most _ABANDON_WAIT_S)."""
        stalled = self._stalled[engine_id]
        call = asyncio.ensure_future(self.engines[engine_id].generate(ids, sampling))
        watch = asyncio.ensure_future(stalled.wait())
        try:
            await asyncio.wait({call, watch}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            call.cancel()  # and let it unwind (its abort reaches the engine) before going on
            with contextlib.suppress(BaseException):
                await asyncio.wait({call}, timeout=_ABANDON_WAIT_S)
            raise
        finally:
            watch.cancel()
        if not call.done():
            call.cancel()
            await asyncio.wait({call}, timeout=_ABANDON_WAIT_S)
            raise EngineDown(f"engine {engine_id} made no progress for {self.stall_timeout_s} s")
        self._finished[engine_id] += 1
        return call.result()

    def _watch_progress(self, engine_id: int, stats: KVStats) -> None:
        """Mark an engine down that has requests in flight and no progress in stall_timeout_s."""
        state = self.scheduler.engines[engine_id]
        if self.stall_timeout_s is None or state.down or stats.steps is None:
            return
        now = time.monotonic()
        mark = stats.steps + self._finished[engine_id]
        if mark != self._marks[engine_id][0] or state.in_flight == 0:
            self._marks[engine_id] = (mark, now)
            return
        idle_s = now - self._marks[engine_id][1]
        if idle_s > self.stall_timeout_s:
            self._stalled[engine_id].set()
            reason = f"no progress for {idle_s:.1f} s with {state.in_flight} request(s) in flight"
            self.engine_failed(engine_id, EngineDown(reason), last_stops=False)

    def _refresh(self, engine_id: int) -> KVStats | None:
        """Feed the engine's live stats to the scheduler; returns them (None: it is down)."""
        if self.scheduler.engines[engine_id].down:
            return None
        stats = self.engines[engine_id].kv_stats()
        self._watch_progress(engine_id, stats)
        self.scheduler.update_engine(
            engine_id,
            used_tokens=stats.used_tokens,
            running=stats.num_running,
            waiting=stats.num_waiting,
            preemptions=stats.num_preemptions,
            capacity_tokens=stats.capacity_tokens or None,
        )
        return stats

    async def _poll_stats(self) -> None:
        while True:
            stats = [self._refresh(i) for i in range(len(self.engines))]
            self._pump()
            self.metrics.observe(self._sample(stats))
            await asyncio.sleep(self.stats_interval_s)

    def _sample(self, stats: Sequence[KVStats | None]) -> SchedSample:
        # turns that asked for an engine and wait for it
        return sample(self.scheduler, stats, waiting_turns=len(self._waiters))

    def take_metrics(self) -> dict[str, float]:
        """The ``sched/*`` metrics since the last call (the first: since the dispatcher
        started), closed by a sample taken now; the next window starts here."""
        stats = [
            None if s.down else e.kv_stats()
            for e, s in zip(self.engines, self.scheduler.engines, strict=True)
        ]
        return self.metrics.take(self._sample(stats))

    def engine_stats(self) -> list[KVStats]:
        return [e.kv_stats() for e in self.engines]


async def run_scheduled(
    dispatcher: Dispatcher,
    sandbox: Sandbox,
    template: ChatTemplate,
    prompt_ids: Sequence[int],
    settings: AgentSettings,
    observer: Observer | None = None,
) -> Trajectory:
    """One trajectory of the agent loop, every turn placed by ``dispatcher``."""
    async with dispatcher.trajectory(
        prompt_tokens=len(prompt_ids), max_response_tokens=settings.max_response_tokens
    ) as engine:
        return await run_trajectory(engine, sandbox, template, prompt_ids, settings, observer)


class ScheduledEngine:
    """The :class:`~rstar2.rollout.engine.Engine` of one trajectory under a dispatcher."""

    def __init__(self, dispatcher: Dispatcher, traj_id: str) -> None:
        self._d = dispatcher
        self.traj_id = traj_id
        self._turns = 0
        self.dispatches: list[Assignment] = []
        self.running = False  # placed and not reported back yet
        self.redispatched = 0  # dispatches lost with a failed engine and run again

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingSettings) -> Generation:
        sched = self._d.scheduler
        if self._turns > 0:
            sched.turn_ready(self.traj_id, len(prompt_ids))
        self._turns += 1
        ids = list(prompt_ids)
        out = Generation(token_ids=[], logprobs=[], finish_reason="stop")
        segment = 0
        while True:
            a = await self._d._placement(self.traj_id)
            self.running = True
            self.dispatches.append(a)
            left = sampling.max_tokens - len(out.token_ids)
            cap = min(left, a.max_tokens)
            seed = None if sampling.seed is None else sampling.seed + _SEGMENT_SEED_STRIDE * segment
            piece_sampling = replace(sampling, max_tokens=cap, seed=seed)
            try:
                piece = await self._d._generate_on(a.engine_id, ids, piece_sampling)
            except EngineDown as exc:
                self.running = False
                self.redispatched += 1
                try:
                    self._d.engine_failed(a.engine_id, exc)
                finally:
                    sched.dispatch_failed(self.traj_id)
                    self._d._pump()
                continue  # the same segment again, elsewhere, from the committed tokens
            except BaseException:
                self.running = False
                sched.generation_finished(self.traj_id, 0, turn_complete=True)
                self._d._pump()
                raise
            self.running = False
            out.token_ids.extend(piece.token_ids)
            out.logprobs.extend(piece.logprobs)
            out.finish_reason = piece.finish_reason
            ids.extend(piece.token_ids)
            more = piece.finish_reason == "length" and len(piece.token_ids) >= cap and cap < left
            sched.generation_finished(self.traj_id, len(piece.token_ids), turn_complete=not more)
            self._d._refresh(a.engine_id)
            if not more:
                break
            segment += 1
        self._d._pump()
        return out

    def alive(self) -> bool:
        return self._d.scheduler.engines_up > 0

    def kv_stats(self) -> KVStats:
        stats = self._d.engine_stats()
        return KVStats(
            capacity_tokens=sum(s.capacity_tokens for s in stats),
            used_tokens=sum(s.used_tokens for s in stats),
            num_running=sum(s.num_running for s in stats),
            num_waiting=sum(s.num_waiting for s in stats),
            num_preemptions=sum(s.num_preemptions for s in stats),
        )

    async def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        raise NotImplementedError("update weights on the engines, not through one trajectory")
