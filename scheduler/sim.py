"""Discrete-event model of multi-turn rollouts on continuous-batching engines (pure, no I/O).

Drives a real :class:`scheduler.core.Scheduler` with a trace over engines that behave as vLLM
v1's scheduler does (:mod:`scheduler.sim_engine`), at the step cost and settings of
:mod:`scheduler.sim_model`. A turn that returns to the engine holding its history prefills only
what that engine's prefix cache lost; a turn that moves re-prefills its history.

``recomputed_tokens`` counts tokens whose KV had been computed before and was computed again
(after a preemption or a move); ``generated_tokens`` the sampled tokens.
:func:`scheduler.bound.makespan_lower_bound` is what no policy can beat under this model.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, replace

from scheduler.core import Assignment, Scheduler, SchedulerSettings
from scheduler.sim_engine import EngineRequest, RunRecord, SimEngine
from scheduler.sim_model import PlannedTurn, SimSettings, plan_turns
from scheduler.trace import TraceRow


@dataclass
class SimResult:
    policy: str
    makespan_s: float
    busy_fraction: float
    preemptions: int
    recomputed_tokens: int
    generated_tokens: int
    p50_latency_s: float
    p99_latency_s: float
    dispatches: int
    moves: int
    recomputed_after_preemption: int
    recomputed_after_move: int
    recomputed_after_eviction: int
    engine_max_used_fraction: float
    steps: int  # engine steps, all engines
    # the tail: from when an engine first admitted the last trajectory to start (from then no
    # trajectory waits to start, in the scheduler or in an engine's queue)
    queue_empty_s: float
    live_at_queue_empty: int  # trajectories not finished then
    steps_after_queue_empty: int
    # per engine, its runs of steps (only with SimSettings.record_runs)
    engine_runs: tuple[tuple[RunRecord, ...], ...] = ()

    def as_dict(self) -> dict[str, float | int | str]:
        return {
            k: (round(v, 4) if isinstance(v, float) else v)
            for k, v in vars(self).items()
            if k != "engine_runs"
        }


@dataclass
class _TrajRun:
    row: TraceRow
    plan: tuple[PlannedTurn, ...]
    turn: int = 0
    turn_left: int = 0
    context: int = 0
    computed_hwm: int = 0  # tokens whose KV was computed at least once
    generated: int = 0
    last_engine: int | None = None
    preempted: bool = False


class Simulation:
    """Replay ``rows`` under ``policy``; :meth:`run` returns the figures. Every row is submitted
    at construction, so a trace the scheduler refuses (SchedulerError) fails before any step."""

    def __init__(self, rows: list[TraceRow], settings: SimSettings, sched: SchedulerSettings):
        self.s = settings
        self.rows = rows
        if sched.max_running_per_engine is None:  # the scheduler knows the engines' limit
            sched = replace(sched, max_running_per_engine=settings.max_num_seqs)
        self.scheduler = Scheduler([settings.kv_tokens] * settings.num_engines, sched)
        self.engines = [SimEngine(i, settings, self) for i in range(settings.num_engines)]
        self.events: list[tuple[float, int, tuple[object, ...]]] = []
        self._seq = itertools.count()
        self.trajs: dict[str, _TrajRun] = {}
        self.latencies: list[float] = []
        self.recomputed = 0
        self.recomputed_by = {"preemption": 0, "move": 0, "evicted": 0}
        self.generated = 0
        self.now = 0.0
        self._new = {row.id for row in rows}  # never admitted by an engine yet
        self._queue_empty: tuple[float, int, int] = (0.0, 0, 0)  # time, live, steps
        for row in rows:
            plan = plan_turns(row, settings)
            self.trajs[row.id] = _TrajRun(row, plan, 0, plan[0].gen_tokens, row.prompt_tokens)
            self.scheduler.submit(
                row.id,
                prompt_tokens=row.prompt_tokens,
                max_response_tokens=settings.max_response_tokens,
                session_id=row.session,
            )

    def push(self, t: float, event: tuple[object, ...]) -> None:
        heapq.heappush(self.events, (t, next(self._seq), event))

    def run(self) -> SimResult:
        self._pump()
        while self.events:
            t, _, event = heapq.heappop(self.events)
            self.now = t
            if event[0] == "engine":
                self.engines[int(event[1])].on_run_end(t, int(event[2]))  # type: ignore[call-overload]
            else:
                self._tool_done(str(event[1]))
            self._pump()
        if self.trajs:
            raise RuntimeError(f"{len(self.trajs)} trajectories never finished")
        return self._result()

    def _pump(self) -> None:
        for a in self.scheduler.schedule():
            self._start(a)

    def _start(self, a: Assignment) -> None:
        run = self.trajs[a.traj_id]
        n = min(run.turn_left, a.max_tokens)
        self.engines[a.engine_id].arrive(EngineRequest(a.traj_id, run.context, n), self.now)

    def count_prefill(self, traj_id: str, engine_id: int, context: int, hit: int) -> None:
        run = self.trajs[traj_id]
        again = max(0, min(run.computed_hwm, context) - hit)
        self.recomputed += again
        if run.preempted:
            self.recomputed_by["preemption"] += again
        elif run.last_engine is not None and run.last_engine != engine_id:
            self.recomputed_by["move"] += again
        else:
            self.recomputed_by["evicted"] += again
        run.preempted = False
        run.last_engine = engine_id
        run.computed_hwm = max(run.computed_hwm, context)

    def started(self, traj_id: str) -> None:
        """An engine admitted a request of ``traj_id``; the first admission of the last
        trajectory to start marks the tail."""
        if traj_id in self._new:
            self._new.discard(traj_id)
            if not self._new:
                steps = sum(e.steps_by(self.now) for e in self.engines)
                self._queue_empty = (self.now, len(self.trajs), steps)

    def preempted(self, traj_id: str, computed: int) -> None:
        run = self.trajs[traj_id]
        run.preempted = True
        run.computed_hwm = max(run.computed_hwm, computed)

    def dispatch_done(self, engine_id: int, traj_id: str, generated: int, now: float) -> None:
        run = self.trajs[traj_id]
        run.context += generated
        run.computed_hwm = max(run.computed_hwm, run.context)
        run.turn_left -= generated
        run.generated += generated
        self.generated += generated
        complete = run.turn_left <= 0  # the plan caps turns by the budget the scheduler caps by
        self.scheduler.generation_finished(traj_id, generated, turn_complete=complete)
        if not complete:
            return
        latency = run.plan[run.turn].tool_latency_s
        if latency is None:
            self.scheduler.finish(traj_id)
            self.latencies.append(now)
            del self.trajs[traj_id]
            return
        self.push(now + latency, ("tool", traj_id))

    def _tool_done(self, traj_id: str) -> None:
        run = self.trajs[traj_id]
        run.context += run.plan[run.turn].tool_tokens
        run.turn += 1
        run.turn_left = run.plan[run.turn].gen_tokens
        self.scheduler.turn_ready(traj_id, run.context)

    def report(self, engine: SimEngine) -> None:
        self.scheduler.update_engine(
            engine.id,
            used_tokens=engine.kv_used,
            running=len(engine.running),
            waiting=len(engine.waiting),
            preemptions=engine.preemptions,
        )

    def _result(self) -> SimResult:
        lat = sorted(self.latencies)
        makespan = lat[-1] if lat else 0.0
        busy = sum(e.busy_s for e in self.engines) / max(makespan * len(self.engines), 1e-12)
        steps = sum(e.step for e in self.engines)
        return SimResult(
            policy=self.scheduler.settings.policy,
            makespan_s=makespan,
            busy_fraction=busy,
            preemptions=sum(e.preemptions for e in self.engines),
            recomputed_tokens=self.recomputed,
            generated_tokens=self.generated,
            p50_latency_s=lat[len(lat) // 2] if lat else 0.0,
            p99_latency_s=lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else 0.0,
            dispatches=self.scheduler.stats.dispatches,
            moves=self.scheduler.stats.moves,
            recomputed_after_preemption=self.recomputed_by["preemption"],
            recomputed_after_move=self.recomputed_by["move"],
            recomputed_after_eviction=self.recomputed_by["evicted"],
            engine_max_used_fraction=max(e.max_used for e in self.engines) / self.s.kv_tokens,
            steps=steps,
            queue_empty_s=self._queue_empty[0],
            live_at_queue_empty=self._queue_empty[1],
            steps_after_queue_empty=steps - self._queue_empty[2],
            engine_runs=tuple(tuple(e.runs) for e in self.engines),
        )


def simulate(rows: list[TraceRow], settings: SimSettings, sched: SchedulerSettings) -> SimResult:
    return Simulation(rows, settings, sched).run()
