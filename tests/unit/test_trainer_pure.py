"""The trainer's pure parts: RoC selection and advantages, metrics, prompt order, run-folder
bookkeeping, the record/replay format, and the toy data generator."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from rstar2.agent.loop import Trajectory
from rstar2.config import AlgorithmConfig, AugmentationConfig, DownSamplingConfig
from rstar2.data.schema import DataError
from rstar2.trainer import state as st
from rstar2.trainer.batch import Rollout, rollout_metrics, select
from rstar2.trainer.checkpoint import Checkpointer
from rstar2.trainer.rollout import load_rollouts, save_rollouts, trajectory_seed

REPO = Path(__file__).resolve().parents[2]


def _rollout(group: int, sample: int, reward: float, calls: int = 1, errors: int = 0) -> Rollout:
    traj = Trajectory(
        prompt_ids=[1, 2, 3],
        response_ids=[4, 5, 6, 7],
        loss_mask=[1, 1, 0, 1],
        logprobs=[-0.5, -0.25, 0.0, -1.0],
        num_turns=2,
        num_tool_calls=calls,
        num_tool_errors=errors,
        num_answer_pairs=1,
        finish_reason="stop",
    )
    return Rollout(group=group, sample=sample, trajectory=traj, reward=reward)


def _aug(n: int, *, down: bool = True) -> AugmentationConfig:
    ds = DownSamplingConfig(
        down_sample_to_n=n, min_zero_reward_trace_num=1, min_non_zero_reward_trace_num=1
    )
    return AugmentationConfig(do_down_sampling=down, down_sampling_config=ds)


def test_select_drops_equal_groups_and_centres_advantages() -> None:
    mixed = [_rollout(0, k, r) for k, r in enumerate([1, 0, 1, 0, 0, 0, 1, 1])]
    solved = [_rollout(1, k, 1.0) for k in range(8)]
    out = select([mixed, solved], _aug(4), AlgorithmConfig(), random.Random(0))
    assert out.metrics["num_prompts_kept"] == 1
    assert out.metrics["roc/groups_all_equal"] == 1
    assert len(out.sequences) == 4 and all(r.group == 0 for r in out.kept)
    advantages = [s.advantage for s in out.sequences]
    assert sum(advantages) == pytest.approx(0.0, abs=1e-6)
    for r, s in zip(out.kept, out.sequences, strict=True):
        assert (s.advantage > 0) == (r.reward > 0)
        assert list(s.token_ids) == r.prompt_ids + r.response_ids
        assert list(s.loss_mask) == [0, 0, 0, 1, 1, 0, 1]
        assert list(s.old_logprobs) == [0.0, 0.0, 0.0, -0.5, -0.25, 0.0, -1.0]


def test_select_prefers_error_free_positives() -> None:
    # positives 0..3 (0 and 1 had tool errors), negatives 4..7; keep 4 of 8 -> 2 + 2
    group = [_rollout(0, k, 1.0, calls=2, errors=2 if k < 2 else 0) for k in range(4)]
    group += [_rollout(0, k, 0.0) for k in range(4, 8)]
    out = select([group], _aug(4), AlgorithmConfig(), random.Random(0))
    assert [r.sample for r in out.kept] == [2, 3, 4, 5]
    assert out.metrics["roc/kept_tool_error_ratio"] < out.metrics["roc/all_tool_error_ratio"]


def test_select_without_down_sampling_keeps_whole_groups() -> None:
    group = [_rollout(0, k, float(k % 2)) for k in range(6)]
    out = select([group], _aug(4, down=False), AlgorithmConfig(), random.Random(0))
    assert len(out.kept) == 6


def test_rollout_metrics() -> None:
    groups = [[_rollout(0, 0, 1.0, calls=2, errors=1), _rollout(0, 1, 0.0, calls=0)]]
    m = rollout_metrics(groups)
    assert m["reward_mean"] == 0.5
    assert m["tool_calls_per_traj"] == 1.0
    assert m["tool_error_ratio"] == 0.5
    assert m["response_tokens_mean"] == 4.0


def test_prompt_sampler_resumes_in_the_same_order() -> None:
    sampler = st.PromptSampler(range(10), seed=3, stage=0, shuffle=True)
    state = st.TrainerState()
    full = [sampler.next_batch(state, 4) for _ in range(6)]  # crosses epochs
    assert sorted(full[0] + full[1] + full[2][:2]) == list(range(10))
    saved = st.TrainerState()
    first = [sampler.next_batch(saved, 4) for _ in range(2)]
    restored = st.TrainerState.from_json(json.loads(json.dumps(saved.to_json())))
    again = st.PromptSampler(range(10), seed=3, stage=0, shuffle=True)
    assert first + [again.next_batch(restored, 4) for _ in range(4)] == full
    other = st.PromptSampler(range(10), seed=4, stage=0, shuffle=True)
    assert other.order(0) != sampler.order(0)


def test_rng_state_round_trips_through_json() -> None:
    rng = random.Random(5)
    rng.random()
    copy = st.rng_from_json(json.loads(json.dumps(st.rng_to_json(rng))), seed=0)
    assert [rng.random() for _ in range(3)] == [copy.random() for _ in range(3)]


def test_checkpoint_bookkeeping(tmp_path: Path) -> None:
    for step in (2, 4, 6):
        folder = st.checkpoint_dir(tmp_path, step)
        folder.mkdir(parents=True)
        st.write_state(folder, st.TrainerState(step=step))
    st.checkpoint_dir(tmp_path, 8).mkdir()  # no trainer.json: incomplete
    assert [p.name for p in st.complete_checkpoints(tmp_path)][-1] == "step_000006"
    st.prune(tmp_path, keep_last=2, whole=st.complete_checkpoints(tmp_path))
    assert [st.read_state(p).step for p in st.complete_checkpoints(tmp_path)] == [4, 6]


def test_truncate_metrics_moves_later_lines_aside(tmp_path: Path) -> None:
    lines = [
        {"step": 0, "eval": True},
        {"step": 0, "stage_start": True},
        {"step": 1},
        {"step": 2},
        {"step": 2, "eval": True},
        {"step": 2, "stage_start": True},
        {"step": 3},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    Checkpointer(tmp_path, keep_last=3).truncate_metrics(2)
    kept = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert kept == lines[:5]
    aside = (tmp_path / "metrics.discarded.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in aside] == lines[5:]


def test_rollouts_round_trip(tmp_path: Path) -> None:
    groups = [[_rollout(g, k, float(k)) for k in range(3)] for g in range(2)]
    save_rollouts(tmp_path, 7, groups)
    assert load_rollouts(tmp_path, 7) == groups
    with pytest.raises(DataError, match="step 8"):
        load_rollouts(tmp_path, 8)
    (tmp_path / "step_000009.jsonl").write_text('{"group": 0}\n')
    with pytest.raises(DataError, match=r"step_000009\.jsonl:1"):
        load_rollouts(tmp_path, 9)


def test_a_flat_rollout_record_of_earlier_versions_still_loads(tmp_path: Path) -> None:
    """Replay files written before rollouts wrapped their trajectory: the same rollout."""
    r = _rollout(1, 2, 1.0, calls=2, errors=1)
    t = r.trajectory
    flat = {
        "group": 1,
        "sample": 2,
        **{k: getattr(t, k) for k in ("prompt_ids", "response_ids", "loss_mask", "logprobs")},
        "reward": 1.0,
        **{k: getattr(t, k) for k in ("num_turns", "num_tool_calls", "num_tool_errors")},
        "num_answer_pairs": 1,
        "finish_reason": "stop",
        "time_generate_s": 0.0,
        "time_tool_s": 0.0,
        "time_reward_s": 0.0,
    }
    (tmp_path / "step_000003.jsonl").write_text(json.dumps(flat) + "\n")
    assert load_rollouts(tmp_path, 3) == [[r]]


def test_trajectory_seeds_differ() -> None:
    seeds = {trajectory_seed(0, s, p, k) for s in range(3) for p in range(5) for k in range(8)}
    assert len(seeds) == 120
    assert trajectory_seed(1, 2, 3, 4) == trajectory_seed(1, 2, 3, 4)


def test_toy_data_is_disjoint_correct_and_matches_the_shipped_heldout(tmp_path: Path) -> None:
    from rstar2.agent.tools import ToolCall, parse_tool_calls
    from rstar2.toy import write_toy_data

    paths = write_toy_data(tmp_path, num_sft=300, num_train=200, num_heldout=100, seed=0)
    sft = [json.loads(x) for x in paths["sft"].read_text().splitlines()]
    train = [json.loads(x) for x in paths["train"].read_text().splitlines()]
    heldout_text = paths["heldout"].read_text()
    assert heldout_text == (REPO / "configs/toy/data/heldout.jsonl").read_text()
    heldout = [json.loads(x) for x in heldout_text.splitlines()]
    problems = [c["messages"][0]["content"] for c in sft]
    problems += [r["prompt"][0]["content"] for r in train + heldout]
    assert len(problems) == len(set(problems)) == 600
    calls_per_conv = []
    for conv in sft[:100]:
        user, call, *tools, final = conv["messages"]
        parsed = parse_tool_calls(call["content"])
        assert len(parsed) == len(tools) and [t["role"] for t in tools] == ["tool"] * len(tools)
        values = []
        for one, tool in zip(parsed, tools, strict=True):
            assert isinstance(one, ToolCall)
            expr = one.code.removeprefix("print(").removesuffix(")")
            values.append(str(eval(expr)))
            assert tool["content"].startswith(f"Tool call success\nstdout: {values[-1]}\n\n")
            assert all(part in user["content"] for part in expr.replace("*", "+").split("+"))
        assert final["content"].endswith(f"\\boxed{{{', '.join(values)}}}</answer>")
        calls_per_conv.append(len(parsed))
    assert set(calls_per_conv) == {1, 2}  # the product-and-sum problems call twice
    again = write_toy_data(tmp_path / "again", num_sft=300, num_train=200, num_heldout=100)
    assert again["sft"].read_text() == paths["sft"].read_text()


def test_metric_sinks(tmp_path: Path) -> None:
    import importlib.util

    from rstar2.config import ConfigError, LoggingConfig
    from rstar2.trainer.sinks import MetricSinks

    assert MetricSinks(LoggingConfig(), tmp_path, {})._tb is None
    if importlib.util.find_spec("tensorboard") is None:
        with pytest.raises(ConfigError, match=r"logging\.tensorboard"):
            MetricSinks(LoggingConfig(tensorboard=True), tmp_path, {})
        return
    sinks = MetricSinks(LoggingConfig(tensorboard=True), tmp_path, {})
    sinks.log({"step": 3, "reward_mean": 0.5, "stage": "s1", "updated": True})
    sinks.close()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert events.Tags()["scalars"] == ["reward_mean"]
    assert [(e.step, e.value) for e in events.Scalars("reward_mean")] == [(3, 0.5)]
