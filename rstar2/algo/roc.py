"""GRPO-RoC down-sampling (Resample-on-Correct): keep G of a prompt's 2G rollouts (pure).

Negatives (reward <= 0) are kept for their diversity; positives are kept by quality, measured as
a penalty: ``p_err`` = tool errors / tool calls (0.5 with no call) plus ``p_format`` = 1 without
a closed ``<answer>`` pair, else ``min(1, (answer pairs - 1) / assistant turns)``.

Two selection modes (``cfg.selection``):
- ``reference``, exactly the released rStar2-Agent code: k_neg = round(|neg| G / N) and
  k_pos = round(|pos| G / N) with Python's banker's rounding; if k_neg < min_zero and
  k_pos < min_non_zero the whole group is kept; otherwise the minimum rules move counts between
  the two sides; the k_pos lowest-penalty positives (stable sort: ties by sample order) and the
  first k_neg negatives in sample order are kept.
- ``paper``, as the report describes it: the same counts, negatives uniformly at random and
  positives without replacement with probability proportional to 1 / (penalty + epsilon).

A group with N < G rollouts is dropped, one with N == G kept whole; with ``reject_equal_reward``
a group whose rewards are all equal is dropped first. Guarantees: kept indices are distinct,
ascending, a subset of the group, and exactly G of them unless the group is dropped or kept
whole; the same inputs and RNG state give the same output.
"""

from __future__ import annotations

import itertools
import math
import operator
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np


@dataclass(frozen=True, slots=True)
class TraceStats:
    """What down-sampling needs to know about one rollout."""

    reward: float
    num_tool_calls: int
    num_tool_errors: int
    num_answer_pairs: int
    num_turns: int


class DownSamplingSettings(Protocol):
    """Read by attribute: :class:`rstar2.config.DownSamplingConfig` satisfies it."""

    down_sample_to_n: int
    reject_equal_reward: bool
    roc_error_ratio: bool
    roc_answer_format: bool
    min_zero_reward_trace_num: int
    min_non_zero_reward_trace_num: int
    selection: Literal["reference", "paper"]
    penalty_epsilon: float


def penalty_terms(s: TraceStats) -> tuple[float, float]:
    """(p_err, p_format): the tool-error ratio (0.5 for a trace that never called the tool), and
    1 without a closed answer pair, else min(1, (answer pairs - 1) / assistant turns)."""
    calls = s.num_tool_calls
    p_err = s.num_tool_errors / calls if calls > 0 else 0.5
    pairs, turns = s.num_answer_pairs, s.num_turns
    p_format = 1.0 if pairs <= 0 or turns <= 0 else min(1.0, (pairs - 1) / turns)
    return p_err, p_format


def penalty(s: TraceStats, *, error_ratio: bool = True, answer_format: bool = True) -> float:
    """p_total: the sum of the enabled penalty terms."""
    p_err, p_format = penalty_terms(s)
    return (p_err if error_ratio else 0.0) + (p_format if answer_format else 0.0)


def all_rewards_equal(group: Sequence[TraceStats]) -> bool:
    first = group[0].reward
    return all(math.isclose(s.reward, first, rel_tol=1e-5, abs_tol=1e-8) for s in group)


def downsample(
    group: Sequence[TraceStats],
    cfg: DownSamplingSettings,
    rng: random.Random | None = None,
    *,
    penalties: Sequence[float] | None = None,
) -> list[int]:
    """Indices of ``group`` to keep, ascending; ``[]`` when the group is dropped.

    ``rng`` is required for ``selection="paper"`` (seed it from the run's seed); ``penalties``
    (one per trace, as :func:`penalty` with the config's flags) saves recomputing them.
    """
    n, g = len(group), cfg.down_sample_to_n
    if n == 0 or (cfg.reject_equal_reward and all_rewards_equal(group)) or n < g:
        return []
    if n == g:
        return list(range(n))
    positives = [i for i, s in enumerate(group) if s.reward > 0]
    negatives = [i for i, s in enumerate(group) if s.reward <= 0]
    counts = _kept_counts(len(positives), len(negatives), n, cfg)
    if counts is None:  # both sides under their minimum: the released code keeps everything
        return list(range(n))
    k_pos, k_neg = counts
    if penalties is None:
        flags = {"error_ratio": cfg.roc_error_ratio, "answer_format": cfg.roc_answer_format}
        pos_penalties = [penalty(group[i], **flags) for i in positives]
    else:
        pos_penalties = [penalties[i] for i in positives]
    if cfg.selection == "reference":
        ranked = sorted(range(len(positives)), key=pos_penalties.__getitem__)  # stable
        kept = [positives[j] for j in ranked[:k_pos]] + negatives[:k_neg]
    else:
        if rng is None:
            raise ValueError("selection='paper' needs a seeded random.Random")
        weights = [1.0 / (p + cfg.penalty_epsilon) for p in pos_penalties]
        chosen = _weighted_sample_without_replacement(weights, k_pos, rng)
        kept = [positives[j] for j in chosen] + rng.sample(negatives, k_neg)
    return sorted(kept)


def _kept_counts(
    num_pos: int, num_neg: int, n: int, cfg: DownSamplingSettings
) -> tuple[int, int] | None:
    """(k_pos, k_neg) by the released code's rules, or None to keep the whole group."""
    g = cfg.down_sample_to_n
    min_neg, min_pos = cfg.min_zero_reward_trace_num, cfg.min_non_zero_reward_trace_num
    k_neg = round(num_neg * g / n)  # round() is round-half-even, as in the released code
    k_pos = round(num_pos * g / n)
    if k_neg < min_neg and k_pos < min_pos:
        return None
    if k_neg <= min(min_neg, num_neg):
        k_neg = min(min_neg, num_neg)
        k_pos = g - k_neg
    if k_pos <= min(min_pos, num_pos):
        k_pos = min(min_pos, num_pos)
        k_neg = g - k_pos
    # Where the released code would fail its `len(choices) == G` assertion (only possible for
    # N > 2G), move the shortfall to the other side instead.
    if k_pos > num_pos:
        k_pos, k_neg = num_pos, g - num_pos
    elif k_neg > num_neg:
        k_pos, k_neg = g - num_neg, num_neg
    return k_pos, k_neg


def _weighted_sample_without_replacement(
    weights: Sequence[float], k: int, rng: random.Random
) -> list[int]:
    """k distinct indices, drawn one after another with probability proportional to weight.

    Efraimidis-Spirakis: the k largest keys u ** (1 / w), u ~ U(0, 1), have exactly the
    distribution of successive weighted draws without replacement.
    """
    keyed = sorted(
        ((rng.random() ** (1.0 / w), j) for j, w in enumerate(weights)),
        reverse=True,
    )
    return [j for _, j in keyed[:k]]


@dataclass
class DownsampleReport:
    """Kept indices per group and the metrics the released code logs (same names)."""

    kept: list[list[int]]
    metrics: dict[str, float]


def downsample_batch(
    groups: Sequence[Sequence[TraceStats]],
    cfg: DownSamplingSettings,
    rng: random.Random | None = None,
) -> DownsampleReport:
    """:func:`downsample` for every prompt group of a step, with batch metrics.

    Penalties and metrics are computed for all traces at once (numpy); only the per-group
    selection loops in Python. Same results as calling :func:`downsample` group by group.
    """
    fields = np.array(
        list(map(_FIELDS, itertools.chain.from_iterable(groups))), dtype=np.float64
    ).reshape(-1, 5)
    reward, calls, errors, pairs, turns = fields.T
    p_err = np.where(calls > 0, errors / np.maximum(calls, 1), 0.5)
    no_answer = (pairs <= 0) | (turns <= 0)
    p_format = np.where(no_answer, 1.0, np.minimum(1.0, (pairs - 1) / np.maximum(turns, 1)))
    pen = p_err * cfg.roc_error_ratio + p_format * cfg.roc_answer_format
    pen_list = pen.tolist()
    kept: list[list[int]] = []
    num_equal = num_equal_zero = start = 0
    for group in groups:
        end = start + len(group)
        kept.append(downsample(group, cfg, rng, penalties=pen_list[start:end]))
        if group and all_rewards_equal(group):
            num_equal += 1
            num_equal_zero += group[0].reward <= 0
        start = end
    n = max(len(reward), 1)
    total_calls = float(calls.sum())
    metrics: dict[str, float] = {
        "reject_equal_reward/solve_equal_total": num_equal,
        "reject_equal_reward/solve_equal_zeros": num_equal_zero,
        "reject_equal_reward/solve_equal_non_all_zeros": num_equal - num_equal_zero,
        "reject_equal_reward/solve_non_equal_total": len(groups) - num_equal,
        "reject_equal_reward/solve_equal_total_ratio": num_equal / max(len(groups), 1),
        "roc/groups_kept": sum(1 for k in kept if k),
        "roc/traces_kept": sum(len(k) for k in kept),
        "roc/penalty_mean": float(pen.sum()) / n,
        "roc_error_ratio/global_err_ratio": float(errors.sum()) / total_calls
        if total_calls
        else 0.0,
        "roc_error_ratio/penalty_weight": float(p_err.sum()) / n,
        "roc_answer_format/answer_per_rollout_mean": float(pairs.sum()) / n,
        "roc_answer_format/zero_answer_count": int((pairs == 0).sum()),
        "roc_answer_format/one_answer_count": int((pairs == 1).sum()),
        "roc_answer_format/gt_one_answer_count": int((pairs > 1).sum()),
    }
    return DownsampleReport(kept=kept, metrics=metrics)


_FIELDS = operator.attrgetter(
    "reward", "num_tool_calls", "num_tool_errors", "num_answer_pairs", "num_turns"
)
