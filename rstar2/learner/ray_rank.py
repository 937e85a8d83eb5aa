"""One rank of the Ray learner group (:mod:`rstar2.learner.ray_learner` is its client).

A :class:`LearnerActor` is constructed empty inside its Ray worker; :meth:`LearnerActor.start`
joins the group's torch.distributed process group and builds the learner. Each call then runs
on every rank with the same arguments, and the ranks' collectives (gathers of sharded weights,
all-reduces of gradients) meet inside the learner. Rank 0 alone calls the engines with the
weights (:meth:`LearnerActor.send_weights`, or vLLM's native NCCL and IPC senders; with IPC
every rank takes part in the send: :func:`rstar2.sync.native_sender.ipc_sender`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
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
    """The actor body (wrapped with ``ray.remote`` by
    :meth:`rstar2.learner.ray_learner.RayLearner.create`): constructed
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

    def empty_cache(self) -> None:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()

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

    def named_weights(
        self, bucket_bytes: int, dtype: Any = None
    ) -> Iterator[list[tuple[str, Any]]]:
        for bucket in self._learner.named_weights(bucket_bytes, dtype):
            yield [(name, tensor.cpu()) for name, tensor in bucket]

    # ---- vLLM's native weight transfer (GPU; rstar2.sync.vllm_native drives these) ----

    def weight_metadata(self, bucket_bytes: int, dtype: str | None = None) -> list[Any]:
        from rstar2.sync.native_sender import weight_metadata

        return weight_metadata(self._learner, bucket_bytes, dtype)

    def open_nccl(self, rank: int, address: str, world_size: int) -> None:
        from rstar2.sync.native_sender import open_nccl

        self._nccl = open_nccl(address, world_size) if rank == 0 else None

    def nccl_send(
        self, meta: list[Any], bucket_bytes: int, num_buffers: int, dtype: str | None = None
    ) -> None:
        from rstar2.sync.native_sender import learner_weights, nccl_send

        source = learner_weights(self._learner, meta, bucket_bytes, everywhere=False, dtype=dtype)
        if self._nccl is None:
            for _ in source:  # the gathers only
                pass
        else:
            nccl_send(self._nccl, source, bucket_bytes, num_buffers)

    def open_ipc(
        self,
        rank: int,
        engines: list[Any],
        meta: list[Any],
        bucket_bytes: int,
        dtype: str | None = None,
    ) -> None:
        from rstar2.rollout.ray_engine import ACTOR_CALL_TIMEOUT_S
        from rstar2.sync.native_sender import ipc_sender, learner_weights

        source = learner_weights(self._learner, meta, bucket_bytes, everywhere=True, dtype=dtype)
        self._ipc = ipc_sender(source, engines, bucket_bytes, rank, ACTOR_CALL_TIMEOUT_S)

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
