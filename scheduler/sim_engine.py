"""One continuous-batching engine of the rollout simulator (pure, no I/O).

It follows vLLM v1's scheduler: requests run in one continuous batch of at most
``max_num_seqs``; a waiting request is admitted (first come, first served) once its whole
context fits in free KV; every step each running request computes one token (its prefill, in the
first step, costs per token) and needs one more token of KV; when that KV is not there the most
recently admitted request is preempted: its KV is freed into the prefix cache, it rejoins the
front of the queue, and whatever of its context the cache lost by then is recomputed. The
engine has a prefix cache of the KV not in use, evicted least recently freed first and, within
one prefix, tail first (as vLLM v1 frees blocks): a turn that returns to the engine holding its
history prefills only what is not cached any more.

The engine advances in runs of steps between events; a request arriving mid-run joins after the
step in progress, so the model costs O(events log n), not O(steps x batch). What it does is
reported to its :class:`EngineHost` (the simulation).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Protocol

from scheduler.sim_model import SimSettings, StepCostModel


class EngineHost(Protocol):
    """What an engine tells the simulation that drives it."""

    def push(self, t: float, event: tuple[object, ...]) -> None:
        """Queue ``event`` at time ``t``."""

    def count_prefill(self, traj_id: str, engine_id: int, context: int, hit: int) -> None:
        """A request of ``traj_id`` was admitted with ``context`` tokens, ``hit`` of them cached."""

    def started(self, traj_id: str) -> None:
        """The engine admitted a request of ``traj_id``."""

    def preempted(self, traj_id: str, computed: int) -> None:
        """A request of ``traj_id`` was preempted with ``computed`` tokens of KV."""

    def dispatch_done(self, engine_id: int, traj_id: str, generated: int, now: float) -> None:
        """A request of ``traj_id`` ended, its trajectory ``generated`` tokens further."""

    def report(self, engine: SimEngine) -> None:
        """The engine's KV and queue changed (after each run of steps)."""


@dataclass(frozen=True)
class RunRecord:
    """One run of decode steps as an engine took it (``SimSettings.record_runs``): it costs
    ``prefill_s + cost.steps_s(first GPU time at running and kv_used, growth, steps)``."""

    running: int
    kv_used: int  # KV tokens resident in its first step
    steps: int
    prefill_s: float

    def time_s(self, c: StepCostModel) -> float:
        first = c.gpu_step_s(self.running, self.kv_used)
        return self.prefill_s + c.steps_s(first, c.per_kv_token_s * self.running, self.steps)


@dataclass
class EngineRequest:
    traj_id: str
    context: int  # tokens that must be resident when it runs
    to_generate: int
    start_step: int = 0
    order: int = 0  # admission order (preemption takes the newest)
    generated_before: int = 0  # by this dispatch before a preemption


class SimEngine:
    def __init__(self, engine_id: int, s: SimSettings, sim: EngineHost) -> None:
        self.id = engine_id
        self.s = s
        self.sim = sim
        self.step = 0
        self.running: OrderedDict[int, EngineRequest] = OrderedDict()
        self.finish_heap: list[tuple[int, int]] = []  # (finish step, order)
        self.kv_used = 0
        self.cache: OrderedDict[str, int] = OrderedDict()  # traj -> cached prefix tokens
        self.cached_total = 0
        self.waiting: deque[EngineRequest] = deque()
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
        self.runs: list[RunRecord] = []  # with SimSettings.record_runs

    def steps_by(self, now: float) -> int:
        """Steps this engine has completed by ``now``, its run in progress included (all of it
        when that run ends at ``now`` and its event is still queued)."""
        if not self.busy:
            return self.step
        if now >= self.run_start_t + self._run_time(self.run_steps):  # as its end was pushed
            return self.step + self.run_steps
        return self.step + min(self.run_steps, self._steps_done_by(now - self.run_start_t))

    # -- requests arrive here --
    def arrive(self, req: EngineRequest, now: float) -> None:
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
        first = c.gpu_step_s(n, self.kv_used)
        if c.host_s == 0.0 or c.host_overlap == 0.0:  # additive, summed as it always was
            return (
                self.run_prefill_s + k * (first + c.host_s) + c.per_kv_token_s * n * k * (k - 1) / 2
            )
        return self.run_prefill_s + c.steps_s(first, c.per_kv_token_s * n, k)

    def _steps_done_by(self, elapsed: float) -> int:
        c = self.s.cost
        n = len(self.running)
        rest = elapsed - self.run_prefill_s
        if rest <= 0:
            return 0
        if c.host_s != 0.0 and c.host_overlap != 0.0:  # piecewise: the most steps that fit
            first, growth = c.gpu_step_s(n, self.kv_used), c.per_kv_token_s * n
            lo, hi = 0, max(self.run_steps, 1)
            while c.steps_s(first, growth, hi) <= rest:
                hi *= 2
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if c.steps_s(first, growth, mid) <= rest:
                    lo = mid
                else:
                    hi = mid - 1
            return lo
        a = c.per_kv_token_s * n / 2
        b = c.step_base_s + c.host_s + c.decode_token_s * n + c.per_kv_token_s * self.kv_used - a
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
        if self.s.record_runs:
            self.runs.append(RunRecord(len(self.running), self.kv_used, k, self.run_prefill_s))
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
                EngineRequest(
                    req.traj_id,
                    req.context + generated,
                    req.to_generate - generated,
                    generated_before=req.generated_before + generated,
                )
            )

    def _release(self, req: EngineRequest, generated: int) -> None:
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
