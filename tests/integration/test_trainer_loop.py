"""The trainer's loop without vLLM: steps, stages (a hard subset with an optimizer reset), eval
scheduling, checkpoints and exact resume, on the in-process HF engine with the real learner,
sandbox and scorer (tests/helpers/hf_placement.py)."""

from __future__ import annotations

import json
import shutil
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from rstar2.config import Config, StageConfig
from rstar2.runtime import Runtime
from rstar2.trainer import state as st
from rstar2.trainer.loop import Trainer
from tests.helpers.hf_placement import HFPlacement
from tests.helpers.train_config import tool_train_config

pytestmark = pytest.mark.asyncio(loop_scope="module")
# wall clock; the scheduler's figures (KV use sampled by a poller) depend on timing too
_TIMING = ("time_", "tokens_per_s", "gen_tokens_per_s", "sync/gb_per_s", "sched/")


def _config(tool_model_dir: Path, data: Path, **eval_cfg: Any) -> Config:
    """The trainer tests' run of the tool model (tests/helpers/train_config.py) in two stages,
    with a checkpoint every step and 200-token answers, on the in-process HF engine."""
    answers = {"max_response_tokens": 200, "max_turns": 3}
    return Config.model_validate(
        tool_train_config(
            tool_model_dir,
            data,
            sandbox={"num_workers": 1, "unsafe_weak_isolation": True},
            stages=[
                {"name": "s1", "num_steps": 2, **answers},
                {
                    "name": "s2",
                    "num_steps": 1,
                    **answers,
                    "data_filter": "hard_subset",
                    "hard_subset_num_samples": 2,
                    "reset_optimizer": True,
                },
            ],
            eval={"num_samples": 1, **answers, **eval_cfg},
            checkpoint={"every_steps": 1, "keep_last": 5},
            scheduler={"split_turns": False},
        )
    )


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    problems = [
        {"problem": "What is six times seven?", "answer": "42"},
        {"problem": "Add two and three, and five and five.", "answer": "5, 10"},
        {"problem": "What is six times seven?", "answer": "43"},  # never solved: stays hard
    ]
    path = tmp_path_factory.mktemp("data") / "problems.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in problems))
    return path


async def _train(
    cfg: Config, run_dir: Path, *, resume: bool = False, trainer_cls: type[Trainer] = Trainer
) -> dict[str, Any]:
    run_dir.mkdir(parents=True, exist_ok=True)
    async with Runtime(HFPlacement()) as runtime:
        trainer = trainer_cls(cfg, run_dir, runtime, quiet=True)
        try:
            trainer.prepare(resume=resume)
            return await trainer.run()
        finally:
            trainer.close()


def _metrics(run_dir: Path) -> list[dict[str, Any]]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(_TIMING)} for r in rows]


class _ScrapesEachStep(Trainer):
    """Scrapes its Prometheus endpoint after each step into ``scrape_step_N.txt``."""

    async def step(self, stage: StageConfig, sampler: st.PromptSampler) -> None:
        await super().step(stage, sampler)
        assert self.endpoint is not None
        url = f"http://127.0.0.1:{self.endpoint.port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            (self.run_dir / f"scrape_step_{self.state.step}.txt").write_bytes(resp.read())


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def full_run(tool_model_dir: Path, data: Path, tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("full")
    cfg = _config(tool_model_dir, data, every_steps=0)
    cfg.logging.metrics_port = 0  # a free port
    summary = await _train(cfg, run_dir, trainer_cls=_ScrapesEachStep)
    assert summary["steps"] == 3
    return run_dir


async def test_steps_stages_and_the_hard_subset(full_run: Path) -> None:
    rows = _metrics(full_run)
    steps = [r for r in rows if "reward_mean" in r]
    assert [(r["step"], r["stage"]) for r in steps] == [(1, "s1"), (2, "s1"), (3, "s2")]
    assert all(r["num_prompts"] == 2 for r in steps)
    assert any(r["updated"] for r in steps), "no step had a group with mixed rewards"
    assert sum(r["tool_calls_per_traj"] for r in steps) > 0
    start = [r for r in rows if r.get("stage_start") and r["stage"] == "s2"]
    assert len(start) == 1 and start[0]["reset_optimizer"] is True
    assert 1 <= start[0]["stage_problems"] <= 3  # the wrong-answer row is never solved
    assert [r["step"] for r in rows if r.get("eval")] == [0, 3]  # every_steps 0: first and last
    names = sorted(p.name for p in (full_run / "checkpoints").iterdir())
    assert names == ["step_000001", "step_000002", "step_000003"]
    for name in ("summary.json", "model/config.json", "decontamination.json"):
        assert (full_run / name).is_file(), name


async def test_steps_record_the_scheduler_and_the_endpoint_serves_it(full_run: Path) -> None:
    raw = [json.loads(x) for x in (full_run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in raw if "reward_mean" in r]
    dispatched = 0
    for r in steps:
        assert 0.0 <= r["sched/kv_used_ratio_mean/engine0"] <= r["sched/kv_used_ratio_max/engine0"]
        assert r["sched/kv_used_ratio_max/engine0"] <= 1.0
        assert r["sched/dispatches"] >= r["num_prompts"] * 4  # every trajectory's turns
        assert r["sched/migrations"] == 0  # one engine: no prefix is elsewhere
        assert r["sched/waiting_turns_max"] >= 0 and r["sched/preemptions"] == 0
        dispatched += r["sched/dispatches"]
        scrape = (full_run / f"scrape_step_{r['step']}.txt").read_text()
        got = {
            (smp.name, smp.labels.get("engine", "")): smp.value
            for family in text_string_to_metric_families(scrape)
            for smp in family.samples
        }
        assert got[("rstar2_engine_up", "0")] == 1.0
        assert 0.0 <= got[("rstar2_engine_kv_used_ratio", "0")] <= 1.0
        # the run's dispatches so far, evaluations and the hard subset's rollouts included
        assert got[("rstar2_scheduler_dispatches_total", "")] >= dispatched
        assert got[("rstar2_scheduler_migrations_total", "")] == 0


async def test_eval_every_n_steps(tool_model_dir: Path, data: Path, tmp_path: Path) -> None:
    cfg = _config(tool_model_dir, data, every_steps=2)
    cfg.stages = cfg.stages[:1]
    await _train(cfg, tmp_path / "run")
    assert [r["step"] for r in _metrics(tmp_path / "run") if r.get("eval")] == [0, 2]


async def test_resume_from_a_checkpoint_repeats_the_run(
    tool_model_dir: Path, data: Path, full_run: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "resumed"
    shutil.copytree(full_run, run_dir)
    for later in ("step_000002", "step_000003"):  # as if it had died after step 1
        shutil.rmtree(run_dir / "checkpoints" / later)
    for produced in ("model", "summary.json", "curves.png"):
        path = run_dir / produced
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    await _train(_config(tool_model_dir, data, every_steps=0), run_dir, resume=True)
    assert _metrics(run_dir) == _metrics(full_run)


class _StopsInEval(Trainer):
    """A trainer that receives SIGTERM's stop request as the step-2 evaluation starts."""

    async def evaluate(self, step: int) -> dict[str, float]:
        if step == 2:
            self.request_stop()
        return await super().evaluate(step)


async def test_a_stop_during_eval_checkpoints_and_the_resume_runs_that_eval_again(
    tool_model_dir: Path, data: Path, tmp_path: Path
) -> None:
    cfg = _config(tool_model_dir, data, every_steps=2)
    cfg.stages = cfg.stages[:1]
    await _train(cfg, tmp_path / "straight")
    run_dir = tmp_path / "stopped"
    summary = await _train(cfg, run_dir, trainer_cls=_StopsInEval)
    assert summary == {"stopped": True, "steps": 2}
    assert [r["step"] for r in _metrics(run_dir) if r.get("eval")] == [0]  # 2 was cut short
    assert (run_dir / "checkpoints" / "step_000002" / "trainer.json").is_file()
    await _train(cfg, run_dir, resume=True)
    assert _metrics(run_dir) == _metrics(tmp_path / "straight")


def _ahead_config(tool_model_dir: Path, data: Path) -> Config:
    cfg = _config(tool_model_dir, data, every_steps=0)
    cfg.rollout.max_staleness_steps = 1
    cfg.algorithm.recompute_old_logprobs = False  # the behaviour policy is the engine's
    cfg.stages[0].num_steps = 3
    return cfg


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def ahead_run(tool_model_dir: Path, data: Path, tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("ahead")
    summary = await _train(_ahead_config(tool_model_dir, data), run_dir)
    assert summary["steps"] == 4
    return run_dir


async def test_rollouts_one_step_ahead_record_their_staleness(ahead_run: Path) -> None:
    steps = [r for r in _metrics(ahead_run) if "reward_mean" in r]
    assert [(r["step"], r["stage"]) for r in steps] == [(1, "s1"), (2, "s1"), (3, "s1"), (4, "s2")]
    updates = 0  # learner steps taken before each step learned
    for r in steps:
        # generated ahead (steps 2, 3) on the weights before the previous step's update; the
        # first step of a stage is generated when it starts, on the newest weights
        ahead = r["stage"] == "s1" and r["step"] > 1
        previous_updated = ahead and steps[r["step"] - 2]["updated"]
        assert r["rollout/weight_version"] == updates - int(previous_updated)
        assert r["rollout/staleness_steps"] == int(previous_updated)
        updates += int(r["updated"])
    assert any(r["rollout/staleness_steps"] == 1 for r in steps), "no step learned ahead"
    assert all(r["sync/path"] == "buckets" for r in steps if r["updated"])


async def test_resume_with_rollouts_ahead_repeats_the_run(
    tool_model_dir: Path, data: Path, ahead_run: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "resumed"
    shutil.copytree(ahead_run, run_dir)
    for later in ("step_000003", "step_000004"):  # died after step 2, step 3's rollouts ahead
        shutil.rmtree(run_dir / "checkpoints" / later)
    assert (run_dir / "checkpoints" / "step_000002" / "ahead" / "step_000003.jsonl").is_file()
    for produced in ("model", "summary.json", "curves.png"):
        path = run_dir / produced
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    await _train(_ahead_config(tool_model_dir, data), run_dir, resume=True)
    assert _metrics(run_dir) == _metrics(ahead_run)


class _StopsWhileAhead(Trainer):
    """Receives SIGTERM's stop request as step 2 starts learning, step 3's rollouts ahead."""

    async def _learn(self, seqs: Any, step: int) -> dict[str, float]:
        if self.state.step == 1:
            self.request_stop()
        return await super()._learn(seqs, step)


async def test_a_stop_while_rollouts_run_ahead_drops_them_and_resumes_exactly(
    tool_model_dir: Path, data: Path, ahead_run: Path, tmp_path: Path
) -> None:
    cfg = _ahead_config(tool_model_dir, data)
    run_dir = tmp_path / "stopped"
    summary = await _train(cfg, run_dir, trainer_cls=_StopsWhileAhead)
    assert summary == {"stopped": True, "steps": 2}
    checkpoint = run_dir / "checkpoints" / "step_000002"
    assert not (checkpoint / "ahead").exists()  # cancelled: step 3 draws its prompts again
    await _train(cfg, run_dir, resume=True)
    resumed = [r for r in _metrics(run_dir) if "reward_mean" in r]
    straight = [r for r in _metrics(ahead_run) if "reward_mean" in r]
    assert resumed[:2] == straight[:2]
    # step 3 is generated after the resume on the newest weights: same prompts, no staleness
    assert resumed[2]["rollout/staleness_steps"] == 0
    assert resumed[2]["num_prompts"] == straight[2]["num_prompts"]
