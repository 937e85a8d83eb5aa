"""Weight sync: stream the learner's weights to every rollout engine in bounded buckets.

One sync is three phases on every engine (:class:`~rstar2.rollout.engine.Engine`'s weight sink):
``begin_weight_update``, then each bucket (HF names, at most ``bucket_bytes`` unless one tensor
is larger) to all engines before the next is gathered, so the extra memory on the learner side
is one bucket, then ``finish_weight_update`` (prefix caches dropped). Requests in flight finish
on the weights they started with. Whatever carries the bytes (a file in /dev/shm today, vLLM's
native NCCL/IPC transfer later) lives behind those three calls. Engines may be in-process
(:class:`~rstar2.rollout.vllm_engine.VLLMEngine`) or in Ray actors
(:class:`~rstar2.rollout.ray_engine.RayEngine`: buckets travel through Ray's object store). A
NCCL/RCCL broadcast group from learner rank 0 straight into engine GPUs is not implemented yet.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

from rstar2.learner.protocol import Learner
from rstar2.rollout.engine import Engine


@dataclass(frozen=True)
class SyncStats:
    buckets: int
    tensors: int
    bytes: int
    seconds: float
    largest_bucket_bytes: int


async def sync_weights(learner: Learner, engines: Sequence[Engine], bucket_bytes: int) -> SyncStats:
    """Send ``learner.named_weights(bucket_bytes)`` to every engine, bucket by bucket."""
    if bucket_bytes < 1:
        raise ValueError("bucket_bytes must be positive")
    start = time.perf_counter()
    buckets = tensors = total = largest = 0
    await asyncio.gather(*(engine.begin_weight_update() for engine in engines))
    for bucket in learner.named_weights(bucket_bytes):
        if not bucket:  # a rank other than 0: nothing to send
            continue
        size = sum(t.numel() * t.element_size() for _, t in bucket)
        await asyncio.gather(*(engine.update_weights(bucket) for engine in engines))
        buckets += 1
        tensors += len(bucket)
        total += size
        largest = max(largest, size)
    await asyncio.gather(*(engine.finish_weight_update() for engine in engines))
    return SyncStats(buckets, tensors, total, time.perf_counter() - start, largest)
