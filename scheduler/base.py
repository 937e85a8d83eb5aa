"""The scheduler's state and the bookkeeping every policy shares (pure): engines and
trajectories, the waiting queues, reservations, each trajectory's projected final length, and
starting a dispatch. :mod:`scheduler.affinity` places kv_affinity's dispatches on it;
:class:`scheduler.core.Scheduler` adds the events and the other policies."""

from __future__ import annotations

from collections import deque

from scheduler.floor import QueueFloor
from scheduler.growth import GrowthModel
from scheduler.state import (
    ADMISSION_POLICIES,
    Assignment,
    EngineState,
    SchedulerError,
    SchedulerSettings,
    SchedulerStats,
    TrajectoryPhase,
    TrajectoryState,
)


class SchedulerBase:
    """State and shared helpers; see :class:`scheduler.core.Scheduler` for the contract."""

    def __init__(self, capacities_tokens: list[int], settings: SchedulerSettings) -> None:
        if not capacities_tokens:
            raise SchedulerError("at least one engine is needed")
        if any(c <= 0 for c in capacities_tokens):
            raise SchedulerError("engine KV capacities must be positive")
        self.settings = settings
        self.engines = [
            EngineState(i, c, max_running=settings.max_running_per_engine)
            for i, c in enumerate(capacities_tokens)
        ]
        self.stats = SchedulerStats()
        self._trajs: dict[str, TrajectoryState] = {}
        self._waiting: set[str] = set()  # trajectories in state "waiting" (queues keep stale ids)
        self._queue: list[tuple[int, str]] = []  # (seq, traj_id) of waiting dispatches
        self._admitted: deque[str] = deque()  # kv_capacity: next turns of admitted ones
        # kv_affinity: waiting dispatches of trajectories with a prefix on engine i
        self._home_queues: list[list[tuple[int, str]]] = [[] for _ in self.engines]
        self._dirty: set[int] = set()  # engines whose queue or free KV changed since scanned
        # engine -> its oldest waiting turn that did not fit
        self._heads: dict[int, TrajectoryState] = {}
        self._seq = 0
        self._rr_next = 0
        self._turns: deque[int] = deque(maxlen=settings.growth_window_turns)
        self._sorted_turns: list[int] = []  # the same values, ordered (for the quantile)
        self._segment = settings.initial_segment_tokens
        self._growth = GrowthModel()  # kv_affinity: final lengths of finished trajectories
        self._new_floor = QueueFloor(self._may_be_new)  # kv_affinity: what _queue's least need

    def _may_be_new(self, traj_id: str) -> bool:
        """``traj_id`` may wait in ``_queue`` (kv_affinity queues only homeless dispatches)."""
        traj = self._trajs.get(traj_id)
        return traj is not None and traj.state == "waiting" and traj.home is None

    def _rescan_waiting(self) -> None:
        """Every engine with waiting turns is scanned again at the next :meth:`schedule`."""
        self._dirty.update(i for i, queue in enumerate(self._home_queues) if queue)

    def _engine(self, engine_id: int) -> EngineState:
        if not 0 <= engine_id < len(self.engines):
            raise SchedulerError(f"unknown engine {engine_id}")
        return self.engines[engine_id]

    def _get(self, traj_id: str, expect: TrajectoryPhase | None = None) -> TrajectoryState:
        traj = self._trajs.get(traj_id)
        if traj is None:
            raise SchedulerError(f"unknown trajectory {traj_id!r}")
        if expect is not None and traj.state != expect:
            raise SchedulerError(f"{traj_id!r} is {traj.state}, expected {expect}")
        return traj

    def _floor_blocks(self, tokens: int) -> int:
        bs = self.settings.block_size_tokens
        return tokens // bs * bs

    def _blocks(self, tokens: int) -> int:
        """``tokens`` rounded up to whole KV blocks."""
        bs = self.settings.block_size_tokens
        return -(-tokens // bs) * bs

    def _max_free(self) -> int:
        if self.settings.policy not in ADMISSION_POLICIES:
            return 1 << 62
        return max(e.free_tokens for e in self.engines)

    def _reproject(self, traj: TrajectoryState) -> None:
        """Keep ``traj``'s expected final length counted on its home engine (kv_affinity)."""
        if self.settings.policy != "kv_affinity" or traj.home is None:
            return
        engine = self.engines[traj.home]
        engine.projected_tokens -= traj.projected
        expected = self._growth.expected_total(traj.context_tokens - traj.prompt_tokens)
        traj.projected = traj.prompt_tokens + min(expected, traj.max_response_tokens)
        engine.projected_tokens += traj.projected

    def _start(
        self, traj: TrajectoryState, engine: EngineState, max_tokens: int, reserved: int
    ) -> Assignment:
        moved = traj.home is not None and traj.home != engine.engine_id
        if traj.home is not None:
            self.engines[traj.home].projected_tokens -= traj.projected
            traj.projected = 0.0
        traj.home = engine.engine_id
        self._reproject(traj)
        traj.state = "running"
        self._waiting.discard(traj.traj_id)
        engine.in_flight += 1
        self.stats.dispatches += 1
        self.stats.moves += int(moved)
        per = self.stats.per_engine_dispatches
        per[engine.engine_id] = per.get(engine.engine_id, 0) + 1
        return Assignment(traj.traj_id, engine.engine_id, max_tokens, reserved, moved)
