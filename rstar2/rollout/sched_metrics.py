"""Scheduler and engine metrics of live rollouts: sampled at every dispatcher poll, summed over
a window (one RL step's rollouts) for ``metrics.jsonl``, and kept live for the Prometheus
endpoint (:mod:`rstar2.rollout.prometheus`).

Pure: no I/O, no asyncio. :func:`sample` reads the scheduler's public state and the engines'
:class:`~rstar2.rollout.engine.KVStats`; :class:`SchedMetrics` accumulates samples. Both cost
O(engines) per sample.

Guarantees:
- :meth:`SchedMetrics.take` covers the samples observed since the previous ``take`` (a
  window). Its counts (dispatches, migrations, preemptions, prefix-cache tokens) are the
  increase from the window's opening sample to its closing one, so consecutive windows add up
  to the whole run; the first window opens at the first sample.
- Engine counters are made monotonic: an engine seen down is replaced by a fresh one that
  counts from 0, and a count that goes backwards is read as such a restart (its new count is
  added, never a negative increase). :attr:`SchedMetrics.live` totals only grow.
- A down engine gives no KV sample. An engine whose prefix-cache counters are None does not
  count in the hit ratio, which is left out when no engine reported a queried token.
- :attr:`SchedMetrics.live` is replaced whole by each observation (one reference assignment),
  so a reader in another thread (the HTTP endpoint) sees one consistent sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rstar2.rollout.engine import KVStats
from scheduler.core import Scheduler
from scheduler.state import EngineState

PREFIX = "sched/"


@dataclass(frozen=True, kw_only=True)
class EngineSample:
    """One engine at one poll. Counters are the engine's own, cumulative since it started."""

    up: bool
    kv_used_ratio: float = 0.0  # of its KV capacity, as the engine reports it
    kv_reserved_ratio: float = 0.0  # held by the scheduler's reservations
    waiting_requests: int = 0  # queued inside the engine (its own scheduler)
    preemptions: int = 0
    prefix_queries_tokens: int | None = None
    prefix_hits_tokens: int | None = None


DOWN = EngineSample(up=False)


@dataclass(frozen=True, kw_only=True)
class SchedSample:
    """The scheduler and every engine at one poll; scheduler counters are cumulative."""

    engines: tuple[EngineSample, ...]
    waiting_turns: int  # turns that asked for an engine and have no placement yet
    dispatches: int
    migrations: int  # dispatches placed away from the engine holding the trajectory's prefix
    continuations: int
    redispatches: int


def sample(
    scheduler: Scheduler, stats: Sequence[KVStats | None], *, waiting_turns: int
) -> SchedSample:
    """The scheduler's state and the engines' ``stats`` (None: not read, e.g. down) now."""
    if len(stats) != len(scheduler.engines):
        raise ValueError(f"{len(stats)} engine stats for {len(scheduler.engines)} engines")
    counts = scheduler.stats
    return SchedSample(
        engines=tuple(_engine(s, kv) for s, kv in zip(scheduler.engines, stats, strict=True)),
        waiting_turns=waiting_turns,
        dispatches=counts.dispatches,
        migrations=counts.moves,
        continuations=counts.continuations,
        redispatches=counts.redispatches,
    )


def _engine(state: EngineState, kv: KVStats | None) -> EngineSample:
    if state.down or kv is None:
        return DOWN
    capacity = kv.capacity_tokens or state.capacity_tokens
    return EngineSample(
        up=True,
        kv_used_ratio=kv.used_tokens / capacity if capacity > 0 else 0.0,
        kv_reserved_ratio=state.reserved_tokens / state.capacity_tokens,
        waiting_requests=kv.num_waiting,
        preemptions=kv.num_preemptions,
        prefix_queries_tokens=kv.prefix_queries_tokens,
        prefix_hits_tokens=kv.prefix_hits_tokens,
    )


@dataclass(frozen=True)
class Totals:
    """Monotonic counts since the first sample (per engine: over its restarts)."""

    dispatches: int = 0
    migrations: int = 0
    continuations: int = 0
    redispatches: int = 0
    preemptions: tuple[int, ...] = ()
    prefix_queries_tokens: tuple[int | None, ...] = ()  # None: never reported
    prefix_hits_tokens: tuple[int | None, ...] = ()


@dataclass(frozen=True)
class LiveView:
    """What the endpoint shows: the latest sample and the totals up to it."""

    sample: SchedSample
    totals: Totals


class _Counter:
    """One engine counter made monotonic over restarts (see the module docstring)."""

    def __init__(self) -> None:
        self.last: int | None = None
        self.total: int | None = None

    def update(self, value: int | None, up: bool) -> None:
        if not up:
            self.last = 0 if self.last is not None else None  # its successor counts from 0
            return
        if value is None:
            return
        if self.last is None:  # first sight: what it counted before is its own history
            self.total = (self.total or 0) + value
        else:
            self.total = (self.total or 0) + (value - self.last if value >= self.last else value)
        self.last = value


class _Gauges:
    """Per-engine KV samples and the waiting queue over one window."""

    def __init__(self, n: int) -> None:
        self.up_samples = [0] * n
        self.used_sum, self.used_max, self.reserved_sum = [0.0] * n, [0.0] * n, [0.0] * n
        self.samples = 0
        self.waiting_sum = self.waiting_max = self.engine_waiting_max = 0

    def add(self, s: SchedSample) -> None:
        for i, e in enumerate(s.engines):
            if not e.up:
                continue
            self.up_samples[i] += 1
            self.used_sum[i] += e.kv_used_ratio
            self.used_max[i] = max(self.used_max[i], e.kv_used_ratio)
            self.reserved_sum[i] += e.kv_reserved_ratio
        self.samples += 1
        self.waiting_sum += s.waiting_turns
        self.waiting_max = max(self.waiting_max, s.waiting_turns)
        queued = sum(e.waiting_requests for e in s.engines if e.up)
        self.engine_waiting_max = max(self.engine_waiting_max, queued)

    def record(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for i, n in enumerate(self.up_samples):
            if n:
                out[f"{PREFIX}kv_used_ratio_mean/engine{i}"] = self.used_sum[i] / n
                out[f"{PREFIX}kv_used_ratio_max/engine{i}"] = self.used_max[i]
        up = sum(self.up_samples)
        if up:
            out[f"{PREFIX}kv_used_ratio_mean"] = sum(self.used_sum) / up
            out[f"{PREFIX}kv_reserved_ratio_mean"] = sum(self.reserved_sum) / up
        if self.samples:
            out[f"{PREFIX}waiting_turns_mean"] = self.waiting_sum / self.samples
            out[f"{PREFIX}waiting_turns_max"] = self.waiting_max
            out[f"{PREFIX}engine_waiting_requests_max"] = self.engine_waiting_max
        return out


class SchedMetrics:
    """Accumulates :class:`SchedSample` s (see the module docstring). One owner observes and
    takes; any thread may read :attr:`live`."""

    def __init__(self, num_engines: int) -> None:
        if num_engines < 1:
            raise ValueError("at least one engine is needed")
        self.num_engines = num_engines
        self._preemptions = [_Counter() for _ in range(num_engines)]
        self._queries = [_Counter() for _ in range(num_engines)]
        self._hits = [_Counter() for _ in range(num_engines)]
        self._gauges = _Gauges(num_engines)
        self._opened: Totals | None = None  # totals when the current window opened
        self.live: LiveView | None = None

    def observe(self, s: SchedSample, *, gauges: bool = True) -> None:
        """One poll's sample; ``gauges`` False counts it for the counters only (a sample
        taken to close a window exactly, outside the poll's rhythm)."""
        if len(s.engines) != self.num_engines:
            raise ValueError(f"a sample of {len(s.engines)} engines, not {self.num_engines}")
        for e, p, q, h in zip(s.engines, self._preemptions, self._queries, self._hits, strict=True):
            p.update(e.preemptions, e.up)
            q.update(e.prefix_queries_tokens, e.up)
            h.update(e.prefix_hits_tokens, e.up)
        totals = Totals(
            dispatches=s.dispatches,
            migrations=s.migrations,
            continuations=s.continuations,
            redispatches=s.redispatches,
            preemptions=tuple(c.total or 0 for c in self._preemptions),
            prefix_queries_tokens=tuple(c.total for c in self._queries),
            prefix_hits_tokens=tuple(c.total for c in self._hits),
        )
        if self._opened is None:
            self._opened = totals
        if gauges:
            self._gauges.add(s)
        self.live = LiveView(s, totals)

    def take(self, closing: SchedSample | None = None) -> dict[str, float]:
        """The window since the previous take as ``sched/*`` metrics, and a new window.
        ``closing`` (observed for the counters only) ends the window at this moment."""
        if closing is not None:
            self.observe(closing, gauges=False)
        out = self._gauges.record()
        if self.live is not None and self._opened is not None:
            out.update(_increase(self._opened, self.live.totals))
            self._opened = self.live.totals
        self._gauges = _Gauges(self.num_engines)
        return out


def _increase(start: Totals, end: Totals) -> dict[str, float]:
    out: dict[str, float] = {
        f"{PREFIX}dispatches": end.dispatches - start.dispatches,
        f"{PREFIX}migrations": end.migrations - start.migrations,
        f"{PREFIX}continuations": end.continuations - start.continuations,
        f"{PREFIX}redispatches": end.redispatches - start.redispatches,
        f"{PREFIX}preemptions": sum(end.preemptions) - sum(start.preemptions),
    }
    queries = _sum_increase(start.prefix_queries_tokens, end.prefix_queries_tokens)
    hits = _sum_increase(start.prefix_hits_tokens, end.prefix_hits_tokens)
    if queries > 0:
        out[f"{PREFIX}prefix_cache_hit_ratio"] = hits / queries
    return out


def _sum_increase(start: Sequence[int | None], end: Sequence[int | None]) -> int:
    return sum((b or 0) - (a or 0) for a, b in zip(start, end, strict=True))
