"""How far live trajectories are expected to grow, from how long finished ones grew (pure).

kv_affinity admits a new trajectory to an engine only while the engine's live trajectories,
grown to their expected final length, leave room for it: reserving each dispatch's segment
never over-commits the KV, but admitting on today's reservations alone fills an engine whose
trajectories then need room to grow that is not there, and their turns wait (while vLLM's LRU
cache ages their prefixes out).
"""

from __future__ import annotations

import bisect
from collections import deque
from itertools import accumulate


class GrowthModel:
    """The final response lengths of the last ``window`` finished trajectories. Guarantees:
    :meth:`expected_total` is at least ``generated`` and is the mean of the observed lengths
    beyond it (their mean residual life), so a trajectory that has outgrown most is expected
    to grow less than a new one only as far as the observations say."""

    def __init__(self, window: int = 512, min_observed: int = 32) -> None:
        self._window: deque[int] = deque(maxlen=window)
        self._sorted: list[int] = []
        self._suffix: list[int] | None = [0]  # _suffix[i] = sum(_sorted[i:]); None: stale
        self._total = 0
        self.min_observed = min_observed

    @property
    def ready(self) -> bool:
        return len(self._sorted) >= self.min_observed

    def observe(self, response_tokens: int) -> None:
        if len(self._window) == self._window.maxlen:
            oldest = self._window[0]
            del self._sorted[bisect.bisect_left(self._sorted, oldest)]
            self._total -= oldest
        self._window.append(response_tokens)
        bisect.insort(self._sorted, response_tokens)
        self._total += response_tokens
        self._suffix = None  # rebuilt when next asked (observations come in bursts)

    def expected_total(self, generated: int) -> float:
        """Expected final response length of a trajectory that has ``generated`` tokens."""
        values = self._sorted
        if not values:
            return float(generated)
        if generated < values[0]:
            return self._total / len(values)
        i = bisect.bisect_right(values, generated)
        beyond = len(values) - i
        if not beyond:
            return float(generated)
        if self._suffix is None:
            self._suffix = list(accumulate(reversed(values), initial=0))[::-1]
        return self._suffix[i] / beyond
