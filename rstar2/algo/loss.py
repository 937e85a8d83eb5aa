"""The GRPO-RoC policy loss: token-level PPO clip with asymmetric epsilons and dual-clip (pure).

Per token, with ratio r = exp(logp - old_logp) and advantage A:

    clipped = max(-A r, -A clamp(r, 1 - eps_low, 1 + eps_high))
    loss    = min(clipped, -A c)  if A < 0   (dual-clip bounds what one token can cost)
              clipped             otherwise

then aggregated over the tokens where ``loss_mask`` is 1: ``token-mean`` (default, the rStar2
choice), ``seq-mean-token-sum`` or ``seq-mean-token-mean``. Optional terms: ``kl_coef`` times
the low-variance KL estimate to reference log-probs, minus ``entropy_coef`` times the entropy;
both are off by default, as in rStar2. Tensors are ``[batch, tokens]``; sequences are rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

LossAgg = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"]


@dataclass(frozen=True, kw_only=True)
class LossSettings:
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.28
    dual_clip_c: float = 3.0
    loss_agg_mode: LossAgg = "token-mean"
    kl_coef: float = 0.0
    entropy_coef: float = 0.0


def aggregate(values: torch.Tensor, mask: torch.Tensor, mode: LossAgg) -> torch.Tensor:
    """Reduce per-token ``values`` over ``mask`` as ``mode`` says (empty rows count as 0)."""
    mask = mask.to(values.dtype)
    if mode == "token-mean":
        return (values * mask).sum() / mask.sum().clamp(min=1)
    per_seq = (values * mask).sum(-1)
    if mode == "seq-mean-token-mean":
        per_seq = per_seq / mask.sum(-1).clamp(min=1)
    elif mode != "seq-mean-token-sum":
        raise ValueError(f"unknown loss_agg_mode {mode!r}")
    return per_seq.mean()


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    settings: LossSettings = LossSettings(),
    *,
    ref_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The scalar loss (differentiable in ``logprobs``) and its metrics.

    ``advantages`` is per token (broadcast a sequence's advantage over its tokens). Metrics:
    ``pg_loss``, ``clip_frac_low`` / ``clip_frac_high`` (tokens whose ratio the clip bounded,
    below 1 - eps_low for A < 0, above 1 + eps_high for A > 0), ``clip_frac_dual`` (A < 0 tokens
    bounded by c), ``approx_kl`` (to the sampling policy), and ``kl`` / ``entropy`` when given.
    """
    s = settings
    mask = loss_mask.to(logprobs.dtype)
    log_ratio = (logprobs - old_logprobs).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - s.clip_ratio_low, 1.0 + s.clip_ratio_high)
    pg = torch.maximum(unclipped, clipped)
    dual = -advantages * s.dual_clip_c
    pg = torch.where(advantages < 0, torch.minimum(pg, dual), pg)
    loss = aggregate(pg, mask, s.loss_agg_mode)

    neg, pos = advantages < 0, advantages > 0
    metrics = {
        "pg_loss": float(loss.detach()),
        "clip_frac_low": _masked_mean(neg & (ratio < 1.0 - s.clip_ratio_low), mask),
        "clip_frac_high": _masked_mean(pos & (ratio > 1.0 + s.clip_ratio_high), mask),
        "clip_frac_dual": _masked_mean(neg & (ratio > s.dual_clip_c), mask),
        "approx_kl": _masked_mean(0.5 * log_ratio.detach() ** 2, mask),
    }
    if s.kl_coef > 0 and ref_logprobs is not None:
        delta = (ref_logprobs - logprobs).clamp(-20.0, 20.0)
        kl = torch.exp(delta) - delta - 1.0  # low-variance k3 estimate, >= 0
        kl_term = aggregate(kl, mask, s.loss_agg_mode)
        loss = loss + s.kl_coef * kl_term
        metrics["kl"] = float(kl_term.detach())
    if entropy is not None:
        ent = aggregate(entropy, mask, s.loss_agg_mode)
        metrics["entropy"] = float(ent.detach())
        if s.entropy_coef > 0:
            loss = loss - s.entropy_coef * ent
    return loss, metrics


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    return float((values.to(mask.dtype) * mask).sum() / mask.sum().clamp(min=1))


def settings_from_config(cfg: object) -> LossSettings:
    """LossSettings from :class:`rstar2.config.AlgorithmConfig` (read by attribute)."""
    return LossSettings(
        clip_ratio_low=getattr(cfg, "clip_ratio_low"),  # noqa: B009
        clip_ratio_high=getattr(cfg, "clip_ratio_high"),  # noqa: B009
        dual_clip_c=getattr(cfg, "dual_clip_c"),  # noqa: B009
        loss_agg_mode=getattr(cfg, "loss_agg_mode"),  # noqa: B009
        kl_coef=getattr(cfg, "kl_coef"),  # noqa: B009
        entropy_coef=getattr(cfg, "entropy_coef"),  # noqa: B009
    )
