"""Where the trainer's rollout groups come from: generated through the run's services (and
recorded when asked), or replayed from a recording (``rstar2 train --replay-rollouts``).

Guarantees: a step's groups are the same objects whichever way they come, so a replayed run
feeds the learner exactly what the recorded run did; a stage's hard subset is recorded and
replayed with its steps; generation stops (:class:`~rstar2.trainer.stopping.Stopped`) when a
stop is requested, with nothing of the step kept. A generated step's scheduler metrics
(``sched/*``: the dispatcher's window over exactly that step's rollouts, not the evaluations
or hard-subset rollouts around it) wait in ``scheduling`` for the step's record; a replayed
step has none.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from rstar2.agent.loop import AgentSettings, Trajectory
from rstar2.agent.template import ChatTemplate
from rstar2.config import Config, StageConfig
from rstar2.data.schema import DataError
from rstar2.runtime import Services
from rstar2.trainer.batch import Rollout
from rstar2.trainer.problems import Problems
from rstar2.trainer.rollout import collect, load_rollouts, save_rollouts
from rstar2.trainer.stopping import StopRequest
from rstar2.trainer.wiring import agent_settings


@dataclass
class RolloutSource:
    """Rollout groups for the trainer's steps and stage filters (see the module docstring).
    ``services`` is set while the run's engines are open (never when replaying)."""

    cfg: Config
    train: Problems
    template: ChatTemplate
    stop: StopRequest
    save_dir: Path | None = None
    replay_dir: Path | None = None
    quiet: bool = False
    services: Services | None = None
    scheduling: dict[int, dict[str, float]] = field(default_factory=dict)  # step -> sched/*

    @property
    def replaying(self) -> bool:
        return self.replay_dir is not None

    async def step_groups(
        self, problems: Sequence[int], stage: StageConfig, step: int
    ) -> list[list[Rollout]]:
        """The step's groups: generated (and saved when recording), or replayed."""
        if self.replay_dir is not None:
            return load_rollouts(self.replay_dir, step)
        n = self.cfg.rollout.num_samples_per_prompt
        assert self.services is not None, "generation needs the run's services open"
        dispatcher = self.services.dispatcher
        dispatcher.take_metrics()  # what ran before (an evaluation) is not this step's
        groups = await self.generate(problems, stage, n, step=step, desc=f"step {step}")
        self.scheduling[step] = dispatcher.take_metrics()
        if self.save_dir is not None:
            save_rollouts(self.save_dir, step, groups)
        return groups

    async def hard_subset(self, index: int, stage: StageConfig) -> tuple[list[int], int]:
        """The problems the current policy does not solve k of k (k =
        ``stage.hard_subset_num_samples``), and how many problems were tried."""
        recorded = f"stage_{index}_hard_subset.json"
        if self.replay_dir is not None:
            return _read_pool(self.replay_dir / recorded), len(self.train.rows)
        k = stage.hard_subset_num_samples
        problems = list(range(len(self.train.rows)))
        groups = await self.generate(problems, stage, k, step=-(index + 1), desc="hard subset")
        hard = [
            p for p, g in zip(problems, groups, strict=True) if not all(r.reward > 0 for r in g)
        ]
        if not hard:
            raise DataError(f"stage {stage.name}: the policy solves every problem {k}/{k}")
        if self.save_dir is not None:
            self.save_dir.mkdir(parents=True, exist_ok=True)
            (self.save_dir / recorded).write_text(json.dumps(hard) + "\n")
        return hard, len(problems)

    async def generate(
        self, problems: Sequence[int], stage: StageConfig, n: int, *, step: int, desc: str
    ) -> list[list[Rollout]]:
        """``n`` scored rollouts of each problem at the engines' current weights."""
        from tqdm import tqdm

        services, template, cfg = self.services, self.template, self.cfg
        assert services is not None, "generation needs the run's services open"
        agent = agent_settings(cfg, stage.max_turns, stage.max_response_tokens)
        agent = replace(agent, temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p)

        async def run(prompt: list[int], settings: AgentSettings) -> Trajectory:
            return await services.run(template, prompt, settings)

        with tqdm(
            total=len(problems) * n, desc=desc, unit="traj", leave=False, disable=self.quiet
        ) as bar:
            return await self.stop.unless(
                collect(
                    [self.train.prompts[p] for p in problems],
                    [self.train.truths[p] for p in problems],
                    problems,
                    n=n,
                    run=run,
                    scorer=services.scorer,
                    agent=agent,
                    seed=cfg.seed,
                    step=step,
                    progress=bar,
                )
            )


def _read_pool(path: Path) -> list[int]:
    if not path.is_file():
        raise DataError(f"{path} is missing: the recorded run did not save this stage's subset")
    return [int(i) for i in json.loads(path.read_text())]
