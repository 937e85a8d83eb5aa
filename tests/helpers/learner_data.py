"""A tiny model and random packed-training batches for the learner tests."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch

from rstar2.learner.protocol import TrainSequence
from rstar2.tiny import build_tiny_model


def tiny_model(out_dir: Path) -> Path:
    build_tiny_model(out_dir, ["the quick brown fox jumps over the lazy dog"] * 20, hidden_size=64)
    return out_dir


def random_batch(n: int, seed: int, vocab: int = 200) -> list[TrainSequence]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = rng.randint(8, 48)
        ids = [rng.randint(5, vocab) for _ in range(length)]
        prompt = rng.randint(2, length - 2)
        mask = [0] * prompt + [1] * (length - prompt)
        old = [0.0] + [-rng.uniform(3.0, 6.0) if m else 0.0 for m in mask[1:]]
        out.append(TrainSequence(ids, mask, old, advantage=rng.choice([-1.0, 0.5, 1.0])))
    return out


def full_weights(learner: Any) -> dict[str, torch.Tensor]:
    """A learner's HF-named full weights (every rank must call; rank 0 gets them)."""
    return {n: t.clone() for bucket in learner.named_weights(1 << 20) for n, t in bucket}


def weights_on_this_rank(learner: Any, bucket_bytes: int) -> dict[str, Any]:
    """What vLLM's IPC sender is given on this rank of a learner group (every rank calls):
    the learner's bucket count here, and every tensor ``learner_weights(everywhere=True)``
    yields (on CPU), with rank 0's metadata handed to every rank as the Ray group does."""
    import torch.distributed as dist

    from rstar2.sync.native_sender import learner_weights, weight_metadata

    box = [weight_metadata(learner, bucket_bytes)]
    dist.broadcast_object_list(box, src=0)
    source = learner_weights(learner, box[0], bucket_bytes, everywhere=True, device="cpu")
    weights = {name: tensor.clone() for name, tensor in source}
    own = list(learner.named_weights(bucket_bytes, every_rank=True))
    # what the NCCL sender is given (rank 0 sends; the others only take part in the gathers)
    nccl = learner_weights(learner, box[0], bucket_bytes, everywhere=False, device="cpu")
    return {
        "buckets": len(list(learner.named_weights(bucket_bytes))),
        "weights": weights,
        "nccl_names": [name for name, _ in nccl],
        # this rank's gathers left it every tensor (no broadcast from rank 0 was needed)
        "held_here": all(own),
    }
