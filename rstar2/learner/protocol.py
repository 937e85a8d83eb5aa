"""The learner interface the trainer talks to, and the sequences it trains on.

A :class:`TrainSequence` is one trajectory, flattened: ``token_ids`` (prompt + response),
``loss_mask`` (1 on tokens the policy sampled, 0 on prompt, tool and template tokens),
``old_logprobs`` (the sampling log-prob of each masked token, 0.0 elsewhere) and its scalar
``advantage``. Log-probs are aligned with ``token_ids``: entry ``i`` is log p(token_ids[i] |
token_ids[:i]); entry 0 has no context and is 0.0.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True)
class TrainSequence:
    token_ids: Sequence[int]
    loss_mask: Sequence[int]
    old_logprobs: Sequence[float]
    advantage: float = 0.0

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        if n < 2:
            raise ValueError("a sequence needs at least two tokens")
        if len(self.loss_mask) != n or len(self.old_logprobs) != n:
            raise ValueError("token_ids, loss_mask and old_logprobs must have the same length")
        if self.loss_mask[0]:
            raise ValueError("the first token has no context: its loss_mask must be 0")


class Learner(Protocol):
    """What the trainer, SFT and weight sync use of a learner backend (torch, megatron, and a
    Ray learner group of either).

    A learner of several ranks (torchrun, a Ray group): every rank calls each method with the
    same arguments, the whole batch included; each rank takes its data-parallel share, and the
    result is what one process would give on the whole batch."""

    @property
    def step(self) -> int:
        """Optimizer steps taken so far."""
        ...

    def compute_logprobs(self, batch: Sequence[TrainSequence]) -> list[list[float]]:
        """Per-token log-probs of each sequence under the current weights (no gradient)."""
        ...

    def train_step(self, batch: Sequence[TrainSequence]) -> dict[str, float]:
        """One optimizer step over the whole batch (micro-batches sized by tokens, gradients
        accumulated); returns its metrics."""
        ...

    def sft_step(self, batch: Sequence[TrainSequence]) -> dict[str, float]:
        """One optimizer step of supervised learning on the tokens where ``loss_mask`` is 1."""
        ...

    def export_hf(self, folder: str | Path) -> None:
        """The full weights as an HF model folder (what engines and ``sft`` outputs load)."""
        ...

    def named_weights(
        self, bucket_bytes: int, dtype: Any = None, *, every_rank: bool = False
    ) -> Iterator[list[tuple[str, Any]]]:
        """The full weights under their HF names, in buckets of at most ``bucket_bytes`` (a
        single larger tensor is a bucket of its own), cast to ``dtype`` (a torch dtype; None:
        the learner's own). Every rank must iterate, and every rank
        gets one list per bucket, after that bucket's collectives (the ranks stay in step, so a
        caller may run its own collective per bucket); only rank 0's lists hold tensors, the
        other ranks' are empty, except with ``every_rank`` on a backend whose gathers leave
        the full tensors on every rank anyway (FSDP2): then every rank's lists hold them."""
        ...

    def reset_optimizer(self) -> None:
        """Fresh optimizer moments and LR schedule (a stage's ``reset_optimizer``); weights and
        step count stay."""
        ...

    def save(self, path: str | Path) -> None:
        """Model, optimizer, LR schedule, RNG states and step, so :meth:`load` then the next
        step equals the uninterrupted run's."""
        ...

    def load(self, path: str | Path) -> None:
        """Restore what :meth:`save` wrote (the learner's own RNG state, nobody else's)."""
        ...

    def close(self) -> None:
        """Release devices, processes and actors (idempotent; save first)."""
        ...
