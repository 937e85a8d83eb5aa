"""Weight sync through this process: the learner's buckets to every engine's weight sink.

One sync is three phases on every engine (:class:`~rstar2.rollout.engine.Engine`'s weight sink):
``begin_weight_update``, then each bucket (HF names, at most ``bucket_bytes`` unless one tensor
is larger) to all engines before the next is gathered, so the extra memory on the learner side
is one bucket, then ``finish_weight_update`` (prefix caches dropped). Engines may be in-process
(:class:`~rstar2.rollout.vllm_engine.VLLMEngine`: a bucket is staged in /dev/shm and loaded by
the workers) or in Ray actors (:class:`~rstar2.rollout.ray_engine.RayEngine`: through Ray's
object store). A Ray learner group into Ray engines goes around this process instead
(:mod:`rstar2.sync.group`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace

from rstar2.learner.protocol import Learner
from rstar2.rollout.engine import Engine, EngineDown
from rstar2.sync import SyncStats, check_bucket_bytes

log = logging.getLogger(__name__)


class BucketSync:
    """:class:`~rstar2.sync.WeightSync` through the caller's process."""

    def __init__(self, learner: Learner, engines: Sequence[Engine], bucket_bytes: int) -> None:
        check_bucket_bytes(bucket_bytes)
        self.learner, self.engines, self.bucket_bytes = learner, list(engines), bucket_bytes

    async def before_learn(self) -> None:
        pass

    replaces_engines = True

    async def sync(self, skip: frozenset[int] = frozenset()) -> SyncStats:
        slots = [i for i in range(len(self.engines)) if i not in skip]
        stats = await sync_weights(
            self.learner, [self.engines[i] for i in slots], self.bucket_bytes
        )
        return replace(stats, failed=tuple(slots[i] for i in stats.failed))

    def replace_engine(self, index: int, engine: Engine) -> None:
        self.engines[index] = engine

    async def aclose(self) -> None:
        pass


async def sync_weights(learner: Learner, engines: Sequence[Engine], bucket_bytes: int) -> SyncStats:
    """Send ``learner.named_weights(bucket_bytes)`` to every engine, bucket by bucket. An engine
    that raises EngineDown is dropped for the rest of the sync and named in the stats'
    ``failed`` (indices into ``engines``); every other error propagates."""
    check_bucket_bytes(bucket_bytes)
    start = time.perf_counter()
    buckets = tensors = total = largest = 0
    live = dict(enumerate(engines))
    failed: list[int] = []

    async def each(call: Callable[[Engine], Awaitable[None]]) -> None:
        slots = list(live)
        results = await asyncio.gather(*(call(live[i]) for i in slots), return_exceptions=True)
        for i, result in zip(slots, results, strict=True):
            if isinstance(result, EngineDown):
                log.warning("rollout engine died during the weight sync: %s", result)
                failed.append(i)
                del live[i]
            elif isinstance(result, BaseException):
                raise result

    await each(lambda engine: engine.begin_weight_update())
    for bucket in learner.named_weights(bucket_bytes):
        if not bucket:  # a rank other than 0: nothing to send
            continue
        size = sum(t.numel() * t.element_size() for _, t in bucket)
        await each(lambda engine, bucket=bucket: engine.update_weights(bucket))  # type: ignore[misc]
        buckets += 1
        tensors += len(bucket)
        total += size
        largest = max(largest, size)
    await each(lambda engine: engine.finish_weight_update())
    seconds = time.perf_counter() - start
    return SyncStats(
        buckets, tensors, total, seconds, largest, bucket_bytes, "buckets", tuple(sorted(failed))
    )
