"""Named points where a fault-injection test makes this process die (the failpoints of etcd
and FoundationDB): ``RSTAR2_FAILPOINTS="rollout@3,learn@4"`` makes the process SIGKILL itself
the first time it reaches the named point in that step, so a test can kill the trainer at an
exact place in its work rather than at whatever moment a timer lands on.

Points: ``rollout`` (the step's first trajectory is scored, the others still in flight),
``learn`` (the step's old log-probs are computed, its update has not been applied) and
``checkpoint_write`` (the learner state is on disk in ``step_N.tmp``, not yet sealed).

Unset (a real run), :func:`hit` is one dictionary lookup. A malformed value is an error at
the first hit, not a silent no-op: a fault test must not pass because its fault never fired.
"""

from __future__ import annotations

import os
import signal
import sys

POINTS = ("rollout", "learn", "checkpoint_write")
ENV = "RSTAR2_FAILPOINTS"
_armed: set[tuple[str, int]] | None = None


def parse(spec: str) -> set[tuple[str, int]]:
    """``"rollout@3,learn@4"`` as {("rollout", 3), ("learn", 4)}; ValueError names a bad part."""
    armed = set()
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, step = part.partition("@")
        if name not in POINTS or not step.isdigit():
            raise ValueError(f"{ENV}: {part!r} is not <point>@<step> with a point of {POINTS}")
        armed.add((name, int(step)))
    return armed


def hit(point: str, step: int) -> None:
    """SIGKILL this process if ``point@step`` is armed (stdio flushed first: a test reads it)."""
    global _armed
    if _armed is None:
        _armed = parse(os.environ.get(ENV, ""))
    if (point, step) in _armed:
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
