"""``rstar2 train``: the recipe end to end in one run folder.

    [tiny model] -> [SFT cold start] -> eval -> for each stage: [filter, resets] ->
        step: prompts -> rollouts (scheduled, scored as they finish) -> RoC -> advantages
              -> learner step -> weight sync -> [eval] -> [checkpoint]
    -> eval -> model/, curves.png, summary.json

Run folder: ``config.json`` (resolved), ``sft/`` (when ``sft.data`` is set), ``metrics.jsonl``
(one object per RL step, plus eval lines), ``eval/step_N/<dataset>/report.{json,md}``,
``checkpoints/step_N/`` (learner state + ``trainer.json``), ``model/`` (the final policy as an
HF folder), ``curves.png`` and ``summary.json``.

Resuming (``resume=True``) loads the newest complete checkpoint (:mod:`rstar2.trainer.checkpoint`,
the one store a resume reads), drops the metric lines written after it (kept in
``metrics.discarded.jsonl``), loads the checkpointed weights into fresh engines and goes on.
Rollouts are seeded per trajectory, RoC's RNG is in the trainer state and the learner restores
its optimizer state, so on CPU the steps after the resume point repeat the uninterrupted run's.
SIGTERM stops at the next safe point with a checkpoint (:meth:`Trainer.request_stop`).
Building the starting policy and exporting the result are :mod:`rstar2.recipe`'s; where the
components run is the runtime's (:mod:`rstar2.runtime`).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import signal
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from rstar2 import recipe
from rstar2.agent.loop import AgentSettings, Trajectory
from rstar2.agent.template import ChatTemplate
from rstar2.config import Config, StageConfig
from rstar2.data.schema import DataError
from rstar2.learner.protocol import Learner, TrainSequence
from rstar2.runtime import Runtime, Services, placement_for
from rstar2.trainer import state as st
from rstar2.trainer.batch import Rollout, select
from rstar2.trainer.checkpoint import METRICS, Checkpointer
from rstar2.trainer.evaluation import evaluate_all
from rstar2.trainer.problems import DECONTAMINATION, load_eval_problems, load_train_problems
from rstar2.trainer.records import StepClock, step_record, summary_line
from rstar2.trainer.rollout import collect, load_rollouts, save_rollouts
from rstar2.trainer.sinks import MetricSinks
from rstar2.trainer.stopping import Stopped, StopRequest
from rstar2.trainer.wiring import (
    agent_settings,
    bucket_bytes,
    check_supported,
    learner_settings,
    services_spec,
)


class Trainer:
    """One run (see the module docstring); build with :meth:`prepare`, then ``await run()``.
    Every component comes from ``runtime`` and is closed with it."""

    def __init__(
        self, cfg: Config, run_dir: Path, runtime: Runtime, *, quiet: bool = False
    ) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.runtime = runtime
        self.quiet = quiet
        self.save_rollouts_dir: Path | None = None
        self.replay_rollouts_dir: Path | None = None
        self.services: Services | None = None
        self._learner: Learner | None = None
        self.template: ChatTemplate | None = None
        self.policy_path = cfg.model.path
        self.state = st.TrainerState()
        self.sinks: MetricSinks | None = None
        self._stop = StopRequest()
        self.checkpointer = Checkpointer(run_dir, cfg.checkpoint.keep_last)

    # ---- set-up ----

    def prepare(self, *, resume: bool) -> None:
        """Model, SFT, data and learner; with ``resume``, the newest checkpoint's state."""
        from transformers import AutoTokenizer

        check_supported(self.cfg)
        self.policy_path = recipe.initial_policy(
            self.cfg, self.run_dir, self._say, quiet=self.quiet
        )
        # model.tokenizer_path names the base model's tokenizer; SFT saves it with its model
        base_tokenizer = self.cfg.model.tokenizer_path
        tokenizer_from = self.policy_path if self.cfg.sft.data else base_tokenizer
        self.tokenizer_path = tokenizer_from or self.policy_path
        tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_path)
        fmt = self.cfg.agent.prompt_format(self.policy_path)
        self.prompt_format = fmt
        self.template = fmt.template(tokenizer, self.cfg.agent.tool_name)
        self.train = load_train_problems(self.cfg, self.template, self.run_dir)
        dropped = json.loads((self.run_dir / DECONTAMINATION).read_text())["dropped"]
        if dropped:
            self._say(f"data: dropped {dropped} training problem(s) overlapping a benchmark")
        self.evals = load_eval_problems(self.cfg, self.template)
        self._learner = self.runtime.open_learner(learner_settings(self.cfg, self.policy_path))
        where = self.runtime.placement.describe_learner(self._learner)
        if where:
            self._say(f"learner: {where}")
        self.rng = st.rng_from_json([], self.cfg.seed)
        if resume:
            self._restore()
        self.sinks = MetricSinks(self.cfg.logging, self.run_dir, self.cfg.model_dump(mode="json"))

    def _restore(self) -> None:
        restored = self.checkpointer.restore(self.learner)
        if restored is None:
            self._say("resume: no checkpoint yet; starting from the beginning")
            return
        self.state = restored
        self.rng = st.rng_from_json(restored.rng_state, self.cfg.seed)
        self._say(f"resume: from step_{restored.step:06d} (step {restored.step})")

    @property
    def learner(self) -> Learner:
        assert self._learner is not None, "prepare() first"
        return self._learner

    @contextlib.asynccontextmanager
    async def open_services(self) -> AsyncIterator[None]:
        """Engines (loaded with the learner's current weights), sandbox and scorer."""
        if self.replay_rollouts_dir is not None:
            yield
            return
        from rstar2.learner.sync import sync_weights

        async with self.runtime.services(services_spec(self.cfg, self.policy_path)) as services:
            self.services = services
            try:
                if self.learner.step > 0:  # resumed: engines start from the checkpoint
                    await sync_weights(self.learner, services.engines, bucket_bytes(self.cfg))
                yield
            finally:
                self.services = None

    # ---- the loop ----

    def request_stop(self) -> None:
        """Stop at the next safe point (SIGTERM): rollouts in flight are cancelled and their
        step undone; a step already learning finishes. Then a checkpoint, and run() returns."""
        self._stop.request()

    async def run(self) -> dict[str, Any]:
        try:
            return await self._run()
        except Stopped:
            state = self.state
            if not self.checkpointer.has(state.step):
                self.checkpoint()
            self._say(f"stopped at step {state.step}: checkpoint written; resume with --resume")
            return {"stopped": True, "steps": state.step}

    async def _run(self) -> dict[str, Any]:
        cfg, state = self.cfg, self.state
        async with self.open_services():
            if state.step == 0 and not state.stage_started:
                await self.evaluate(0)
            for index in range(state.stage_index, len(cfg.stages)):
                stage = cfg.stages[index]
                if state.stage_index != index:
                    state.stage_index, state.stage_step, state.stage_started = index, 0, False
                if not state.stage_started:
                    await self.start_stage(index, stage)
                sampler = st.PromptSampler(
                    state.pool if state.pool is not None else range(len(self.train.rows)),
                    seed=cfg.seed,
                    stage=index,
                    shuffle=cfg.data.shuffle,
                )
                while state.stage_step < stage.num_steps:
                    self._stop.check()
                    await self.step(stage, sampler)
                    self._stop.check()
            if state.last_eval_step != state.step:
                await self.evaluate(state.step)
            if not self.checkpointer.has(state.step):
                self.checkpoint()
        return recipe.finish(
            self.run_dir, self.learner, self.tokenizer_path, self.prompt_format, state.step
        )

    async def start_stage(self, index: int, stage: StageConfig) -> None:
        state = self.state
        pool: list[int] | None = None
        if stage.data_filter == "hard_subset":
            recorded = f"stage_{index}_hard_subset.json"
            if self.replay_rollouts_dir is not None:
                pool = _read_pool(self.replay_rollouts_dir / recorded)
            else:
                pool = await self.hard_subset(index, stage)
                if self.save_rollouts_dir is not None:
                    self.save_rollouts_dir.mkdir(parents=True, exist_ok=True)
                    (self.save_rollouts_dir / recorded).write_text(json.dumps(pool) + "\n")
        if stage.reset_optimizer and state.step > 0:
            self.learner.reset_optimizer()
        # reference <- policy: the loss has no KL term (checked at start), so there is no
        # reference model to reset; the flag is recorded in the metrics.
        state.pool, state.epoch, state.cursor, state.stage_started = pool, 0, 0, True
        self._log(
            {
                "step": state.step,
                "stage": stage.name,
                "stage_start": True,
                "stage_problems": len(pool) if pool is not None else len(self.train.rows),
                "reset_optimizer": stage.reset_optimizer,
                "reset_reference": stage.reset_reference,
            }
        )

    async def hard_subset(self, index: int, stage: StageConfig) -> list[int]:
        """Problems the current policy does not solve k of k (k = hard_subset_num_samples)."""
        k = stage.hard_subset_num_samples
        problems = list(range(len(self.train.rows)))
        groups = await self._rollouts(problems, stage, k, step=-(index + 1), desc="hard subset")
        hard = [
            p for p, g in zip(problems, groups, strict=True) if not all(r.reward > 0 for r in g)
        ]
        self._say(f"stage {stage.name}: hard subset keeps {len(hard)} of {len(problems)} problems")
        if not hard:
            raise DataError(f"stage {stage.name}: the policy solves every problem {k}/{k}")
        return hard

    async def step(self, stage: StageConfig, sampler: st.PromptSampler) -> None:
        """Rollouts -> RoC selection -> learner step -> weight sync -> metrics
        [-> eval] [-> checkpoint]."""
        cfg, state = self.cfg, self.state
        step, clock = state.step + 1, StepClock()
        before = copy.deepcopy(state)
        problems = sampler.next_batch(state, cfg.data.rollout_batch_num_prompts)
        try:
            groups = await self._step_rollouts(problems, stage, step)
        except Stopped:  # nothing of this step happened
            vars(state).update(vars(before))
            raise
        clock.mark("rollout")
        selected = select(groups, cfg.augmentation, cfg.algorithm, self.rng)
        learned = self._learn(selected.sequences)
        clock.mark("learn")
        if selected.sequences:
            await self._sync_weights()
        clock.mark("sync")
        state.step, state.stage_step = step, state.stage_step + 1
        record = step_record(
            step=step,
            stage=stage.name,
            stage_step=state.stage_step,
            groups=groups,
            selected=selected,
            learned=learned,
            clock=clock,
        )
        self._log(record)
        self._say(summary_line(record, sum(s.num_steps for s in cfg.stages)))
        if cfg.eval.every_steps and step % cfg.eval.every_steps == 0:
            await self.evaluate(step)
        if cfg.checkpoint.every_steps and step % cfg.checkpoint.every_steps == 0:
            self.checkpoint()

    async def _step_rollouts(
        self, problems: Sequence[int], stage: StageConfig, step: int
    ) -> list[list[Rollout]]:
        """The step's groups: generated (and saved when recording), or replayed."""
        if self.replay_rollouts_dir is not None:
            return load_rollouts(self.replay_rollouts_dir, step)
        n = self.cfg.rollout.num_samples_per_prompt
        groups = await self._rollouts(problems, stage, n, step=step, desc=f"step {step}")
        if self.save_rollouts_dir is not None:
            save_rollouts(self.save_rollouts_dir, step, groups)
        return groups

    def _learn(self, seqs: list[TrainSequence]) -> dict[str, float]:
        if not seqs:
            return {}
        if self.cfg.algorithm.recompute_old_logprobs:
            old = self.learner.compute_logprobs(seqs)
            seqs = [replace(s, old_logprobs=o) for s, o in zip(seqs, old, strict=True)]
        return self.learner.train_step(seqs)

    async def _sync_weights(self) -> None:
        from rstar2.learner.sync import sync_weights

        if self.services is not None:
            await sync_weights(self.learner, self.services.engines, bucket_bytes(self.cfg))

    async def _rollouts(
        self, problems: Sequence[int], stage: StageConfig, n: int, *, step: int, desc: str
    ) -> list[list[Rollout]]:
        from tqdm import tqdm

        services, template = self.services, self.template
        assert services is not None and template is not None
        cfg = self.cfg
        agent = agent_settings(cfg, stage.max_turns, stage.max_response_tokens)
        agent = replace(agent, temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p)

        async def run(prompt: list[int], settings: AgentSettings) -> Trajectory:
            return await services.run(template, prompt, settings)

        with tqdm(
            total=len(problems) * n, desc=desc, unit="traj", leave=False, disable=self.quiet
        ) as bar:
            return await self._stop.unless(
                collect(
                    [self.train.prompts[p] for p in problems],
                    [self.train.truths[p] for p in problems],
                    problems,
                    n=n,
                    run=run,
                    scorer=services.scorer,
                    agent=agent,
                    seed=self.cfg.seed,
                    step=step,
                    progress=bar,
                )
            )

    async def evaluate(self, step: int) -> dict[str, float]:
        """Every eval dataset at the current weights; reports under eval/step_N/."""
        if self.services is None or not self.evals:
            return {}
        assert self.template is not None
        out = await evaluate_all(
            self.cfg,
            self.services,
            self.template,
            self.evals,
            self.run_dir / "eval" / f"step_{step:06d}",
            say=self._say,
            quiet=self.quiet,
            step=step,
        )
        self._log({"step": step, "eval": True, **out})
        self.state.last_eval_step = step
        return out

    def checkpoint(self) -> Path:
        return self.checkpointer.save(self.learner, self.state, self.rng)

    # ---- output ----

    def _log(self, record: dict[str, Any]) -> None:
        with open(self.run_dir / METRICS, "a") as fh:
            fh.write(json.dumps(record) + "\n")
        if self.sinks is not None:
            self.sinks.log(record)

    def _say(self, line: str) -> None:
        print(line, flush=True)


def _read_pool(path: Path) -> list[int]:
    if not path.is_file():
        raise DataError(f"{path} is missing: the recorded run did not save this stage's subset")
    return [int(i) for i in json.loads(path.read_text())]


async def run_train(
    cfg: Config,
    run_dir: Path,
    *,
    resume: bool = False,
    save_rollouts_dir: Path | None = None,
    replay_rollouts_dir: Path | None = None,
    quiet: bool = False,
) -> dict[str, Any]:
    """Prepare and run one training run (the ``rstar2 train`` command's body)."""
    loop = asyncio.get_running_loop()
    async with Runtime(placement_for(cfg)) as runtime:
        trainer = Trainer(cfg, run_dir, runtime, quiet=quiet)
        trainer.save_rollouts_dir = save_rollouts_dir
        trainer.replay_rollouts_dir = replay_rollouts_dir
        loop.add_signal_handler(signal.SIGTERM, trainer.request_stop)
        try:
            trainer.prepare(resume=resume)
            return await trainer.run()
        finally:
            loop.remove_signal_handler(signal.SIGTERM)
            if trainer.sinks is not None:
                trainer.sinks.close()
