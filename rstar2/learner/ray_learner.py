"""The learner as a group of Ray actors, one per rank, so the trainer can place it anywhere.

``RayLearner.create(settings)`` reserves a placement group of ``settings.learner.num_ranks``
bundles (one GPU each on GPU nodes), starts one :class:`LearnerActor` per bundle, joins them in
one torch.distributed group (NCCL on GPUs, RCCL on ROCm, gloo on CPU; rank 0's node and a free
port there are the rendezvous), and returns a client with the :class:`Learner` surface the trainer
and the weight sync (:mod:`rstar2.sync`) use. Every call goes to every rank with the same
arguments (the batch is put in the object store once); each rank takes its data-parallel share,
and rank 0's answer is returned: what one process gives on the whole batch. ``save`` / ``load``
paths are on the actors' nodes (a shared file system across nodes). Calls block until every rank
answers; each actor serves one call at a time, in order.

``named_weights`` streams the buckets from every rank (Ray streaming generators run ahead of the
consumer, so the ranks' collectives proceed together); rank 0's hold the tensors, moved to CPU
there, and pass through the caller's process on their way to the engines.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rstar2.learner.build import LearnerSettings, build_learner
from rstar2.learner.protocol import TrainSequence


@dataclass(frozen=True)
class RankSpec:
    """One rank's place in the learner group's process group."""

    rank: int
    world: int
    address: str  # rank 0's host and a free port there: tcp://HOST:PORT
    backend: str  # "nccl" (NCCL, or RCCL on ROCm builds of torch) or "gloo"


class LearnerActor:
    """The actor body (wrapped with ``ray.remote`` by :meth:`RayLearner.create`): constructed
    empty; :meth:`start` joins the group and builds the learner."""

    def rendezvous(self) -> str:
        """``tcp://HOST:PORT``: this actor's node address and a free port on it (rank 0's)."""
        import socket

        import ray

        with socket.socket() as sock:
            sock.bind(("", 0))
            port = int(sock.getsockname()[1])
        return f"tcp://{ray.util.get_node_ip_address()}:{port}"

    def start(self, settings: LearnerSettings, num_threads: int, spec: RankSpec) -> None:
        import torch
        import torch.distributed as dist

        # Ray sets OMP_NUM_THREADS from the actor's CPU request; the caller's count keeps CPU
        # results bit-equal to an in-process learner's (a reduction's order follows threads)
        torch.set_num_threads(num_threads)
        if spec.world > 1:
            host, port = spec.address.removeprefix("tcp://").rsplit(":", 1)
            # what torchrun sets: the backends read LOCAL_RANK (one visible GPU per actor)
            os.environ.update(
                RANK=str(spec.rank), WORLD_SIZE=str(spec.world), LOCAL_RANK="0",
                MASTER_ADDR=host, MASTER_PORT=port,
            )  # fmt: skip
            if spec.backend == "nccl":
                torch.cuda.set_device(0)
            dist.init_process_group(
                spec.backend, init_method=spec.address, rank=spec.rank, world_size=spec.world
            )
        self._learner = build_learner(settings)

    def step(self) -> int:
        return self._learner.step

    def gpu_id(self) -> tuple[str, str]:
        """(this actor's node id, its GPU's id there)."""
        import ray

        ids = ray.get_gpu_ids()
        return ray.get_runtime_context().get_node_id(), str(ids[0]) if ids else ""

    def node_ip(self) -> str:
        import ray

        return str(ray.util.get_node_ip_address())

    def offload(self) -> None:
        """The torch backend's offload (only its config has ``offload_while_generating``)."""
        from rstar2.learner.torch_backend import TorchLearner

        if isinstance(self._learner, TorchLearner):
            self._learner.offload()

    def reload(self) -> None:
        from rstar2.learner.torch_backend import TorchLearner

        if isinstance(self._learner, TorchLearner):
            self._learner.reload()

    def device(self) -> str:
        return str(self._learner.device)

    def reset_optimizer(self) -> None:
        self._learner.reset_optimizer()

    def compute_logprobs(self, batch: list[TrainSequence]) -> list[list[float]]:
        return self._learner.compute_logprobs(batch)

    def train_step(self, batch: list[TrainSequence]) -> dict[str, float]:
        return self._learner.train_step(batch)

    def sft_step(self, batch: list[TrainSequence]) -> dict[str, float]:
        return self._learner.sft_step(batch)

    def save(self, path: str) -> None:
        self._learner.save(path)

    def load(self, path: str) -> int:
        self._learner.load(path)
        return self._learner.step

    def export_hf(self, folder: str) -> None:
        self._learner.export_hf(folder)

    def named_weights(self, bucket_bytes: int) -> Iterator[list[tuple[str, Any]]]:
        for bucket in self._learner.named_weights(bucket_bytes):
            yield [(name, tensor.cpu()) for name, tensor in bucket]

    # ---- vLLM's native weight transfer (GPU; rstar2.sync.vllm_native drives these) ----

    def weight_metadata(self, bucket_bytes: int) -> list[Any]:
        from rstar2.sync.native_sender import weight_metadata

        return weight_metadata(self._learner, bucket_bytes)

    def open_nccl(self, rank: int, address: str, world_size: int) -> None:
        from rstar2.sync.native_sender import open_nccl

        self._nccl = open_nccl(address, world_size) if rank == 0 else None

    def nccl_send(self, meta: list[Any], bucket_bytes: int, num_buffers: int) -> None:
        from rstar2.sync.native_sender import learner_weights, nccl_send

        source = learner_weights(self._learner, meta, bucket_bytes, everywhere=False)
        if self._nccl is None:
            for _ in source:  # the gathers only
                pass
        else:
            nccl_send(self._nccl, source, bucket_bytes, num_buffers)

    def open_ipc(self, rank: int, engines: list[Any], meta: list[Any], bucket_bytes: int) -> None:
        from rstar2.sync.native_sender import ipc_sender, learner_weights

        source = learner_weights(self._learner, meta, bucket_bytes, everywhere=True)
        self._ipc = ipc_sender(source, engines, bucket_bytes, rank)

    def ipc_send(self) -> None:
        self._ipc.send_weights()

    def send_weights(
        self, targets: list[Any], bucket_bytes: int, call_timeout_s: float | None = None
    ) -> dict[str, Any]:
        """Every bucket into every engine actor of ``targets`` (their ``update_weights``), put
        in the object store once; the other ranks only take part in the gathers. A target that
        is gone (its actor died or cannot be reached), raises EngineDown, or has not loaded a
        bucket ``call_timeout_s`` after it was put gets no further bucket and is named in
        ``failed`` (its index in ``targets``); the others get every bucket. Any other error
        stops the send."""
        import ray

        sent: dict[str, Any] = {"buckets": 0, "tensors": 0, "bytes": 0, "largest_bucket_bytes": 0}
        live = dict(enumerate(targets))
        failed: list[int] = []
        for bucket in self._learner.named_weights(bucket_bytes):
            if not bucket:
                continue
            cpu = [(name, tensor.detach().cpu()) for name, tensor in bucket]
            size = sum(t.numel() * t.element_size() for _, t in cpu)
            if live:  # meanwhile the other ranks wait in the next gather (gloo: 30 min)
                ref = ray.put(cpu)
                calls = {i: t.update_weights.remote(ref) for i, t in live.items()}
                for i in _lost_targets(calls, call_timeout_s):
                    failed.append(i)
                    del live[i]
            sent["buckets"] += 1
            sent["tensors"] += len(cpu)
            sent["bytes"] += size
            sent["largest_bucket_bytes"] = max(sent["largest_bucket_bytes"], size)
        sent["failed"] = sorted(failed)
        return sent


def _lost_targets(calls: dict[int, Any], timeout_s: float | None) -> list[int]:
    """The keys of ``calls`` (one actor call each) whose actor is gone, raised EngineDown, or
    did not answer in ``timeout_s``; any other error of a call is raised."""
    import ray
    import ray.exceptions

    from rstar2.rollout.engine import EngineDown

    refs = list(calls.values())
    done, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    finished = set(done)
    lost = []
    for i, ref in calls.items():
        if ref not in finished:
            lost.append(i)  # hung: the runtime takes the engine down and replaces it
            continue
        try:
            ray.get(ref)
        except (ray.exceptions.ActorDiedError, ray.exceptions.ActorUnavailableError, EngineDown):
            lost.append(i)  # an EngineDown raised in the actor arrives as an instance of it
    return lost


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
        self, bucket_bytes: int, *, every_rank: bool = False
    ) -> Iterator[list[tuple[str, Any]]]:
        """Rank 0's buckets, through the object store (``every_rank`` has no meaning for the
        group's caller, which is one process)."""
        import ray

        streams = [
            a.named_weights.options(num_returns="streaming").remote(bucket_bytes)
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

    async def weight_metadata(self, bucket_bytes: int) -> list[Any]:
        """(name, dtype, shape, bucket) of every exported tensor (one gather pass)."""
        refs = [a.weight_metadata.remote(bucket_bytes) for a in self._actors]
        return list((await asyncio.gather(*refs))[0])

    async def open_nccl(self, address: str, world_size: int) -> None:
        """Rank 0 joins the NCCL transfer group with the engine workers."""
        await asyncio.gather(
            *(a.open_nccl.remote(r, address, world_size) for r, a in enumerate(self._actors))
        )

    async def nccl_send(self, meta: list[Any], bucket_bytes: int, num_buffers: int) -> None:
        await asyncio.gather(
            *(a.nccl_send.remote(meta, bucket_bytes, num_buffers) for a in self._actors)
        )

    async def open_ipc(self, engines: list[Any], meta: list[Any], bucket_bytes: int) -> None:
        """Every rank builds vLLM's IPC trainer engine (rank 0 inits the engines)."""
        await asyncio.gather(
            *(a.open_ipc.remote(r, engines, meta, bucket_bytes) for r, a in enumerate(self._actors))
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
