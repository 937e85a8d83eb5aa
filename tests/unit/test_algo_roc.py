from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rstar2.algo.roc import TraceStats, downsample, downsample_batch, penalty
from rstar2.config import DownSamplingConfig


def cfg(**kw) -> DownSamplingConfig:
    base = dict(down_sample_to_n=16, min_zero_reward_trace_num=2, min_non_zero_reward_trace_num=2)
    return DownSamplingConfig(**{**base, **kw})


def trace(reward: float, calls: int = 2, errors: int = 0, answers: int = 1, turns: int = 3):
    return TraceStats(reward, calls, errors, answers, turns)


def group_with(correct: list[int], n: int = 32, penalties: dict[int, int] | None = None):
    """n traces, reward 1 at ``correct``; ``penalties[i]`` tool errors (of 4 calls) for trace i."""
    penalties = penalties or {}
    return [
        trace(1.0 if i in correct else 0.0, calls=4, errors=penalties.get(i, 0)) for i in range(n)
    ]


def test_penalty_terms():
    assert penalty(trace(1, calls=0, answers=1)) == 0.5  # no tool call: 0.5, one answer: 0
    assert penalty(trace(1, calls=4, errors=1, answers=1)) == 0.25
    assert penalty(trace(1, calls=4, errors=0, answers=0)) == 1.0  # no closed answer pair
    assert penalty(trace(1, calls=4, errors=0, answers=3, turns=4)) == 0.5
    assert penalty(trace(1, calls=4, errors=2, answers=9, turns=2)) == 1.5  # format term caps at 1
    assert penalty(trace(1, calls=4, errors=4, answers=0), error_ratio=False) == 1.0
    assert penalty(trace(1, calls=4, errors=4, answers=0), answer_format=False) == 1.0


def test_three_correct_keeps_two_best_positives_and_first_fourteen_negatives():
    g = group_with([3, 10, 20], penalties={3: 3, 10: 0, 20: 1})
    kept = downsample(g, cfg())
    negatives = [i for i in range(32) if i not in (3, 10, 20)]
    assert kept == sorted([10, 20, *negatives[:14]])


def test_one_correct_keeps_it_and_fifteen_negatives():
    kept = downsample(group_with([31]), cfg())
    assert kept == sorted([31, *range(15)])


def test_thirty_correct_keeps_fourteen_best_positives_and_two_negatives():
    correct = [i for i in range(32) if i not in (5, 17)]
    errs = {i: (i % 4) for i in correct}
    kept = downsample(group_with(correct, penalties=errs), cfg())
    best = sorted(correct, key=lambda i: errs[i])[:14]  # stable: ties in sample order
    assert kept == sorted([*best, 5, 17])


def test_all_equal_groups_are_dropped():
    assert downsample(group_with([]), cfg()) == []
    assert downsample(group_with(list(range(32))), cfg()) == []
    assert downsample(group_with([]), cfg(reject_equal_reward=False)) == list(range(16))


def test_small_groups():
    assert downsample(group_with([1], n=15), cfg()) == []
    assert downsample(group_with([1], n=16), cfg()) == list(range(16))


def test_minimum_positive_count_pulls_in_a_lone_correct_trace():
    # G=4: k_pos = round(1 * 4 / 32) = 0 < min 2, so the one positive is kept (1 + 3)
    c = cfg(down_sample_to_n=4, min_zero_reward_trace_num=2, min_non_zero_reward_trace_num=2)
    assert downsample(group_with([7]), c) == [0, 1, 2, 7]


def test_bankers_rounding_of_counts():
    # 5 correct of 32 -> k_pos = round(2.5) = 2 (half to even), k_neg = round(13.5) = 14
    kept = downsample(
        group_with([0, 1, 2, 3, 4]),
        cfg(min_zero_reward_trace_num=0, min_non_zero_reward_trace_num=0),
    )
    assert sum(1 for i in kept if i < 5) == 2 and len(kept) == 16


def test_config_rejects_minimums_above_g():
    with pytest.raises(ValueError, match="min_zero_reward_trace_num"):
        cfg(down_sample_to_n=3)


def test_paper_mode_needs_an_rng():
    with pytest.raises(ValueError, match=r"random\.Random"):
        downsample(group_with([1, 2, 3]), cfg(selection="paper"))


groups_strategy = st.lists(
    st.tuples(st.booleans(), st.integers(0, 4), st.integers(0, 3), st.integers(1, 5)),
    min_size=17,
    max_size=48,
)


@given(groups_strategy, st.sampled_from(["reference", "paper"]), st.integers(0, 10**6))
@settings(max_examples=300, deadline=None)
def test_properties(rows, selection, seed):
    group = [TraceStats(float(ok), 4, err, ans, turns) for ok, err, ans, turns in rows]
    c = cfg(selection=selection)
    kept = downsample(group, c, random.Random(seed))
    if not kept:
        assert len({s.reward for s in group}) == 1
        return
    assert kept == sorted(set(kept)) and all(0 <= i < len(group) for i in kept)
    assert len(kept) == 16 or len(kept) == len(group)
    if selection == "reference" and len(kept) == 16:
        pos = [i for i in range(len(group)) if group[i].reward > 0]
        kept_pos = [i for i in kept if i in pos]
        worst_kept = max((penalty(group[i]) for i in kept_pos), default=-1)
        dropped = [penalty(group[i]) for i in pos if i not in kept]
        assert all(worst_kept <= p for p in dropped)  # kept positives have the lowest penalties


def test_paper_mode_frequencies_follow_inverse_penalty():
    # 4 positives with penalties 0, 0.25, 0.5, 1 (errors 0..4 of 4 calls) compete for k_pos slots
    errs = {0: 0, 1: 1, 2: 2, 3: 4}
    group = [trace(1.0, calls=4, errors=errs[i]) for i in range(4)] + [trace(0.0)] * 28
    c = cfg(
        selection="paper",
        down_sample_to_n=16,
        min_non_zero_reward_trace_num=1,
        min_zero_reward_trace_num=2,
        penalty_epsilon=0.1,
    )
    # k_pos = round(4 * 16 / 32) = 2 of the 4 positives each time
    counts: Counter[int] = Counter()
    trials = 20000
    rng = random.Random(1234)
    for _ in range(trials):
        counts.update(i for i in downsample(group, c, rng) if i < 4)
    weights = [1 / (errs[i] / 4 + 0.1) for i in range(4)]
    expected = _inclusion_probabilities(weights, 2)
    for i in range(4):
        assert counts[i] / trials == pytest.approx(expected[i], abs=0.015)


def _inclusion_probabilities(weights: list[float], k: int) -> list[float]:
    """Exact inclusion probabilities of successive weighted draws without replacement (k=2)."""
    total = sum(weights)
    probs = []
    for i, w in enumerate(weights):
        p_first = w / total
        p_second = sum((wj / total) * (w / (total - wj)) for j, wj in enumerate(weights) if j != i)
        probs.append(p_first + p_second)
    assert k == 2
    return probs


def test_batch_metrics_match_the_reference_names():
    groups = [group_with([1, 2]), group_with([]), group_with(list(range(32)))]
    report = downsample_batch(groups, cfg())
    m = report.metrics
    assert m["reject_equal_reward/solve_equal_total"] == 2
    assert m["reject_equal_reward/solve_equal_zeros"] == 1
    assert m["roc/groups_kept"] == 1 and m["roc/traces_kept"] == 16
    assert m["roc_answer_format/one_answer_count"] == 96
    assert report.kept[1] == [] and len(report.kept[0]) == 16


@given(groups_strategy, st.booleans(), st.booleans())
@settings(max_examples=100, deadline=None)
def test_batch_equals_group_by_group(rows, use_err, use_format):
    group = [TraceStats(float(ok), 4 * (err > 0), err, ans, turns) for ok, err, ans, turns in rows]
    c = cfg(roc_error_ratio=use_err, roc_answer_format=use_format)
    report = downsample_batch([group, group[:17]], c)
    assert report.kept == [downsample(group, c), downsample(group[:17], c)]
    mean = sum(penalty(s, error_ratio=use_err, answer_format=use_format) for s in group)
    mean += sum(penalty(s, error_ratio=use_err, answer_format=use_format) for s in group[:17])
    assert report.metrics["roc/penalty_mean"] == pytest.approx(mean / (len(group) + 17))
