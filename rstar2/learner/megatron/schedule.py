"""Micro-batches through megatron's pipeline schedule (1F1B under PP): each one as a THD
packed row with its rope tables, log-probs by vocab-parallel cross entropy on the last stage,
and the objective's loss and metrics there. Used by :class:`~.learner.MegatronLearner`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from rstar2.learner.megatron.convert import Shard
from rstar2.learner.megatron.model import ModelSpec
from rstar2.learner.megatron.rope import rope_tables
from rstar2.learner.packing import MicroBatch

Objective = Callable[[MicroBatch, torch.Tensor], tuple[torch.Tensor, dict[str, float]]]
"""A micro-batch's share of the step's loss and its metrics, from its target log-probs."""


@dataclass(frozen=True, eq=False)
class Pipeline:
    """This rank's model chunk and what its forward steps need."""

    model: Any  # the DDP-wrapped GPTModel chunk (megatron's DistributedDataParallel)
    spec: ModelSpec
    shard: Shard
    inv_freq: torch.Tensor  # rope's inverse frequencies, on ``device``
    device: torch.device

    def run(
        self,
        mbs: list[MicroBatch],
        *,
        forward_only: bool,
        objective: Objective | None,
    ) -> list[Any]:
        """Every micro-batch through the pipeline; the last stage's per-micro-batch outputs:
        the objective's metrics, or the log-probs when there is no objective."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        from rstar2.learner.megatron.attention import PackedRows

        n = len(mbs)
        it = iter(mbs)

        def forward_step(_data: Any, model: Any) -> tuple[torch.Tensor, Any]:
            mb = next(it)
            ids, positions, lengths = self.padded(mb)
            bounds = [0, *torch.tensor(lengths).cumsum(0).tolist()]
            cu = torch.tensor(bounds, dtype=torch.int32, device=self.device)
            longest = max(lengths)
            cos, sin = rope_tables(positions[0], self.inv_freq, self.spec.params_dtype)
            packed = PackedRows(
                qkv_format="thd",
                cu_seqlens_q=cu,
                cu_seqlens_kv=cu,
                max_seqlen_q=longest,
                max_seqlen_kv=longest,
                bounds=tuple(bounds),
                rope_cos=cos,
                rope_sin=sin,
            )
            out = model(
                input_ids=ids, position_ids=positions, attention_mask=None, packed_seq_params=packed
            )

            def reduce(logits: torch.Tensor) -> tuple[torch.Tensor, Any]:
                logits = logits[:, : mb.num_tokens]  # without the padding
                lp = self.token_logprobs(logits, mb.targets) * mb.valid  # [1, T]
                if objective is None:
                    return lp.sum() * 0, lp[0].detach()
                value, metrics = objective(mb, lp)
                return value * n, metrics  # the schedule divides by the micro-batch count

            return out, reduce

        run = get_forward_backward_func()
        return list(
            run(
                forward_step_func=forward_step,
                data_iterator=iter(range(n)),
                model=[self.model],
                num_microbatches=n,
                seq_length=max(mb.num_tokens for mb in mbs),
                micro_batch_size=1,
                forward_only=forward_only,
            )
        )

    def padded(self, mb: MicroBatch) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """Token ids, positions and sequence lengths of ``mb``, with a padding sequence at the
        end where sequence parallelism needs the row to divide by TP (it attends only to
        itself, and its outputs are dropped)."""
        tp = self.spec.layout.tensor_parallel
        pad = -mb.num_tokens % tp if self.spec.layout.sequence_parallel else 0
        if not pad:
            return mb.input_ids, mb.position_ids, mb.lengths
        filler = torch.arange(pad, device=mb.input_ids.device)[None]
        ids = torch.cat([mb.input_ids, torch.zeros_like(filler)], dim=1)
        return ids, torch.cat([mb.position_ids, filler], dim=1), [*mb.lengths, pad]

    def token_logprobs(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """log p(target) from this rank's vocabulary slice of ``logits`` [1, T, V/TP], by
        vocab-parallel cross entropy (the vocabulary is never gathered). The padding rows of
        the vocabulary are masked out, so the distribution is the HF model's."""
        from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

        logits = logits.float()
        width = logits.shape[-1]
        start = self.shard.tp_rank * width
        if start + width > self.spec.dims.vocab_size:
            padding = torch.arange(start, start + width, device=logits.device)
            logits = logits.masked_fill(padding >= self.spec.dims.vocab_size, float("-inf"))
        nll = vocab_parallel_cross_entropy(logits.transpose(0, 1), targets.transpose(0, 1))
        return -nll.transpose(0, 1)
