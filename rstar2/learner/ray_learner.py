"""The torch learner inside a Ray actor, so the trainer can place it on any node.

``RayLearner.create(settings)`` starts a :class:`LearnerActor` hosting one learner of the
settings' backend (torch or megatron, one rank) and returns a client with the surface the
trainer and :func:`~rstar2.learner.sync.sync_weights` use: ``step``, ``train_step``,
``compute_logprobs``, ``reset_optimizer``, ``save`` / ``load`` (paths on the actor's node: a
shared file system when it is another node), ``export_hf`` and ``named_weights``. Calls block
until the actor answers; the actor serves one call at a time, in order.

``named_weights`` streams the buckets from the actor (a Ray streaming generator), each moved to
CPU there, so a bucket is in flight while the next is gathered; they pass through the caller's
process on their way to the engines. One actor is one learner rank: FSDP or megatron over
several ranks still starts under torchrun (``launcher/``), not as Ray actors.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from rstar2.learner.build import LearnerSettings, build_learner
from rstar2.learner.protocol import TrainSequence


class LearnerActor:
    """The actor body (wrapped with ``ray.remote`` by :meth:`RayLearner.create`)."""

    def __init__(self, settings: LearnerSettings, num_threads: int) -> None:
        import torch

        # Ray sets OMP_NUM_THREADS from the actor's CPU request; the caller's count keeps CPU
        # results bit-equal to an in-process learner's (a reduction's order follows threads)
        torch.set_num_threads(num_threads)
        self._learner = build_learner(settings)

    def step(self) -> int:
        return self._learner.step

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


class RayLearner:
    """Client of one :class:`LearnerActor`; see the module docstring."""

    def __init__(self, actor: Any, step: int) -> None:
        self._actor = actor
        self._step = step

    @classmethod
    def create(
        cls,
        settings: LearnerSettings,
        *,
        num_cpus: float = 1,
        num_gpus: float = 0,
        num_threads: int | None = None,
    ) -> RayLearner:
        """Start the actor (needs a running ``ray.init()``); ``num_threads``: torch threads in
        the actor, default this process's."""
        import ray
        import torch

        threads = num_threads if num_threads is not None else torch.get_num_threads()
        remote: Any = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus)(LearnerActor)
        actor = remote.remote(settings, threads)
        return cls(actor, int(ray.get(actor.step.remote())))

    def _call(self, method: str, *args: Any) -> Any:
        import ray

        return ray.get(getattr(self._actor, method).remote(*args))

    @property
    def step(self) -> int:
        return self._step

    @property
    def device(self) -> str:
        return str(self._call("device"))

    def reset_optimizer(self) -> None:
        self._call("reset_optimizer")

    def compute_logprobs(self, batch: Sequence[TrainSequence]) -> list[list[float]]:
        logprobs: list[list[float]] = self._call("compute_logprobs", list(batch))
        return logprobs

    def train_step(self, batch: Sequence[TrainSequence]) -> dict[str, float]:
        metrics: dict[str, float] = self._call("train_step", list(batch))
        self._step = int(metrics["step"])  # the learner reports its step after the update
        return metrics

    def sft_step(self, batch: Sequence[TrainSequence]) -> dict[str, float]:
        metrics: dict[str, float] = self._call("sft_step", list(batch))
        self._step = int(metrics.get("step", self._step + 1))
        return metrics

    def save(self, path: str | Path) -> None:
        self._call("save", str(path))

    def load(self, path: str | Path) -> None:
        self._step = int(self._call("load", str(path)))

    def export_hf(self, folder: str | Path) -> None:
        self._call("export_hf", str(folder))

    def named_weights(self, bucket_bytes: int) -> Iterator[list[tuple[str, Any]]]:
        import ray

        stream = self._actor.named_weights.options(num_returns="streaming").remote(bucket_bytes)
        for ref in stream:
            yield ray.get(ref)

    def close(self) -> None:
        """Stop the actor (its state is gone; save first). Idempotent."""
        import ray

        if self._actor is not None:
            ray.kill(self._actor)
            self._actor = None
