"""Discrete-event model of multi-turn rollouts on continuous-batching engines (pure, no I/O).

Drives a real :class:`scheduler.core.Scheduler` with a trace. Each engine follows vLLM v1's
scheduler: requests run in one continuous batch of at most ``max_num_seqs``; a waiting request is
admitted (first come, first served) once its whole context fits in free KV; every step each
running request computes one token (its prefill, in the first step, costs per token) and needs
one more token of KV; when that KV is not there the most recently admitted request is preempted:
its KV is freed into the prefix cache, it rejoins the front of the queue, and whatever of its
context the cache lost by then is recomputed. Each engine has a prefix cache of the KV not in
use, evicted least recently freed first and, within one prefix, tail first (as vLLM v1 frees
blocks): a turn that returns to the engine holding its history prefills only what is not cached
any more, a turn that moves re-prefills its history.

Step time (``StepCostModel``) is additive: a fixed cost (weights read once per step), a cost per
token computed (prefill; decode tokens too unless ``per_decode_token_s`` prices them apart), and
a cost per token of KV read by the batch. The defaults describe a 14B dense model (Qwen2.5-14B:
48 layers, 8 KV heads x 128 dims, bf16, so 192 KiB of KV per token) on one MI300X (~5.3 TB/s,
~600 dense TFLOP/s), assumed from its datasheet; ``python -m perf.step_cost`` measures the
constants on a GPU (perf/results/step-cost-h200.json). The default KV capacity, 640 Ki tokens
per engine (~128 GB), is what is left of 0.9 x 192 GB after 29.5 GB of weights and ~15 GB of
activations.

Engines advance in runs of steps between events; a request arriving mid-run joins after the
step in progress, so the model costs O(events log n), not O(steps x batch).

``recomputed_tokens`` counts tokens whose KV had been computed before and was computed again
(after a preemption or a move); ``generated_tokens`` the sampled tokens.

:func:`makespan_lower_bound` is what no policy can beat under this model: the engines' work
(each prompt and tool result prefilled once, each token decoded once, its context read once,
and the fewest steps that engines of this KV capacity can take) spread evenly, or the longest
trajectory run alone, whichever is longer.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field, replace

from scheduler.core import Assignment, Scheduler, SchedulerSettings
from scheduler.trace import TraceRow


@dataclass(frozen=True, kw_only=True)
class StepCostModel:
    step_base_s: float = 0.005  # every step: the weights read once
    per_token_s: float = 4.7e-5  # each prefill token (a prompt, a tool result, a recompute)
    per_kv_token_s: float = 3.7e-8  # each KV token the step's decode attention reads
    # each decode token (one per running request per step); None: per_token_s. Measured
    # decode is cheaper than prefill per token: its GEMMs are bound by the weight read
    per_decode_token_s: float | None = None

    @property
    def decode_token_s(self) -> float:
        return self.per_token_s if self.per_decode_token_s is None else self.per_decode_token_s


@dataclass(frozen=True, kw_only=True)
class SimSettings:
    num_engines: int = 8
    kv_tokens: int = 655_360  # per engine: ~128 GB of the MI300X left for KV, at 192 KiB a token
    max_num_seqs: int = 256
    max_response_tokens: int = 12_288  # the trajectories' budget (tool responses included)
    default_tool_tokens: int = 128
    # KV block size: >1 models vLLM's paged KV (each request's last block partly used, prefix
    # hits in whole blocks and never the last prompt token); 1 is the token-exact ideal
    block_size_tokens: int = 1
    cost: StepCostModel = field(default_factory=StepCostModel)


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

    def as_dict(self) -> dict[str, float | int | str]:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in vars(self).items()}


@dataclass
class _Req:
    traj_id: str
    context: int  # tokens that must be resident when it runs
    to_generate: int
    start_step: int = 0
    order: int = 0  # admission order (preemption takes the newest)
    generated_before: int = 0  # by this dispatch before a preemption


class _Engine:
    def __init__(self, engine_id: int, s: SimSettings, sim: Simulation) -> None:
        self.id = engine_id
        self.s = s
        self.sim = sim
        self.step = 0
        self.running: OrderedDict[int, _Req] = OrderedDict()
        self.finish_heap: list[tuple[int, int]] = []  # (finish step, order)
        self.kv_used = 0
        self.cache: OrderedDict[str, int] = OrderedDict()  # traj -> cached prefix tokens
        self.cached_total = 0
        self.waiting: deque[_Req] = deque()
        self.preemptions = 0
        self.busy_s = 0.0
        self.max_used = 0
        # the run of steps in progress
        self.run_start_t = 0.0
        self.run_steps = 0
        self.run_prefill_s = 0.0
        self.run_version = 0
        self.busy = False
        self._orders = itertools.count()

    def steps_by(self, now: float) -> int:
        """Steps this engine has completed by ``now``, its run in progress included (one short
        at most when that run ends at ``now`` and its event is still queued)."""
        if not self.busy:
            return self.step
        return self.step + min(self.run_steps, self._steps_done_by(now - self.run_start_t))

    # -- requests arrive here --
    def arrive(self, req: _Req, now: float) -> None:
        self.waiting.append(req)
        if not self.busy:
            self._plan(now)
        else:
            self._cut_run(now)

    def _cut_run(self, now: float) -> None:
        """End the current run after the step in progress, so the arrival joins next step."""
        done = self._steps_done_by(now - self.run_start_t)
        keep = min(self.run_steps, done + 1)
        if keep < self.run_steps:
            self.run_steps = keep
            self.run_version += 1
            self.sim.push(
                self.run_start_t + self._run_time(keep), ("engine", self.id, self.run_version)
            )

    # -- time model --
    def _run_time(self, k: int) -> float:
        c = self.s.cost
        n = len(self.running)
        per_step = c.step_base_s + c.decode_token_s * n + c.per_kv_token_s * self.kv_used
        return self.run_prefill_s + k * per_step + c.per_kv_token_s * n * k * (k - 1) / 2

    def _steps_done_by(self, elapsed: float) -> int:
        c = self.s.cost
        n = len(self.running)
        a = c.per_kv_token_s * n / 2
        b = c.step_base_s + c.decode_token_s * n + c.per_kv_token_s * self.kv_used - a
        rest = elapsed - self.run_prefill_s
        if rest <= 0:
            return 0
        if a == 0:
            return int(rest / b)
        return int((-b + math.sqrt(b * b + 4 * a * rest)) / (2 * a))

    # -- the engine's own scheduling --
    def _plan(self, now: float) -> None:
        prefill_tokens = self._admit()
        n = len(self.running)
        if n == 0:
            self.busy = False
            return
        room = self._room()
        if room < 1:
            self._preempt_until_fits()
            n = len(self.running)
            if n == 0:
                self.busy = False
                return
            room = self._room()
        k_finish = self.finish_heap[0][0] - self.step
        k = max(1, min(k_finish, room))
        self.busy = True
        self.run_start_t = now
        self.run_steps = k
        self.run_prefill_s = self.s.cost.per_token_s * prefill_tokens
        self.run_version += 1
        self.sim.push(now + self._run_time(k), ("engine", self.id, self.run_version))

    def on_run_end(self, now: float, version: int) -> None:
        if version != self.run_version or not self.busy:
            return
        k = self.run_steps
        self.busy_s += now - self.run_start_t
        self.step += k
        self.run_steps = 0  # counted: steps_by must not add them again until the next run
        self.kv_used += len(self.running) * k
        self.max_used = max(self.max_used, self.kv_used)
        self._evict(0)
        while self.finish_heap and self.finish_heap[0][0] <= self.step:
            _, order = heapq.heappop(self.finish_heap)
            req = self.running.pop(order)
            self._release(req, req.to_generate)
            total = req.generated_before + req.to_generate
            self.sim.dispatch_done(self.id, req.traj_id, total, now)
        self._plan(now)
        self.sim.report(self)

    def _blocks_after(self, k: int) -> int:
        """KV tokens the running requests take after ``k`` more steps: their tokens, or with
        paged KV (``block_size_tokens`` > 1) their whole blocks."""
        bs = self.s.block_size_tokens
        if bs == 1:
            return self.kv_used + len(self.running) * k
        return sum(
            -(-(r.context + self.step - r.start_step + k) // bs) * bs for r in self.running.values()
        )

    def _room(self) -> int:
        """Steps the running batch can take before it needs KV that is not there (tokens per
        request for token-exact KV; found by bisection over whole blocks for paged KV)."""
        n = len(self.running)
        if self.s.block_size_tokens == 1:
            return (self.s.kv_tokens - self.kv_used) // max(n, 1)
        if self._blocks_after(1) > self.s.kv_tokens:
            return 0
        lo, hi = 1, self.s.kv_tokens
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._blocks_after(mid) <= self.s.kv_tokens:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _hit(self, traj_id: str, context: int) -> int:
        cached = min(self.cache.get(traj_id, 0), context)
        bs = self.s.block_size_tokens
        if bs == 1:
            return cached
        return min(cached, context - 1) // bs * bs  # whole blocks, never the last token

    def _admit(self) -> int:
        prefill = 0
        bs = self.s.block_size_tokens
        while self.waiting and len(self.running) < self.s.max_num_seqs:
            req = self.waiting[0]
            hit = self._hit(req.traj_id, req.context)
            if self._blocks_after(0) + -(-req.context // bs) * bs > self.s.kv_tokens:
                break  # the head waits (first come, first served)
            self.waiting.popleft()
            if req.traj_id in self.cache:
                self.cached_total -= self.cache.pop(req.traj_id)
            self.kv_used += req.context
            self._evict(0)
            prefill += req.context - hit
            self.sim.count_prefill(req.traj_id, self.id, req.context, hit)
            self.sim.started(req.traj_id)
            req.start_step = self.step
            req.order = next(self._orders)
            self.running[req.order] = req
            heapq.heappush(self.finish_heap, (self.step + req.to_generate, req.order))
        return prefill

    def _preempt_until_fits(self) -> None:
        while self.running and self._room() < 1:
            order, req = self.running.popitem(last=True)
            self.finish_heap.remove((req.start_step + req.to_generate, order))
            heapq.heapify(self.finish_heap)
            generated = self.step - req.start_step
            self._release(req, generated)
            self.preemptions += 1
            self.sim.preempted(req.traj_id, req.context + generated)
            self.waiting.appendleft(
                _Req(
                    req.traj_id,
                    req.context + generated,
                    req.to_generate - generated,
                    generated_before=req.generated_before + generated,
                )
            )

    def _release(self, req: _Req, generated: int) -> None:
        tokens = req.context + generated
        self.kv_used -= tokens
        self.cache[req.traj_id] = tokens
        self.cached_total += tokens
        self._evict(0)

    def _evict(self, extra: int) -> None:
        """Evict the least recently freed prefix first, its tail first (vLLM v1 frees a
        request's blocks in reverse order), so a prefix's head stays cached longest."""
        limit = self.s.kv_tokens - self._blocks_after(0) - extra
        while self.cached_total > limit and self.cache:
            traj_id, tokens = next(iter(self.cache.items()))
            excess = self.cached_total - limit
            if tokens > excess:
                self.cache[traj_id] = tokens - excess
                self.cached_total -= excess
                return
            del self.cache[traj_id]
            self.cached_total -= tokens


@dataclass(frozen=True)
class PlannedTurn:
    context: int  # tokens before the turn generates
    gen_tokens: int
    tool_latency_s: float | None  # the tool call after it; None: the trajectory ends
    tool_tokens: int  # the tool response's tokens (0 when it ends)


def plan_turns(row: TraceRow, s: SimSettings) -> tuple[PlannedTurn, ...]:
    """The trajectory's turns as the simulator runs them, whatever the policy: each turn's
    generation capped by what is left of the response budget (tool responses count against
    it), a tool response capped to leave the next turn at least one token, and no turn after
    the budget is spent."""
    out: list[PlannedTurn] = []
    context, budget = row.prompt_tokens, s.max_response_tokens
    for i, turn in enumerate(row.turns):
        generated = min(turn.gen_tokens, budget)
        budget -= generated
        last = turn.tool_latency_s is None or i + 1 >= len(row.turns) or budget <= 0
        if last:
            out.append(PlannedTurn(context, generated, None, 0))
            break
        tool = s.default_tool_tokens if turn.tool_tokens is None else turn.tool_tokens
        tool = min(tool, budget - 1)
        out.append(PlannedTurn(context, generated, turn.tool_latency_s, tool))
        context += generated + tool
        budget -= tool
    return tuple(out)


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
        self.engines = [_Engine(i, settings, self) for i in range(settings.num_engines)]
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
        self.engines[a.engine_id].arrive(_Req(a.traj_id, run.context, n), self.now)

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

    def report(self, engine: _Engine) -> None:
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
        )


def simulate(rows: list[TraceRow], settings: SimSettings, sched: SchedulerSettings) -> SimResult:
    return Simulation(rows, settings, sched).run()


@dataclass(frozen=True)
class LowerBound:
    """Makespan no policy can beat under the model: ``max(work_s, critical_path_s)``."""

    work_s: float  # the least engine-busy time, spread over all engines
    critical_path_s: float  # the longest trajectory, alone on an engine

    @property
    def makespan_s(self) -> float:
        return max(self.work_s, self.critical_path_s)


def makespan_lower_bound(rows: list[TraceRow], s: SimSettings) -> LowerBound:
    """See :class:`LowerBound`. Every token generated at context length ``L`` costs its step
    ``per_kv_token_s x L`` and ``decode_token_s``; a step reads at most ``kv_tokens`` of KV and
    runs at most ``max_num_seqs`` requests, so the engines take at least ``max(sum of L /
    kv_tokens, tokens / max_num_seqs)`` steps between them, each paying ``step_base_s``."""
    c = s.cost
    kv_read = 0.0  # sum over generated tokens of the context length each one is decoded at
    tokens = prefill = 0
    critical = 0.0
    for row in rows:
        turns = plan_turns(row, s)
        row_prefill = row.prompt_tokens + sum(t.tool_tokens for t in turns)
        latency = sum(t.tool_latency_s or 0.0 for t in turns)
        row_tokens = sum(t.gen_tokens for t in turns)
        row_kv = sum(
            t.gen_tokens * t.context + t.gen_tokens * (t.gen_tokens - 1) / 2 for t in turns
        )
        kv_read += row_kv
        tokens += row_tokens
        prefill += row_prefill
        alone = (
            c.per_token_s * row_prefill
            + (c.step_base_s + c.decode_token_s) * row_tokens
            + c.per_kv_token_s * row_kv
            + latency
        )
        critical = max(critical, alone)
    steps = max(kv_read / s.kv_tokens, tokens / s.max_num_seqs)
    busy = (
        c.per_token_s * prefill
        + c.decode_token_s * tokens
        + c.per_kv_token_s * kv_read
        + c.step_base_s * steps
    )
    return LowerBound(work_s=busy / s.num_engines, critical_path_s=critical)
