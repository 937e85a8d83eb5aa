"""The scheduler's value types and per-engine / per-trajectory state (pure data, no logic
beyond what each field guarantees). :mod:`scheduler.core` holds the state machine."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Policy = Literal["round_robin", "least_requests", "sticky", "kv_capacity", "kv_affinity"]
POLICIES: tuple[Policy, ...] = (
    "round_robin",
    "least_requests",
    "sticky",
    "kv_capacity",
    "kv_affinity",
)
ADMISSION_POLICIES: frozenset[Policy] = frozenset({"kv_capacity", "kv_affinity"})


class SchedulerError(ValueError):
    """A caller error: unknown trajectory or engine, an event out of order, a misfit."""


@dataclass(frozen=True, kw_only=True)
class SchedulerSettings:
    policy: Policy = "kv_affinity"
    initial_segment_tokens: int = 2048  # kv_affinity: segment before any turn was observed
    min_segment_tokens: int = 256
    segment_quantile: float = 0.5  # of recent turns' generated tokens
    # kv_affinity: False reserves a turn's whole remaining budget and never splits a turn into
    # segments, so each turn is one engine request and its tokens depend only on its seed
    split_turns: bool = True
    growth_window_turns: int = 512  # recent turns the quantile is taken over
    max_bypass: int = 64  # times a waiting dispatch may be passed before the queue holds
    max_misfits_per_pass: int = 8  # waiting dispatches tried in vain before a pass stops
    max_misfits_per_engine: int = 2  # kv_affinity: the same, per engine's queue
    new_headroom_fraction: float = 0.2  # kv_affinity: KV a new trajectory leaves free for
    # live ones (their next turns then rarely wait, and waiting prefixes get evicted)
    block_size_tokens: int = 1  # engines allocate KV in blocks: reservations round up to them
    max_running_per_engine: int | None = None  # admission policies: dispatches in flight per
    # engine at most (set it to the engines' max_num_seqs)
    balance_gap: int | None = 16  # kv_affinity, once no new trajectory waits: a turn leaves
    # its prefix's engine for the least busy one when that runs this many fewer dispatches
    # kv_affinity: admit a new trajectory only while the engine's live trajectories, grown to
    # their expected final length (scheduler.growth), and it fit this fraction of the KV
    admit_projected_fraction: float | None = 1.6
    move_free_fraction: float = 0.25  # kv_affinity: leave the prefix's engine only for one
    # this empty after placing (or once the dispatch has been passed max_bypass times)

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise SchedulerError(f"unknown policy {self.policy!r}; expected one of {POLICIES}")
        if not 0.0 < self.segment_quantile <= 1.0:
            raise SchedulerError("segment_quantile must be in (0, 1]")
        if self.min_segment_tokens < 1 or self.initial_segment_tokens < 1:
            raise SchedulerError("segment sizes must be positive")
        if self.block_size_tokens < 1:
            raise SchedulerError("block_size_tokens must be positive")
        if self.max_running_per_engine is not None and self.max_running_per_engine < 1:
            raise SchedulerError("max_running_per_engine must be positive")


@dataclass(frozen=True)
class Assignment:
    """Start one dispatch: ``traj_id`` generates at most ``max_tokens`` on ``engine_id``.

    ``reserved_tokens`` is what the scheduler holds for it (0 without admission control);
    ``moved`` says the trajectory's prefix is on another engine (this engine re-prefills it).
    """

    traj_id: str
    engine_id: int
    max_tokens: int
    reserved_tokens: int
    moved: bool


@dataclass
class EngineState:
    engine_id: int
    capacity_tokens: int
    reserved_tokens: int = 0  # held by dispatches (kv_affinity) or trajectories (kv_capacity)
    in_flight: int = 0  # dispatches started here and not finished
    live_trajectories: int = 0  # sticky: trajectories homed here
    reported_used_tokens: int = 0  # from the engine's own stats
    reported_running: int = 0
    reported_waiting: int = 0
    reported_preemptions: int = 0
    max_running: int | None = None  # the engine's own batch limit (vLLM's max_num_seqs)
    # kv_affinity: prefixes held here by trajectories now waiting to be placed
    waiting_holds: dict[str, int] = field(default_factory=dict)
    projected_tokens: float = 0.0  # kv_affinity: its live trajectories at expected final length
    down: bool = False  # failed: takes no dispatch until it is up again

    @property
    def free_tokens(self) -> int:
        """KV an admission may take here; -1 while the engine runs its most requests (a request
        queued inside the engine would hold nothing, and its cached prefix could age out) or
        while it is down."""
        if self.down or (self.max_running is not None and self.in_flight >= self.max_running):
            return -1
        return self.capacity_tokens - max(self.reserved_tokens, self.reported_used_tokens)


TrajectoryPhase = Literal["waiting", "running", "tool", "done"]


@dataclass
class TrajectoryState:
    traj_id: str
    seq: int
    session_id: str
    prompt_tokens: int
    max_response_tokens: int
    context_tokens: int
    state: TrajectoryPhase = "waiting"
    home: int | None = None  # engine holding its prefix (its last dispatch ran there)
    reserved: int = 0
    turn_generated: int = 0  # tokens generated so far in the current turn (over segments)
    bypassed: int = 0
    projected: float = 0.0  # its share of its home's projected_tokens

    @property
    def remaining_tokens(self) -> int:
        return self.prompt_tokens + self.max_response_tokens - self.context_tokens


@dataclass
class SchedulerStats:
    dispatches: int = 0
    moves: int = 0
    continuations: int = 0  # dispatches that continue a turn past a segment
    redispatches: int = 0  # dispatches that failed (their engine died) and were queued again
    engines_down: int = 0  # engine_down events
    peak_waiting: int = 0  # most trajectories waiting for a dispatch at once
    per_engine_dispatches: dict[int, int] = field(default_factory=dict)


def batch_full(engine: EngineState) -> bool:
    """The engine runs its most requests (vLLM's max_num_seqs)."""
    return engine.max_running is not None and engine.in_flight >= engine.max_running


def kv_free_besides(engine: EngineState, own_tokens: int) -> int:
    """KV on ``engine`` not taken, for a trajectory that holds ``own_tokens`` there (whether
    the engine is up or has a batch slot aside)."""
    taken = max(engine.reserved_tokens - own_tokens, engine.reported_used_tokens)
    return engine.capacity_tokens - taken


def free_besides(engine: EngineState, own_tokens: int) -> int:
    """Free KV on ``engine`` for a trajectory that already holds ``own_tokens`` there; -1 while
    it is down or runs its most requests."""
    if engine.down or batch_full(engine):
        return -1
    return kv_free_besides(engine, own_tokens)
