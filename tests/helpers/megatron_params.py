"""What the megatron parity and checkpoint tests and their torchrun workers share (importing
this does not patch megatron-core for the CPU, as importing the worker does)."""

from __future__ import annotations

from rstar2.config import OptimConfig

AGGREGATIONS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")
PARITY_OPTIM = OptimConfig(lr=1e-3, warmup_steps=0, weight_decay=0.0)
MICRO_BATCH_TOKENS = 96  # several micro-batches per step
# warm-up and weight decay on, so the checkpoint must carry the schedule's position
CHECKPOINT_OPTIM = OptimConfig(lr=1e-3, warmup_steps=3, weight_decay=0.1)
