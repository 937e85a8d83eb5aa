"""perf.soak's account of what a fault cost, read from rollouts saved the way the trainer
saves them."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from perf.soak import KIND_ORDER, count_losses, process_kind, pss_by_kind
from rstar2.agent.loop import Trajectory
from rstar2.trainer.batch import Rollout
from rstar2.trainer.rollout import save_rollouts


def _rollout(group: int, sample: int, tool_responses: list[str]) -> Rollout:
    traj = Trajectory(prompt_ids=[1, 2], response_ids=[3], loss_mask=[1])
    traj.tool_calls = [("print(1)", text) for text in tool_responses]
    return Rollout(group=group, sample=sample, trajectory=traj, reward=0.0)


def test_missing_repeated_and_internal_error_answers_are_counted(tmp_path):
    ok = "Tool call success\nstdout: 1\n"
    lost = "Tool call failure\nreason: internal_error\n"
    whole = [[_rollout(g, k, [ok]) for k in range(2)] for g in range(2)]
    save_rollouts(tmp_path, 1, whole)
    short = [[_rollout(0, 0, [ok, lost]), _rollout(0, 0, [])], [_rollout(1, 1, [])]]
    save_rollouts(tmp_path, 2, short)
    assert count_losses(tmp_path, [1], per_step=4) == {
        "trajectories": 4,
        "trajectories_lost": 0,
        "trajectories_duplicated": 0,
        "tool_calls": 4,
        "tool_calls_lost": 0,
    }
    assert count_losses(tmp_path, [1, 2, 3], per_step=4) == {
        "trajectories": 6,  # step 2 holds (0, 0) twice and (1, 1); step 3 was never saved
        "trajectories_lost": 2 + 4,
        "trajectories_duplicated": 1,
        "tool_calls": 6,
        "tool_calls_lost": 1,
    }


def test_memory_is_split_by_the_kind_of_process(tmp_path):
    assert process_kind("VLLM::Worker", "") == "vllm_worker"
    assert process_kind("VLLM::EngineCore", "") == "engine_core"
    assert process_kind("python", "python -m sandbox_pool.zygote --workers 8") == "sandbox"
    assert process_kind("python", "python -m rstar2.reward.host_entry 80 8") == "reward_host"
    assert process_kind("raylet", "raylet --node") == "other"
    # a real tree: the root counts as the trainer, its child by its command line
    child = "import time; time.sleep(60)"
    root = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time; "
         f"subprocess.Popen([sys.executable, '-c', {child!r}, 'sandbox_pool.zygote']); "
         "time.sleep(60)"],
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not psutil.Process(root.pid).children() and time.monotonic() < deadline:
            time.sleep(0.1)
        split = pss_by_kind(root.pid)
        assert list(split) == list(KIND_ORDER)
        assert split["trainer"] > 1 and split["sandbox"] > 1  # MiB: each a Python interpreter
        assert all(split[k] == 0 for k in ("vllm_worker", "engine_core", "reward_host"))
    finally:
        for p in psutil.Process(root.pid).children(recursive=True):
            p.kill()
        root.kill()
        root.wait()
