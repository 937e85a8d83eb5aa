from __future__ import annotations

import math

import pytest
import torch

from rstar2.algo.advantage import grpo_advantages
from rstar2.algo.loss import LossSettings, aggregate, policy_loss


def scalar_token_loss(logp: float, old: float, adv: float, s: LossSettings) -> float:
    ratio = math.exp(logp - old)
    clipped = max(-adv * ratio, -adv * min(max(ratio, 1 - s.clip_ratio_low), 1 + s.clip_ratio_high))
    if adv < 0:
        clipped = min(clipped, -adv * s.dual_clip_c)
    return clipped


def test_advantages_match_a_scalar_reference():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.5, 0.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 2])
    adv = grpo_advantages(rewards, groups)
    g0 = [1.0, 0.0, 0.0, 1.0]
    mean0 = sum(g0) / 4
    std0 = math.sqrt(sum((r - mean0) ** 2 for r in g0) / 3)  # unbiased
    assert adv[:4].tolist() == pytest.approx([(r - mean0) / (std0 + 1e-6) for r in g0], rel=1e-5)
    std1 = math.sqrt(((1 - 0.75) ** 2 + (0.5 - 0.75) ** 2) / 1)
    assert adv[4].item() == pytest.approx(0.25 / (std1 + 1e-6), rel=1e-5)
    assert adv[6].item() == 0.0  # a group of one has no signal
    centred = grpo_advantages(rewards, groups, norm_by_std=False)
    assert centred[:4].tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5])


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_loss_value_and_gradient_match_a_scalar_reference(mode):
    torch.manual_seed(0)
    s = LossSettings(loss_agg_mode=mode)
    old = torch.randn(3, 5, dtype=torch.float64) * 0.1 - 1
    logp = (old + torch.randn(3, 5, dtype=torch.float64) * 0.6).requires_grad_(True)
    adv = torch.tensor([[1.5], [-2.0], [0.3]], dtype=torch.float64).expand(3, 5).contiguous()
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 1, 1, 1, 0]], dtype=torch.float64)
    loss, _ = policy_loss(logp, old, adv, mask, s)
    loss.backward()

    # scalar reference, and its gradient by central differences
    def ref(values: list[list[float]]) -> float:
        per_tok = [
            [
                scalar_token_loss(values[b][t], old[b, t].item(), adv[b, t].item(), s)
                for t in range(5)
            ]
            for b in range(3)
        ]
        m = mask.tolist()
        if mode == "token-mean":
            return sum(per_tok[b][t] * m[b][t] for b in range(3) for t in range(5)) / sum(
                map(sum, m)
            )
        seq = [sum(per_tok[b][t] * m[b][t] for t in range(5)) for b in range(3)]
        if mode == "seq-mean-token-mean":
            seq = [seq[b] / sum(m[b]) for b in range(3)]
        return sum(seq) / 3

    values = logp.detach().tolist()
    assert loss.item() == pytest.approx(ref(values), rel=1e-9)
    h = 1e-6
    for b in range(3):
        for t in range(5):
            up = [row[:] for row in values]
            down = [row[:] for row in values]
            up[b][t] += h
            down[b][t] -= h
            numeric = (ref(up) - ref(down)) / (2 * h)
            assert logp.grad[b, t].item() == pytest.approx(numeric, abs=1e-6)


def test_clip_fractions_and_dual_clip():
    s = LossSettings()
    old = torch.zeros(1, 6)
    # ratios: 0.5 (A<0, low-clipped), 1.5 (A>0, high-clipped), 5 (A<0, dual-clipped), 1.0 x3
    logp = torch.log(torch.tensor([[0.5, 1.5, 5.0, 1.0, 1.0, 1.0]]))
    adv = torch.tensor([[-1.0, 1.0, -1.0, 1.0, -1.0, 0.0]])
    loss, m = policy_loss(logp, old, adv, torch.ones(1, 6), s)
    assert m["clip_frac_low"] == pytest.approx(1 / 6)
    assert m["clip_frac_high"] == pytest.approx(1 / 6)
    assert m["clip_frac_dual"] == pytest.approx(1 / 6)
    # per token: 0.8 (max(0.5,0.8)), -1.28, 3 (dual bound: min(5, 3)), -1, 1, 0
    assert loss.item() == pytest.approx((0.8 - 1.28 + 3.0 - 1.0 + 1.0 + 0.0) / 6, rel=1e-6)


def test_kl_and_entropy_terms_are_off_by_default_and_add_when_set():
    logp = torch.full((1, 4), -1.0)
    adv = torch.zeros(1, 4)
    mask = torch.ones(1, 4)
    ent = torch.full((1, 4), 2.0)
    loss, m = policy_loss(logp, logp, adv, mask, ref_logprobs=logp - 0.5, entropy=ent)
    assert loss.item() == 0.0 and "kl" not in m and m["entropy"] == 2.0
    s = LossSettings(kl_coef=0.1, entropy_coef=0.01)
    loss, m = policy_loss(logp, logp, adv, mask, s, ref_logprobs=logp - 0.5, entropy=ent)
    k3 = math.exp(-0.5) + 0.5 - 1
    assert m["kl"] == pytest.approx(k3, rel=1e-5)
    assert loss.item() == pytest.approx(0.1 * k3 - 0.01 * 2.0, rel=1e-5)


def test_aggregate_ignores_masked_tokens():
    values = torch.tensor([[1.0, 100.0], [3.0, 5.0]])
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    assert aggregate(values, mask, "token-mean").item() == pytest.approx(3.0)
    assert aggregate(values, mask, "seq-mean-token-sum").item() == pytest.approx(4.5)
    assert aggregate(values, mask, "seq-mean-token-mean").item() == pytest.approx(2.5)
