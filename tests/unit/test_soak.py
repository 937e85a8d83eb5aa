"""perf.soak's account of what a fault cost, read from rollouts saved the way the trainer
saves them."""

from __future__ import annotations

from perf.soak import count_losses
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
