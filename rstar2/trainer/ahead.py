"""Rollouts one step ahead of the learner (``rollout.max_staleness_steps: 1``).

Step k's learner update runs while the engines generate step k+1's rollouts with the weights
step k started from; the weights of step k reach the engines only after both are done, so
every trajectory comes from one weight version, and a step learns from rollouts at most one
update old. With ``max_staleness_steps: 0`` nothing runs ahead and this is the synchronous loop.

Guarantees:
- :meth:`RolloutsAhead.take` returns the step's rollouts with the weight version that generated
  them: the ones generated ahead when there are, else generated now.
- A run-ahead never crosses a stage boundary (a stage's start may filter the problems and
  reset the optimizer).
- A stop during the run-ahead cancels it and puts the prompts it drew back
  (:meth:`RolloutsAhead.settle`), so the checkpoint that follows is the state before the draw.
- A finished run-ahead is part of the checkpoint (:meth:`save` / :meth:`load`): a resumed run
  learns from the same rollouts the uninterrupted run would have.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rstar2.trainer.batch import Rollout
from rstar2.trainer.rollout import load_rollouts, save_rollouts
from rstar2.trainer.state import TrainerState
from rstar2.trainer.stopping import Stopped

AHEAD_DIR = "ahead"
_INFO = "ahead.json"

Generate = Callable[[Sequence[int], int], Awaitable[list[list[Rollout]]]]


@dataclass(frozen=True)
class StepRollouts:
    """One step's scored groups and the learner step count of the weights that generated them."""

    step: int
    groups: list[list[Rollout]]
    weight_version: int


class RolloutsAhead:
    """At most one step's rollouts in flight or finished ahead of the learner."""

    def __init__(self, generate: Generate, max_staleness_steps: int) -> None:
        self._generate = generate
        self.max_staleness_steps = max_staleness_steps
        self._ready: StepRollouts | None = None
        self._task: asyncio.Task[list[list[Rollout]]] | None = None
        self._pending: tuple[int, int, tuple[int, int]] | None = None  # step, version, undo

    async def take(
        self, step: int, draw: Callable[[], list[int]], weight_version: int
    ) -> StepRollouts:
        """``step``'s rollouts: the finished run-ahead, else ``draw()``'s prompts now."""
        if self._ready is not None:
            if self._ready.step != step:
                raise RuntimeError(f"rollouts of step {self._ready.step} ahead, step {step} wanted")
            ready, self._ready = self._ready, None
            return ready
        groups = await self._generate(draw(), step)
        return StepRollouts(step, groups, weight_version)

    def may_run_ahead(self, stage_step: int, stage_steps: int) -> bool:
        """Whether the step after the one that is ``stage_step``-th of its stage may start now:
        overlap is on and that step is in the same stage."""
        return self.max_staleness_steps > 0 and stage_step < stage_steps

    def start(
        self, step: int, state: TrainerState, draw: Callable[[], list[int]], weight_version: int
    ) -> None:
        """Generate ``step``'s rollouts in the background at the engines' current weights
        (``weight_version``); ``draw`` takes its prompts from ``state``'s sampler position."""
        if self._task is not None or self._ready is not None:
            raise RuntimeError("a run-ahead is already there")
        undo = (state.epoch, state.cursor)
        problems = draw()
        self._pending = (step, weight_version, undo)
        self._task = asyncio.ensure_future(self._generate(problems, step))

    async def settle(self, state: TrainerState) -> None:
        """Wait for the run-ahead; a stopped one is dropped and its draw undone in ``state``,
        then Stopped is raised. Another failure is raised as itself."""
        if self._task is None:
            return
        task, (step, version, undo) = self._task, self._pending or (0, 0, (0, 0))
        self._task, self._pending = None, None
        try:
            groups = await task
        except Stopped:
            state.epoch, state.cursor = undo
            raise
        except BaseException:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            raise
        self._ready = StepRollouts(step, groups, version)

    async def cancel(self) -> None:
        """Drop a run-ahead still in flight (the run is ending on an error)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
            self._task, self._pending = None, None

    def save(self, folder: Path) -> None:
        """The finished run-ahead (if any) into a checkpoint folder."""
        if self._ready is None:
            return
        ready = self._ready
        save_rollouts(folder / AHEAD_DIR, ready.step, ready.groups)
        info = {"step": ready.step, "weight_version": ready.weight_version}
        (folder / AHEAD_DIR / _INFO).write_text(json.dumps(info) + "\n")

    def load(self, folder: Path) -> None:
        """What :meth:`save` wrote into ``folder`` (nothing there: nothing ahead)."""
        self._ready = None
        info_path = folder / AHEAD_DIR / _INFO
        if not info_path.is_file():
            return
        info = json.loads(info_path.read_text())
        step = int(info["step"])
        groups = load_rollouts(folder / AHEAD_DIR, step)
        self._ready = StepRollouts(step, groups, int(info["weight_version"]))
