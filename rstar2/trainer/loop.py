"""``rstar2 train``: the recipe end to end in one run folder.

    [tiny model] -> [SFT cold start] -> eval -> for each stage: [filter, resets] ->
        step: prompts -> rollouts (scheduled, scored as they finish) -> RoC -> advantages
              -> learner step (with max_staleness_steps 1, the next step's rollouts alongside)
              -> weight sync -> [eval] -> [checkpoint]
    -> eval -> model/, curves.png, summary.json

Run folder: ``config.json`` (resolved), ``sft/`` (when ``sft.data`` is set), ``metrics.jsonl``
(one object per RL step, plus eval lines), ``eval/step_N/<dataset>/report.{json,md}``,
``checkpoints/step_N/`` (learner state + ``trainer.json``), ``model/`` (the final policy as an
HF folder), ``curves.png`` and ``summary.json``. With ``logging.metrics_port`` the rollout
metrics are also served live for Prometheus, from ``prepare`` until :meth:`Trainer.close`.

Where the next step's rollouts come from and how old they may be is :mod:`rstar2.trainer.ahead`'s;
how weights reach the engines is the services' weight sync (:mod:`rstar2.sync`).

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
import socket
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rstar2 import failpoints, recipe
from rstar2.agent.template import ChatTemplate
from rstar2.config import Config, StageConfig
from rstar2.learner.protocol import Learner, TrainSequence
from rstar2.runtime import Runtime, Services
from rstar2.sync import SyncStats
from rstar2.trainer import state as st
from rstar2.trainer.ahead import RolloutsAhead
from rstar2.trainer.batch import Rollout, select
from rstar2.trainer.checkpoint import METRICS, Checkpointer
from rstar2.trainer.evaluation import evaluate_all
from rstar2.trainer.problems import load_eval_problems, load_train_problems
from rstar2.trainer.records import StepClock, step_record, summary_line
from rstar2.trainer.sinks import MetricSinks
from rstar2.trainer.source import RolloutSource
from rstar2.trainer.stopping import Stopped, StopRequest
from rstar2.trainer.wiring import (
    check_supported,
    learner_settings,
    metrics_endpoint,
    services_spec,
)

if TYPE_CHECKING:
    from rstar2.rollout.prometheus import MetricsEndpoint


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
        self._learner: Learner | None = None
        self.template: ChatTemplate | None = None
        self.policy_path = cfg.model.path
        self.state = st.TrainerState()
        self.sinks: MetricSinks | None = None
        self.endpoint: MetricsEndpoint | None = None
        self._stop = StopRequest()
        self.checkpointer = Checkpointer(run_dir, cfg.checkpoint.keep_last)

    # ---- set-up ----

    def prepare(self, *, resume: bool) -> None:
        """Model, SFT, data and learner; with ``resume``, the newest checkpoint's state."""
        from transformers import AutoTokenizer

        check_supported(self.cfg)
        self.endpoint = metrics_endpoint(self.cfg)  # before SFT: a busy port fails at once
        if self.endpoint is not None:
            url = f"http://{socket.gethostname()}:{self.endpoint.port}/metrics"
            self._say(f"metrics: Prometheus endpoint at {url}")
        self.policy_path = recipe.initial_policy(
            self.cfg,
            self.run_dir,
            self._say,
            quiet=self.quiet,
            should_stop=lambda: self._stop.requested,
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
        if self.train.decontaminated:
            dropped = self.train.decontaminated
            self._say(f"data: dropped {dropped} training problem(s) overlapping a benchmark")
        self.evals = load_eval_problems(self.cfg, self.template)
        evals = [(f"data.eval_datasets {spec}", p) for spec, p in self.evals.items()]
        for key, problems in [("data.train_datasets", self.train), *evals]:
            warning = problems.skip_warning(key)
            if warning:
                self._say(f"data: {warning}")
        self.source = RolloutSource(
            self.cfg,
            self.train,
            self.template,
            self._stop,
            save_dir=self.save_rollouts_dir,
            replay_dir=self.replay_rollouts_dir,
            quiet=self.quiet,
        )
        self._learner = self.runtime.open_learner(learner_settings(self.cfg, self.policy_path))
        where = self.runtime.placement.describe_learner(self._learner)
        if where:
            self._say(f"learner: {where}")
        self.ahead = RolloutsAhead(self._generate, self.cfg.rollout.max_staleness_steps)
        self.rng = st.rng_from_json([], self.cfg.seed)
        if resume:
            self._restore()
        self.sinks = MetricSinks(self.cfg.logging, self.run_dir, self.cfg.model_dump(mode="json"))

    def _restore(self) -> None:
        restored = self.checkpointer.restore(self.learner, self.ahead.load)
        if restored is None:
            self._say("resume: no checkpoint yet; starting from the beginning")
            return
        self.state = restored
        self.rng = st.rng_from_json(restored.rng_state, self.cfg.seed)
        self._say(f"resume: from step_{restored.step:06d} (step {restored.step})")

    @property
    def services(self) -> Services | None:
        """The run's engines, sandbox and scorer while open (never when replaying)."""
        return self.source.services

    @property
    def learner(self) -> Learner:
        assert self._learner is not None, "prepare() first"
        return self._learner

    @contextlib.asynccontextmanager
    async def open_services(self) -> AsyncIterator[None]:
        """Engines (loaded with the learner's current weights), sandbox and scorer."""
        if self.source.replaying:
            yield
            return
        spec = services_spec(self.cfg, self.policy_path)
        async with self.runtime.services(spec, self.learner) as services:
            self.source.services = services
            if self.endpoint is not None:
                self.endpoint.watch(services.dispatcher.metrics)
            where = self.runtime.placement.describe_engines(services.engines)
            if where:
                self._say(f"engines: {where}")
            try:
                if self.learner.step > 0:  # resumed: engines start from the checkpoint
                    await services.weights.sync()
                yield
            finally:
                await self.ahead.cancel()
                self.source.services = None
                if self.endpoint is not None:
                    self.endpoint.watch(None)

    # ---- the loop ----

    def request_stop(self) -> None:
        """Stop at the next safe point (SIGTERM): rollouts and evaluation in flight are
        cancelled (a cancelled step is undone, a cancelled eval runs again on resume); a step
        already learning finishes. Then a checkpoint, and run() returns. During SFT: SFT stops
        between its steps and nothing of it is kept."""
        self._stop.request()

    def stop_from_signal(self, loop: asyncio.AbstractEventLoop) -> None:
        """:meth:`request_stop` from a signal handler."""
        self._stop.on_signal(loop)

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
            elif self._eval_due(state.step) and state.last_eval_step != state.step:
                await self.evaluate(state.step)  # a stop interrupted it: it runs again
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
            pool, tried = await self.source.hard_subset(index, stage)
            self._say(f"stage {stage.name}: hard subset keeps {len(pool)} of {tried} problems")
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
                "data/skipped_rows": len(self.train.skipped),
                **{f"data/skipped_{k}": n for k, n in self.train.skip_counts().items()},
            }
        )

    async def step(self, stage: StageConfig, sampler: st.PromptSampler) -> None:
        """Rollouts -> RoC selection -> learner step (the next step's rollouts alongside, when
        they may run ahead) -> weight sync -> metrics [-> eval] [-> checkpoint]."""
        cfg, state, learner = self.cfg, self.state, self.learner
        step, clock = state.step + 1, StepClock()
        before = copy.deepcopy(state)
        draw = lambda: sampler.next_batch(state, cfg.data.rollout_batch_num_prompts)  # noqa: E731
        try:
            batch = await self.ahead.take(step, draw, learner.step)
        except Stopped:  # nothing of this step happened
            vars(state).update(vars(before))
            raise
        clock.mark("rollout")
        if self.ahead.may_run_ahead(state.stage_step + 1, stage.num_steps):
            self.ahead.start(step + 1, state, draw, learner.step)
        selected = select(batch.groups, cfg.augmentation, cfg.algorithm, self.rng)
        staleness = learner.step - batch.weight_version
        learned = await self._learn(selected.sequences, step)
        clock.mark("learn")
        with contextlib.suppress(Stopped):  # this step learned: it completes; the loop stops
            await self.ahead.settle(state)  # the run-ahead finishes on the old weights
        clock.mark("ahead")
        synced = await self._sync_weights() if selected.sequences else None
        clock.mark("sync")
        state.step, state.stage_step = step, state.stage_step + 1
        record = step_record(
            step=step,
            stage=stage.name,
            stage_step=state.stage_step,
            groups=batch.groups,
            selected=selected,
            learned=learned,
            clock=clock,
            staleness=(batch.weight_version, staleness),
            synced=synced,
            scheduling=self.source.scheduling.pop(step, None),
        )
        self._log(record)
        self._say(summary_line(record, sum(s.num_steps for s in cfg.stages)))
        if self._eval_due(step):
            await self.evaluate(step)
        if cfg.checkpoint.every_steps and step % cfg.checkpoint.every_steps == 0:
            self.checkpoint()

    async def _generate(self, problems: Sequence[int], step: int) -> list[list[Rollout]]:
        stage = self.cfg.stages[self.state.stage_index]
        return await self.source.step_groups(problems, stage, step)

    async def _learn(self, seqs: list[TrainSequence], step: int) -> dict[str, float]:
        """The learner step, off the event loop (rollouts ahead go on meanwhile)."""
        if not seqs:
            return {}
        if self.services is not None:
            await self.services.weights.before_learn()
        if self.cfg.algorithm.recompute_old_logprobs:
            old = await asyncio.to_thread(self.learner.compute_logprobs, seqs)
            seqs = [replace(s, old_logprobs=o) for s, o in zip(seqs, old, strict=True)]
        failpoints.hit("learn", step)
        return await asyncio.to_thread(self.learner.train_step, seqs)

    async def _sync_weights(self) -> SyncStats | None:
        """The weights into the engines; an engine that failed in this step is restarted
        first and loads them with the others."""
        if self.services is None:
            return None
        stats, restarted = await self.services.sync_weights()
        for i in restarted:
            self._say(f"rollout engine {i} failed and was restarted with the current weights")
        if self.cfg.learner.weight_sync_audit:
            from rstar2.sync import audit

            engine = services_spec(self.cfg, self.policy_path).engine
            await audit.record(self.run_dir, self.services.engines, self.learner, engine)
        return stats

    async def evaluate(self, step: int) -> dict[str, float]:
        """Every eval dataset at the current weights; reports under eval/step_N/."""
        if self.services is None or not self.evals:
            return {}
        assert self.template is not None
        out = await self._stop.unless(
            evaluate_all(
                self.cfg,
                self.services,
                self.template,
                self.evals,
                self.run_dir / "eval" / f"step_{step:06d}",
                say=self._say,
                quiet=self.quiet,
                step=step,
            )
        )
        self._log({"step": step, "eval": True, **out})
        self.state.last_eval_step = step
        return out

    def _eval_due(self, step: int) -> bool:
        every = self.cfg.eval.every_steps
        return bool(every) and step > 0 and step % every == 0

    def checkpoint(self) -> Path:
        return self.checkpointer.save(self.learner, self.state, self.rng, self.ahead.save)

    # ---- output ----

    def close(self) -> None:
        """Close the metric sinks and the Prometheus endpoint (idempotent)."""
        sinks, self.sinks = self.sinks, None
        if sinks is not None:
            sinks.close()
        endpoint, self.endpoint = self.endpoint, None
        if endpoint is not None:
            endpoint.close()

    def _log(self, record: dict[str, Any]) -> None:
        with open(self.run_dir / METRICS, "a") as fh:
            fh.write(json.dumps(record) + "\n")
        if self.sinks is not None:
            self.sinks.log(record)

    def _say(self, line: str) -> None:
        print(line, flush=True)
