"""One step's rollouts: N samples per prompt through the agent loop, each scored as it finishes.

Scoring overlaps generation: a trajectory is graded the moment it ends, while others still run.
Every trajectory has its own sampling seed, fixed by (run seed, step, problem, sample), so with
per-request seeds in the engine the same step samples the same tokens however requests are
batched. The record/replay seam writes and reads a step's groups as JSONL.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from rstar2 import failpoints
from rstar2.agent.loop import AgentSettings, Trajectory
from rstar2.data.schema import DataError
from rstar2.trainer.batch import Rollout

RunFn = Callable[[list[int], AgentSettings], Awaitable[Trajectory]]


def trajectory_seed(seed: int, step: int, problem: int, sample: int) -> int:
    return random.Random(f"{seed}:{step}:{problem}:{sample}").randrange(2**31)


async def collect(
    prompts: Sequence[list[int]],
    truths: Sequence[str],
    problems: Sequence[int],
    *,
    n: int,
    run: RunFn,
    scorer: Any,
    agent: AgentSettings,
    seed: int,
    step: int,
    progress: Any = None,
) -> list[list[Rollout]]:
    """``n`` scored rollouts of each prompt, grouped per prompt in sample order."""

    async def one(g: int, k: int) -> Rollout:
        settings = replace(agent, seed=trajectory_seed(seed, step, problems[g], k))
        traj = await run(prompts[g], settings)
        start = time.perf_counter()
        reward = await scorer.ascore(traj.response_text, truths[g])
        failpoints.hit("rollout", step)
        if progress is not None:
            progress.update(1)
        return Rollout(
            group=g,
            sample=k,
            trajectory=traj,
            reward=float(reward),
            time_reward_s=time.perf_counter() - start,
        )

    done = await asyncio.gather(*(one(g, k) for g in range(len(prompts)) for k in range(n)))
    return [list(done[g * n : (g + 1) * n]) for g in range(len(prompts))]


def rollout_file(folder: Path, step: int) -> Path:
    return folder / f"step_{step:06d}.jsonl"


def save_rollouts(folder: Path, step: int, groups: Sequence[Sequence[Rollout]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = rollout_file(folder, step)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as fh:
        for group in groups:
            for r in group:
                fh.write(json.dumps(r.to_json()) + "\n")
    tmp.replace(path)
    return path


def load_rollouts(folder: Path, step: int) -> list[list[Rollout]]:
    """The groups saved for ``step``; DataError says what is missing or malformed."""
    path = rollout_file(folder, step)
    if not path.is_file():
        raise DataError(f"{path} does not exist: no rollouts were saved for step {step}")
    groups: dict[int, list[Rollout]] = {}
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        try:
            r = Rollout.from_json(json.loads(line))
        except (json.JSONDecodeError, TypeError, ValueError) as exc:
            raise DataError(f"{path}:{lineno}: {exc}") from None
        groups.setdefault(r.group, []).append(r)
    return [sorted(groups[g], key=lambda r: r.sample) for g in sorted(groups)]
