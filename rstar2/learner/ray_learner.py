"""The learner as a group of Ray actors, one per rank, so the trainer can place it anywhere.

``RayLearner.create(settings)`` reserves a placement group of ``settings.learner.num_ranks``
bundles (one GPU each on GPU nodes), starts one :class:`~rstar2.learner.ray_rank.LearnerActor`
per bundle, joins them in one torch.distributed group (NCCL on GPUs, RCCL on ROCm, gloo on CPU;
rank 0's node and a free port there are the rendezvous), and returns a client with the
:class:`Learner` surface the trainer and the weight sync (:mod:`rstar2.sync`) use. Every call
goes to every rank with the same arguments (the batch is put in the object store once); each
rank takes its data-parallel share, and rank 0's answer is returned: what one process gives on
the whole batch. ``save`` / ``load`` paths are on the actors' nodes (a shared file system across
nodes). Calls block until every rank answers; each actor serves one call at a time, in order.

``named_weights`` streams the buckets from every rank (Ray streaming generators run ahead of the
consumer, so the ranks' collectives proceed together); rank 0's hold the tensors, moved to CPU
there, and pass through the caller's process on their way to the engines.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from rstar2.learner.build import LearnerSettings
from rstar2.learner.protocol import TrainSequence
from rstar2.learner.ray_rank import LearnerActor, RankSpec


class RayLearner:
    """Client of a group of :class:`LearnerActor` ranks; see the module docstring."""

    def __init__(self, actors: list[Any], group: Any, step: int) -> None:
        self._actors = actors
        self._group = group
        self._step = step

    @classmethod
    def create(
        cls,
        settings: LearnerSettings,
        *,
        num_cpus: float = 1,
        num_gpus: float = 0,
        num_threads: int | None = None,
        ready_timeout_s: float = 300.0,
        share_gpus_with: float = 0,
        resources: dict[str, float] | None = None,
    ) -> RayLearner:
        """Start the ranks (needs a running ``ray.init()``); ``num_cpus`` / ``num_gpus`` per
        rank; ``num_threads``: torch threads per rank, default this process's. ConfigError when
        the cluster cannot place the ranks within ``ready_timeout_s``.

        ``share_gpus_with`` (colocation): each rank's bundle is one whole GPU plus that many
        more CPUs for the colocated engine that will use that GPU too (see
        :meth:`gpus`: an engine is pinned to its ranks' GPUs, not given Ray's).
        ``resources``: custom Ray resources each rank asks for too (a launched job's role)."""
        import ray
        import torch
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from rstar2.config import ConfigError

        world = settings.learner.num_ranks
        bundle = {k: v for k, v in (("CPU", num_cpus), ("GPU", num_gpus)) if v}
        if share_gpus_with:
            bundle = {"CPU": num_cpus + share_gpus_with, "GPU": 1}
            num_gpus = 1
        bundle |= resources or {}
        group = None
        if bundle:  # ranks that ask for nothing (CPU learners sharing cores) need no reservation
            group = ray.util.placement_group([bundle] * world, strategy="PACK")
            try:
                ray.get(group.ready(), timeout=ready_timeout_s)
            except ray.exceptions.GetTimeoutError:
                ray.util.remove_placement_group(group)
                raise ConfigError(
                    "learner.num_ranks",
                    f"Ray could not place {world} learner ranks of {bundle} in "
                    f"{ready_timeout_s:.0f} s: the cluster lacks the resources",
                ) from None
        remote: Any = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus, resources=resources or {})(
            LearnerActor
        )
        actors = [
            remote.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    group, placement_group_bundle_index=r
                )
                if group is not None
                else None
            ).remote()
            for r in range(world)
        ]
        client = cls(actors, group, 0)
        try:
            address = ray.get(actors[0].rendezvous.remote()) if world > 1 else ""
            backend = "nccl" if num_gpus else "gloo"
            threads = num_threads if num_threads is not None else torch.get_num_threads()
            starts = [
                a.start.remote(settings, threads, RankSpec(r, world, address, backend))
                for r, a in enumerate(actors)
            ]
            try:
                ray.get(starts)
            except ray.exceptions.RayTaskError as e:  # a bad layout, say: the user's error
                if isinstance(e.cause, ConfigError):
                    raise e.cause from None
                raise
            client._step = int(client._call("step"))
        except BaseException:
            client.close()
            raise
        return client

    async def gpus(self) -> list[tuple[str, str]]:
        """Each rank's (node id, GPU id on that node: what ``CUDA_VISIBLE_DEVICES`` names)."""
        found = await asyncio.gather(*(a.gpu_id.remote() for a in self._actors))
        return [(str(node), str(gpu)) for node, gpu in found]

    def node_ips(self) -> list[str]:
        """Each rank's node address."""
        import ray

        return [str(ip) for ip in ray.get([a.node_ip.remote() for a in self._actors])]

    async def offload(self) -> None:
        """Every rank's parameters and optimizer state to host memory (torch backend)."""
        await asyncio.gather(*(a.offload.remote() for a in self._actors))

    async def empty_cache(self) -> None:
        """Every rank hands its allocator's cached GPU blocks back (colocated engines are about
        to take the memory)."""
        await asyncio.gather(*(a.empty_cache.remote() for a in self._actors))

    async def reload(self) -> None:
        """Every rank's state back on its GPU."""
        await asyncio.gather(*(a.reload.remote() for a in self._actors))

    @property
    def placement_group(self) -> Any:
        """The ranks' placement group (None when they reserved nothing)."""
        return self._group

    @property
    def num_ranks(self) -> int:
        return len(self._actors)

    def _call(self, method: str, *args: Any) -> Any:
        """``method`` on every rank with the same arguments; rank 0's answer."""
        import ray

        refs = [getattr(a, method).remote(*args) for a in self._actors]
        return ray.get(refs)[0]

    def _batch(self, batch: Sequence[TrainSequence]) -> Any:
        import ray

        return ray.put(list(batch))  # once for every rank

    @property
    def step(self) -> int:
        return self._step

    @property
    def device(self) -> str:
        return str(self._call("device"))

    def reset_optimizer(self) -> None:
        self._call("reset_optimizer")

    def compute_logprobs(self, batch: Sequence[TrainSequence]) -> list[list[float]]:
        logprobs: list[list[float]] = self._call("compute_logprobs", self._batch(batch))
        return logprobs

    def train_step(self, batch: Sequence[TrainSequence]) -> dict[str, float]:
        metrics: dict[str, float] = self._call("train_step", self._batch(batch))
        self._step = int(metrics["step"])  # the learner reports its step after the update
        return metrics

    def sft_step(self, batch: Sequence[TrainSequence]) -> dict[str, float]:
        metrics: dict[str, float] = self._call("sft_step", self._batch(batch))
        self._step = int(metrics.get("step", self._step + 1))
        return metrics

    def save(self, path: str | Path) -> None:
        self._call("save", str(path))

    def load(self, path: str | Path) -> None:
        self._step = int(self._call("load", str(path)))

    def export_hf(self, folder: str | Path) -> None:
        self._call("export_hf", str(folder))

    def named_weights(
        self, bucket_bytes: int, dtype: Any = None, *, every_rank: bool = False
    ) -> Iterator[list[tuple[str, Any]]]:
        """Rank 0's buckets, through the object store (``every_rank`` has no meaning for the
        group's caller, which is one process)."""
        import ray

        streams = [
            a.named_weights.options(num_returns="streaming").remote(bucket_bytes, dtype)
            for a in self._actors
        ]
        for ref in streams[0]:
            yield ray.get(ref)
        for stream in streams[1:]:  # empty buckets; their ranks took part in the gathers
            for ref in stream:
                ray.get(ref)

    async def rendezvous(self) -> str:
        """``tcp://HOST:PORT``: a free port on rank 0's node."""
        address: str = await self._actors[0].rendezvous.remote()
        return address

    async def weight_metadata(self, bucket_bytes: int, dtype: str | None = None) -> list[Any]:
        """(name, dtype, shape, bucket) of every exported tensor cast to ``dtype`` (one gather
        pass)."""
        refs = [a.weight_metadata.remote(bucket_bytes, dtype) for a in self._actors]
        return list((await asyncio.gather(*refs))[0])

    async def open_nccl(self, address: str, world_size: int) -> None:
        """Rank 0 joins the NCCL transfer group with the engine workers."""
        await asyncio.gather(
            *(a.open_nccl.remote(r, address, world_size) for r, a in enumerate(self._actors))
        )

    async def nccl_send(
        self, meta: list[Any], bucket_bytes: int, num_buffers: int, dtype: str | None = None
    ) -> None:
        await asyncio.gather(
            *(a.nccl_send.remote(meta, bucket_bytes, num_buffers, dtype) for a in self._actors)
        )

    async def open_ipc(
        self, engines: list[Any], meta: list[Any], bucket_bytes: int, dtype: str | None = None
    ) -> None:
        """Every rank builds vLLM's IPC trainer engine (rank 0 inits the engines)."""
        await asyncio.gather(
            *(
                a.open_ipc.remote(r, engines, meta, bucket_bytes, dtype)
                for r, a in enumerate(self._actors)
            )
        )

    async def ipc_send(self) -> None:
        await asyncio.gather(*(a.ipc_send.remote() for a in self._actors))

    async def send_weights(
        self, targets: list[Any], bucket_bytes: int, call_timeout_s: float | None = None
    ) -> dict[str, Any]:
        """Rank 0 sends the weights straight to the engine actors ``targets`` (see
        :mod:`rstar2.sync.group`); what it sent, and in ``failed`` the indices of the targets
        that were lost on the way (see :meth:`LearnerActor.send_weights`)."""
        refs = [a.send_weights.remote(targets, bucket_bytes, call_timeout_s) for a in self._actors]
        sent: list[dict[str, Any]] = list(await asyncio.gather(*refs))
        return sent[0]

    def close(self) -> None:
        """Stop the ranks and free their placement group (their state is gone; save first).
        Idempotent."""
        import ray

        for actor in self._actors:
            ray.kill(actor)
        self._actors = []
        if self._group is not None:
            ray.util.remove_placement_group(self._group)
            self._group = None
