"""Sequence packing: many sequences in one row, each with its own position ids (pure torch).

transformers (>= 4.53) recognises packed rows from position ids that restart at 0 and keeps
attention inside each sequence, so no padding is computed and no cross-sequence attention
happens. A sequence longer than the token budget gets a micro-batch of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rstar2.algo.loss import LossSettings, policy_loss
from rstar2.learner.protocol import TrainSequence


@dataclass
class MicroBatch:
    """Sequences ``indices`` of the batch, packed: every tensor is ``[1, tokens]``.

    ``targets[t]`` is the token that position ``t`` predicts (the next one in its sequence);
    ``valid[t]`` is False on each sequence's last position, which predicts nothing. ``loss_mask``,
    ``old_logprobs`` and ``advantages`` are aligned with ``targets``.
    """

    indices: list[int]
    lengths: list[int]
    input_ids: torch.Tensor
    position_ids: torch.Tensor
    targets: torch.Tensor
    valid: torch.Tensor
    loss_mask: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[1])

    def to(self, device: torch.device | str) -> MicroBatch:
        fields: dict[str, Any] = {
            k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in vars(self).items()
        }
        return MicroBatch(**fields)


def plan(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Group sequence indices, in order, into micro-batches of at most ``max_tokens`` tokens."""
    if max_tokens < 1:
        raise ValueError("max_tokens must be positive")
    groups: list[list[int]] = []
    current: list[int] = []
    used = 0
    for i, n in enumerate(lengths):
        if current and used + n > max_tokens:
            groups.append(current)
            current, used = [], 0
        current.append(i)
        used += n
    if current:
        groups.append(current)
    return groups


def pack(batch: Sequence[TrainSequence], indices: list[int]) -> MicroBatch:
    seqs = [batch[i] for i in indices]
    ids: list[int] = []
    pos: list[int] = []
    tgt: list[int] = []
    valid: list[bool] = []
    mask: list[int] = []
    old: list[float] = []
    adv: list[float] = []
    for s in seqs:
        n = len(s.token_ids)
        ids.extend(s.token_ids)
        pos.extend(range(n))
        tgt.extend([*s.token_ids[1:], 0])
        valid.extend([True] * (n - 1) + [False])
        mask.extend([*s.loss_mask[1:], 0])
        old.extend([*s.old_logprobs[1:], 0.0])
        adv.extend([s.advantage] * n)
    row = lambda values, dtype: torch.tensor([values], dtype=dtype)  # noqa: E731
    return MicroBatch(
        indices=list(indices),
        lengths=[len(s.token_ids) for s in seqs],
        input_ids=row(ids, torch.long),
        position_ids=row(pos, torch.long),
        targets=row(tgt, torch.long),
        valid=row(valid, torch.bool),
        loss_mask=row(mask, torch.float32),
        old_logprobs=row(old, torch.float32),
        advantages=row(adv, torch.float32),
    )


def unpack(values: torch.Tensor, lengths: Sequence[int]) -> list[list[float]]:
    """Per-position values of a packed row (``[tokens]``, aligned with ``targets``) back to each
    sequence's log-probs aligned with its ``token_ids`` (entry 0 is 0.0)."""
    out: list[list[float]] = []
    start = 0
    flat = values.detach().float().cpu().tolist()
    for n in lengths:
        out.append([0.0, *flat[start : start + n - 1]])
        start += n
    return out


def micro_batch_loss(
    mb: MicroBatch, logprobs: torch.Tensor, settings: LossSettings
) -> tuple[torch.Tensor, dict[str, float]]:
    """:func:`~rstar2.algo.loss.policy_loss` of one packed micro-batch, given the log-probs of
    its targets (``[1, tokens]``): over the packed row for ``token-mean``, over one zero-padded
    row per sequence for the per-sequence aggregations."""
    lp, old, adv, mask = logprobs.reshape(1, -1), mb.old_logprobs, mb.advantages, mb.loss_mask
    if settings.loss_agg_mode != "token-mean":  # rows = sequences
        lp, old, adv, mask = (
            _per_sequence(t.reshape(-1), mb.lengths) for t in (lp, old, adv, mask)
        )
    return policy_loss(lp, old, adv, mask, settings)


def _per_sequence(flat: torch.Tensor, lengths: Sequence[int]) -> torch.Tensor:
    """A packed row back to one zero-padded row per sequence (``[sequences, longest]``)."""
    return torch.nn.utils.rnn.pad_sequence(list(torch.split(flat, list(lengths))), batch_first=True)


@dataclass(frozen=True)
class BatchTotals:
    """What a micro-batch's share of the whole batch is measured against."""

    sequences: int
    loss_tokens: float

    @classmethod
    def of(cls, batch: Sequence[TrainSequence]) -> BatchTotals:
        return cls(len(batch), float(sum(sum(x.loss_mask) for x in batch)))


def micro_batch_objective(
    mb: MicroBatch, logprobs: torch.Tensor, settings: LossSettings, totals: BatchTotals
) -> tuple[torch.Tensor, dict[str, float]]:
    """The micro-batch's part of the whole batch's loss and metrics: the loss (and ``pg_loss``)
    weighted by its share of the sequences (per-sequence aggregations) or of the loss tokens
    (``token-mean``); the token-level metrics (clip fractions, ``approx_kl``) by its share of
    the loss tokens. Summed over micro-batches and ranks they are the whole batch's values,
    whatever the split."""
    value, metrics = micro_batch_loss(mb, logprobs, settings)
    token_share = float(mb.loss_mask.sum()) / max(totals.loss_tokens, 1.0)
    loss_share = token_share
    if settings.loss_agg_mode != "token-mean":
        loss_share = len(mb.indices) / max(totals.sequences, 1)
    weighted = {k: v * (loss_share if k == "pg_loss" else token_share) for k, v in metrics.items()}
    return value * loss_share, weighted
