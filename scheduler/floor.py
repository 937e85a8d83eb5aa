"""Lower bounds on what the trajectories waiting in the new-trajectory queue need (pure).

kv_affinity reserves a first dispatch ``min(prompt + budget, context + segment)`` tokens (in
whole blocks), where ``segment`` is the same for every trajectory at a given moment. The least
of that over the queue is ``min(least total, least context + segment)``, so two lazily cleaned
heaps answer "can any waiting trajectory fit ``free`` tokens?" in O(1) amortized: when not,
the placement pass may skip its scan, with the same outcome (the scan would place nothing).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from scheduler.state import TrajectoryState


class QueueFloor:
    """Fed every trajectory pushed into the queue; ``still_queued(traj_id)`` says whether an
    entry may still be in it (entries for which it says no are dropped once they reach a heap's
    top, so the bounds may sit below the queue's true least, never above it)."""

    def __init__(self, still_queued: Callable[[str], bool]) -> None:
        self._still_queued = still_queued
        self._contexts: list[tuple[int, str]] = []
        self._totals: list[tuple[int, str]] = []

    def add(self, traj: TrajectoryState) -> None:
        heapq.heappush(self._contexts, (traj.context_tokens, traj.traj_id))
        total = traj.prompt_tokens + traj.max_response_tokens
        heapq.heappush(self._totals, (total, traj.traj_id))

    def least_need(self, segment_tokens: int | None) -> int | None:
        """The least tokens (before rounding to blocks) any queued trajectory's first dispatch
        reserves: its context plus ``segment_tokens``, capped by its total; ``None`` for the
        segment: the whole budget (turns not split). None: the queue is empty."""
        least_total = self._top(self._totals)
        if least_total is None:
            return None
        if segment_tokens is None:
            return least_total
        least_context = self._top(self._contexts)
        assert least_context is not None  # both heaps hold the same trajectories
        return min(least_total, least_context + segment_tokens)

    def _top(self, heap: list[tuple[int, str]]) -> int | None:
        while heap and not self._still_queued(heap[0][1]):
            heapq.heappop(heap)
        return heap[0][0] if heap else None
