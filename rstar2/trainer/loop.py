"""``rstar2 train``: the recipe end to end in one run folder.

    [tiny model] -> [SFT cold start] -> eval -> for each stage: [filter, resets] ->
        step: prompts -> rollouts (scheduled, scored as they finish) -> RoC -> advantages
              -> learner step -> weight sync -> [eval] -> [checkpoint]
    -> eval -> model/, curves.png, summary.json

Run folder: ``config.json`` (resolved), ``sft/`` (when ``sft.data`` is set), ``metrics.jsonl``
(one object per RL step, plus eval lines), ``eval/step_N/<dataset>/report.{json,md}``,
``checkpoints/step_N/`` (learner state + ``trainer.json``), ``model/`` (the final policy as an
HF folder), ``curves.png`` and ``summary.json``.

Resuming (``resume=True``) loads the newest complete checkpoint, drops the metric lines written
after it (kept in ``metrics.discarded.jsonl``), loads the checkpointed weights into fresh
engines and goes on. Rollouts are seeded per trajectory and the learner restores its RNG and
optimizer state, so on CPU the steps after the resume point repeat the uninterrupted run's.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import signal
import time
from collections.abc import AsyncIterator, Coroutine, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from rstar2.agent.loop import AgentSettings, Trajectory
from rstar2.agent.template import ChatTemplate
from rstar2.config import Config, ConfigError, StageConfig
from rstar2.data.schema import DataError
from rstar2.learner.protocol import Learner
from rstar2.runtime import Runtime, Services, ServicesSpec, placement_for
from rstar2.trainer import state as st
from rstar2.trainer.batch import Rollout, rollout_metrics, select
from rstar2.trainer.curves import plot_curves
from rstar2.trainer.problems import DECONTAMINATION, load_eval_problems, load_train_problems
from rstar2.trainer.rollout import collect, load_rollouts, save_rollouts
from rstar2.trainer.sinks import MetricSinks

T = TypeVar("T")
METRICS = "metrics.jsonl"
_SUMMARY_KEYS = ("reward_mean", "num_prompts_kept", "tool_calls_per_traj", "response_tokens_mean")


class Stopped(Exception):
    """A stop was requested (SIGTERM); the run checkpoints and returns."""


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
        self._stop = asyncio.Event()

    # ---- set-up ----

    def prepare(self, *, resume: bool) -> None:
        """Model, SFT, data and learner; with ``resume``, the newest checkpoint's state."""
        from transformers import AutoTokenizer

        _check_supported(self.cfg)
        self.policy_path = self._initial_policy()
        tokenizer = AutoTokenizer.from_pretrained(self.policy_path)
        fmt = self.cfg.agent.prompt_format(self.policy_path)
        self.prompt_format = fmt
        self.template = fmt.template(tokenizer, self.cfg.agent.tool_name)
        self.train = load_train_problems(self.cfg, self.template, self.run_dir)
        dropped = json.loads((self.run_dir / DECONTAMINATION).read_text())["dropped"]
        if dropped:
            self._say(f"data: dropped {dropped} training problem(s) overlapping a benchmark")
        self.evals = load_eval_problems(self.cfg, self.template)
        self._learner = self.runtime.open_learner(_learner_settings(self.cfg, self.policy_path))
        where = self.runtime.placement.describe_learner(self._learner)
        if where:
            self._say(f"learner: {where}")
        self.rng = st.rng_from_json([], self.cfg.seed)
        if resume:
            self._restore()
        self.sinks = MetricSinks(self.cfg.logging, self.run_dir, self.cfg.model_dump(mode="json"))

    def _initial_policy(self) -> str:
        cfg = self.cfg
        base = Path(cfg.model.path)
        if cfg.model.tiny is not None and not (base / "config.json").is_file():
            self._build_tiny(base)
        if not (base / "config.json").is_file():
            raise DataError(f"model.path {base} is not a model folder (no config.json)")
        if not cfg.sft.data:
            return str(base)
        sft_dir = self.run_dir / "sft"
        summary = sft_dir / "summary.json"
        if not summary.is_file():
            from rstar2.sft import run_sft

            self._say(f"sft: {len(cfg.sft.data)} file(s) -> {sft_dir}")
            sft_dir.mkdir(parents=True, exist_ok=True)
            result = run_sft(cfg, sft_dir, quiet=self.quiet)
            summary.write_text(json.dumps(result, indent=2) + "\n")
            self._say(
                f"sft: {result['steps']} steps, nll {result['first_nll']:.3f} -> "
                f"{result['last_nll']:.3f} ({result['time_s']:.0f} s)"
            )
        return str(sft_dir / "model")

    def _build_tiny(self, folder: Path) -> None:
        from rstar2.data.sources import load_rows
        from rstar2.sft import load_conversations
        from rstar2.tiny import build_tiny_model

        tiny = self.cfg.model.tiny
        assert tiny is not None
        fmt = self.cfg.agent.prompt_format(str(folder))
        from rstar2.agent.template import USER_INSTRUCTION

        corpus = [fmt.system_prompt + " " + USER_INSTRUCTION] * 200
        for file in self.cfg.sft.data:
            for messages in load_conversations(file):
                corpus.append(" ".join(str(m.get("content") or "") for m in messages))
        for spec in self.cfg.data.train_datasets:
            corpus += [str(r["prompt"][-1]["content"]) for r in load_rows(spec).rows]
        corpus += [" ".join(str(i) for i in range(1000))] * 10
        self._say(f"building a tiny model in {folder}")
        build_tiny_model(
            folder,
            corpus,
            hidden_size=tiny.hidden_size,
            num_layers=tiny.num_layers,
            num_heads=tiny.num_heads,
            num_kv_heads=tiny.num_kv_heads,
            vocab_size=tiny.vocab_size,
            digit_group=tiny.digit_group,
            tie_word_embeddings=tiny.tie_word_embeddings,
            max_position_embeddings=max(2048, _max_model_len(self.cfg)),
            seed=self.cfg.seed,
        )
        fmt.save(folder)

    def _restore(self) -> None:
        found = st.complete_checkpoints(self.run_dir)
        if not found:
            self._say("resume: no checkpoint yet; starting from the beginning")
            _truncate_metrics(self.run_dir, -1)
            return
        latest = found[-1]
        self.learner.load(latest / "learner")
        self.state = st.read_state(latest)
        self.rng = st.rng_from_json(self.state.rng_state, self.cfg.seed)
        _truncate_metrics(self.run_dir, self.state.step)
        self._say(f"resume: from {latest.name} (step {self.state.step})")

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
                    await sync_weights(self.learner, services.engines, _bucket_bytes(self.cfg))
                yield
            finally:
                self.services = None

    # ---- the loop ----

    def request_stop(self) -> None:
        """Stop at the next safe point (SIGTERM): rollouts in flight are cancelled and their
        step undone; a step already learning finishes. Then a checkpoint, and run() returns."""
        self._stop.set()

    async def run(self) -> dict[str, Any]:
        try:
            return await self._run()
        except Stopped:
            state = self.state
            if not (st.checkpoint_dir(self.run_dir, state.step) / st.STATE_FILE).is_file():
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
                    self._check_stop()
                    await self.step(stage, sampler)
                    self._check_stop()
            if not self._eval_done(state.step):
                await self.evaluate(state.step)
            if not (st.checkpoint_dir(self.run_dir, state.step) / st.STATE_FILE).is_file():
                self.checkpoint()
        return self.finish()

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
        from rstar2.learner.sync import sync_weights

        cfg, state = self.cfg, self.state
        step = state.step + 1
        started = time.perf_counter()
        before = copy.deepcopy(state)
        problems = sampler.next_batch(state, cfg.data.rollout_batch_num_prompts)
        n = cfg.rollout.num_samples_per_prompt
        if self.replay_rollouts_dir is not None:
            groups = load_rollouts(self.replay_rollouts_dir, step)
        else:
            try:
                groups = await self._rollouts(problems, stage, n, step=step, desc=f"step {step}")
            except Stopped:  # nothing of this step happened
                vars(state).update(vars(before))
                raise
        if self.save_rollouts_dir is not None:
            save_rollouts(self.save_rollouts_dir, step, groups)
        time_rollout = time.perf_counter() - started
        selected = select(groups, cfg.augmentation, cfg.algorithm, self.rng)
        learn_start = time.perf_counter()
        learned: dict[str, float] = {}
        if selected.sequences:
            seqs = selected.sequences
            if cfg.algorithm.recompute_old_logprobs:
                old = self.learner.compute_logprobs(seqs)
                seqs = [replace(s, old_logprobs=o) for s, o in zip(seqs, old, strict=True)]
            learned = self.learner.train_step(seqs)
        time_learn = time.perf_counter() - learn_start
        sync_start = time.perf_counter()
        if selected.sequences and self.services is not None:
            await sync_weights(self.learner, self.services.engines, _bucket_bytes(cfg))
        time_sync = time.perf_counter() - sync_start
        state.step, state.stage_step = step, state.stage_step + 1
        rollouts = [r for g in groups for r in g]
        total_tokens = sum(len(r.prompt_ids) + len(r.response_ids) for r in rollouts)
        sampled = sum(sum(r.loss_mask) for r in rollouts)
        elapsed = time.perf_counter() - started
        record: dict[str, Any] = {
            "step": step,
            "stage": stage.name,
            "stage_step": state.stage_step,
            **rollout_metrics(groups),
            **selected.metrics,
            **{f"actor/{k}": v for k, v in learned.items() if k != "step"},
            "updated": bool(selected.sequences),
            "time_rollout_s": time_rollout,
            "time_generate_s": sum(r.time_generate_s for r in rollouts),
            "time_tool_s": sum(r.time_tool_s for r in rollouts),
            "time_reward_s": sum(r.time_reward_s for r in rollouts),
            "time_learn_s": time_learn,
            "time_sync_s": time_sync,
            "time_step_s": elapsed,
            "tokens_per_s": total_tokens / elapsed if elapsed > 0 else 0.0,
            "gen_tokens_per_s": sampled / time_rollout if time_rollout > 0 else 0.0,
        }
        self._log(record)
        self._say(_summary_line(record, stage, sum(s.num_steps for s in cfg.stages)))
        if cfg.eval.every_steps and step % cfg.eval.every_steps == 0:
            await self.evaluate(step)
        if cfg.checkpoint.every_steps and step % cfg.checkpoint.every_steps == 0:
            self.checkpoint()

    async def _rollouts(
        self, problems: Sequence[int], stage: StageConfig, n: int, *, step: int, desc: str
    ) -> list[list[Rollout]]:
        from tqdm import tqdm

        services, template = self.services, self.template
        assert services is not None and template is not None
        cfg = self.cfg
        agent = _agent_settings(cfg, stage.max_turns, stage.max_response_tokens)
        agent = replace(agent, temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p)

        async def run(prompt: list[int], settings: AgentSettings) -> Trajectory:
            return await services.run(template, prompt, settings)

        with tqdm(
            total=len(problems) * n, desc=desc, unit="traj", leave=False, disable=self.quiet
        ) as bar:
            return await self._unless_stopped(
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
        from tqdm import tqdm

        from rstar2.eval import EvalSettings, evaluate, write_report

        if self.services is None or not self.evals:
            return {}
        services, template = self.services, self.template
        assert template is not None
        cfg = self.cfg.eval
        settings = EvalSettings(
            n=cfg.num_samples,
            temperature=cfg.temperature,
            max_tokens=cfg.max_response_tokens,
            max_turns=cfg.max_turns,
            seed=self.cfg.seed,
        )
        agent = _agent_settings(self.cfg, cfg.max_turns, cfg.max_response_tokens)
        out: dict[str, float] = {}
        for spec, problems in self.evals.items():
            name = Path(spec).stem

            async def run(prompt: list[int], settings: AgentSettings) -> Trajectory:
                merged = replace(agent, temperature=settings.temperature, seed=settings.seed)
                return await services.run(template, prompt, merged)

            with tqdm(
                total=len(problems.rows) * settings.n,
                desc=f"eval {name}",
                unit="answer",
                leave=False,
                disable=self.quiet,
            ) as bar:
                report = await evaluate(
                    dataset=name,
                    rows=problems.rows,
                    run=run,
                    scorer=services.scorer,
                    template=template,
                    settings=settings,
                    progress=bar,
                )
            write_report(report, self.run_dir / "eval" / f"step_{step:06d}" / name)
            s = report["summary"]
            out[f"eval/{name}/accuracy"] = s[f"avg@{settings.n}"]
            out[f"eval/{name}/tool_calls"] = s["mean_tool_calls"]
            out[f"eval/{name}/response_tokens"] = s["mean_response_tokens"]
            self._say(
                f"eval step {step} {name}: avg@{settings.n} {100 * s[f'avg@{settings.n}']:.1f}%, "
                f"{s['mean_tool_calls']:.2f} tool calls per answer"
            )
        self._log({"step": step, "eval": True, **out})
        return out

    async def _unless_stopped(self, work: Coroutine[Any, Any, T]) -> T:
        """``work``'s result, unless a stop is requested first: then it is cancelled and
        Stopped raised."""
        task = asyncio.ensure_future(work)
        stop = asyncio.ensure_future(self._stop.wait())
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            raise Stopped
        return task.result()

    def _check_stop(self) -> None:
        if self._stop.is_set():
            raise Stopped

    def _eval_done(self, step: int) -> bool:
        return (
            any(r.get("eval") and r["step"] == step for r in _read_jsonl(self.run_dir / METRICS))
            or not self.evals
            or self.services is None
        )

    def checkpoint(self) -> Path:
        state = self.state
        state.rng_state = st.rng_to_json(self.rng)
        final = st.checkpoint_dir(self.run_dir, state.step)
        tmp = final.with_name(final.name + ".tmp")
        if tmp.exists():
            import shutil

            shutil.rmtree(tmp)
        self.learner.save(tmp / "learner")
        st.write_state(tmp, state)
        if final.exists():
            import shutil

            shutil.rmtree(final)
        tmp.rename(final)
        st.prune(self.run_dir, self.cfg.checkpoint.keep_last)
        return final

    def finish(self) -> dict[str, Any]:
        model_dir = self.run_dir / "model"
        self.learner.export_hf(model_dir)
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(self.policy_path).save_pretrained(model_dir)
        self.prompt_format.save(model_dir)
        curves = plot_curves(self.run_dir / METRICS, self.run_dir / "curves.png")
        rows = _read_jsonl(self.run_dir / METRICS)
        evals = [r for r in rows if r.get("eval")]
        steps = [r for r in rows if "reward_mean" in r]
        summary: dict[str, Any] = {
            "steps": self.state.step,
            "model_dir": str(model_dir),
            "curves": str(curves) if curves else None,
            "eval_before": evals[0] if evals else None,
            "eval_after": evals[-1] if evals else None,
            "reward_first": steps[0]["reward_mean"] if steps else None,
            "reward_last": steps[-1]["reward_mean"] if steps else None,
        }
        if len(evals) >= 2:
            summary["eval_gain_points"] = {
                k: round(100 * (evals[-1][k] - evals[0][k]), 2)
                for k in evals[0]
                if k.endswith("/accuracy") and k in evals[-1]
            }
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        return summary

    # ---- output ----

    def _log(self, record: dict[str, Any]) -> None:
        with open(self.run_dir / METRICS, "a") as fh:
            fh.write(json.dumps(record) + "\n")
        if self.sinks is not None:
            self.sinks.log(record)

    def _say(self, line: str) -> None:
        print(line, flush=True)


def _check_supported(cfg: Config) -> None:
    if cfg.learner.backend != "torch":
        raise ConfigError("learner.backend", "only 'torch' is implemented so far")
    if cfg.algorithm.kl_coef > 0 or cfg.algorithm.entropy_coef > 0:
        raise ConfigError(
            "algorithm.kl_coef", "KL and entropy terms are not wired into the trainer (use 0)"
        )


def _learner_settings(cfg: Config, model_path: str) -> Any:
    from rstar2.learner.torch_backend import TorchLearnerSettings

    return TorchLearnerSettings.from_config(
        cfg, model_path, lr=cfg.optim.lr, warmup_steps=cfg.optim.warmup_steps
    )


def _agent_settings(cfg: Config, max_turns: int, max_tokens: int) -> AgentSettings:
    a = cfg.agent
    return AgentSettings(
        max_turns=max_turns,
        max_response_tokens=max_tokens,
        tool_name=a.tool_name,
        max_parallel_tool_calls=a.max_parallel_tool_calls,
        tool_response_max_chars=a.tool_response_max_chars,
        tool_response_truncate_side=a.tool_response_truncate_side,
        tool_response_execution_time=a.tool_response_execution_time,
        tool_timeout_s=cfg.sandbox.max_execution_time_s,
    )


def _max_model_len(cfg: Config) -> int:
    longest = max([s.max_response_tokens for s in cfg.stages] + [cfg.eval.max_response_tokens])
    return cfg.data.max_prompt_tokens + longest + 64


def _bucket_bytes(cfg: Config) -> int:
    return cfg.learner.weight_sync_bucket_mb * 2**20


def services_spec(cfg: Config, model_path: str) -> ServicesSpec:
    """The rollout side of ``cfg``: its engines (loading ``model_path``), sandbox, reward and
    scheduler sections."""
    from rstar2.rollout.vllm_engine import VLLMEngineConfig

    r = cfg.rollout
    engine = VLLMEngineConfig(
        model_path=model_path,
        dtype=cfg.model.dtype,
        max_model_len=_max_model_len(cfg),
        seed=cfg.seed,
        enforce_eager=r.enforce_eager,
        gpu_memory_utilization=r.gpu_memory_utilization,
        tensor_parallel_size=r.tensor_parallel_size,
        kv_cache_space_gb=r.kv_cache_space_gb,
        enable_prefix_caching=r.enable_prefix_caching,
    )
    return ServicesSpec(
        engine=engine,
        num_engines=r.num_engines,
        sandbox=cfg.sandbox,
        reward=cfg.reward,
        scheduler=cfg.scheduler,
    )


def _summary_line(r: dict[str, Any], stage: StageConfig, total: int) -> str:
    return (
        f"step {r['step']}/{total} [{stage.name}] reward {r['reward_mean']:.3f} | kept "
        f"{r['num_prompts_kept']:.0f}/{r['num_prompts']:.0f} prompts | tool "
        f"{r['tool_calls_per_traj']:.2f}/traj err {r['tool_error_ratio']:.2f} | len "
        f"{r['response_tokens_mean']:.0f} | rollout {r['time_rollout_s']:.1f}s learn "
        f"{r['time_learn_s']:.1f}s sync {r['time_sync_s']:.2f}s"
    )


def _read_pool(path: Path) -> list[int]:
    if not path.is_file():
        raise DataError(f"{path} is missing: the recorded run did not save this stage's subset")
    return [int(i) for i in json.loads(path.read_text())]


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _truncate_metrics(run_dir: Path, step: int) -> None:
    """Keep the metric lines of steps up to ``step``; later ones move to a side file."""
    path = run_dir / METRICS
    rows = _read_jsonl(path)
    # a stage that starts right after the checkpoint starts again after the resume
    keep = [r for r in rows if r["step"] < step or (r["step"] == step and "stage_start" not in r)]
    dropped = [r for r in rows if r not in keep]
    if dropped:
        with open(run_dir / "metrics.discarded.jsonl", "a") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in dropped)
    path.write_text("".join(json.dumps(r) + "\n" for r in keep))


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
