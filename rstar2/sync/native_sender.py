"""The learner side of vLLM's native weight transfer, run inside the learner ranks (GPU only).

:class:`LearnerWeights` is a vLLM ``WeightSource`` over a learner's ``named_weights``: its
metadata is taken once (one pass, every rank), and each pass yields HF-named full tensors.
With ``everywhere`` every rank yields every tensor on its own GPU, which is what CUDA IPC to
colocated engine workers needs: under FSDP2 each rank's gathers already left it the full
tensors; where only rank 0 holds them (megatron gathers to rank 0) each one is broadcast inside
the learner group (each worker maps the copy on its GPU; vLLM's IPC trainer
engine all-gathers the ranks' handles). The ranks stay in step because ``named_weights`` yields
one list per bucket on every rank.

:func:`open_nccl` / :func:`nccl_send` are rank 0's end of the NCCL transfer group with the
engine workers (vLLM's ``trainer_init`` and packed broadcast producer: the workers unpack with
the same buffer size). :func:`ipc_sender` is vLLM's IPC trainer engine over the engine actors.
Nothing here runs on CPU: vLLM's transfer engines need CUDA.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Iterator, Sequence
from typing import Any

from rstar2.learner.protocol import Learner

Meta = list[tuple[str, str, list[int], int]]  # name, dtype name, shape, bucket index


def weight_metadata(learner: Learner, bucket_bytes: int, dtype: str | None = None) -> Meta:
    """(name, dtype name, shape, bucket) of every tensor ``named_weights`` yields in ``dtype``
    (a torch dtype name, the engines' own: the wire carries what they hold; None: the
    learner's), in its order (every rank must call; only rank 0's list is filled)."""
    meta: Meta = []
    for index, bucket in enumerate(learner.named_weights(bucket_bytes, _torch_dtype(dtype))):
        for name, t in bucket:
            meta.append((name, str(t.dtype).removeprefix("torch."), list(t.shape), index))
    return meta


def learner_weights(
    learner: Learner,
    meta: Meta,
    bucket_bytes: int,
    everywhere: bool,
    device: str = "cuda",
    dtype: str | None = None,
) -> Any:
    """A vLLM ``WeightSource`` over ``learner`` (``meta``: rank 0's :func:`weight_metadata` in
    the same ``dtype``, given to every rank) yielding tensors on ``device``; ``everywhere``:
    every rank yields them (each bucket broadcast from rank 0 in the learner group after its
    gathers), else only rank 0 does.

    Guarantees of each pass: the tensors come in ``meta``'s order with its names, dtypes and
    shapes (a drift raises RuntimeError before anything mismatched is sent: both ends of the
    packed stream split it by ``meta``; a rank that yields nothing, off rank 0 without
    ``everywhere``, is checked for that); each tensor is complete on the CUDA stream that is
    current when it is yielded and is not freed before that stream's work on it is done (vLLM's
    NCCL producer pulls under its own side streams, its IPC producer under the caller's; the
    learner's gathers and casts run under whichever stream was current when they were
    pulled)."""
    import torch
    import torch.distributed as dist

    from rstar2.rollout import vllm_compat

    entries = meta
    rank = dist.get_rank() if dist.is_initialized() else 0
    spread = everywhere and dist.is_initialized() and dist.get_world_size() > 1
    # what this rank yields: every tensor, or (only rank 0 holding them) nothing off rank 0
    expected = entries if spread or rank == 0 else []
    wire = _torch_dtype(dtype)
    on_cuda = torch.device(device).type == "cuda"

    def bucket_tensors() -> Iterator[tuple[list[tuple[str, Any]], Any]]:
        """Each bucket as (name, tensor) pairs on ``device`` and the event closing its work.
        The learner computes ahead (a bucket's first unit is gathered and cast while the one
        before it is pulled, on that pull's stream), so each bucket's stream first waits for
        the event of the bucket before: the events chain every stream that did the work."""
        held: bool | None = None  # every rank holds every bucket's tensors (FSDP2)
        before = None
        for index, bucket in enumerate(
            learner.named_weights(bucket_bytes, wire, every_rank=spread)
        ):
            if before is not None:
                torch.cuda.current_stream().wait_event(before)
            # on the device already, but a later pipeline stage's megatron tensors (host)
            bucket = [(n, t.to(device, non_blocking=True)) for n, t in bucket]
            if spread and held is None:  # decided once, by every rank alike
                wanted = sum(1 for *_, at in entries if at == index)
                flag = torch.tensor([int(len(bucket) == wanted)], device=device)
                dist.all_reduce(flag, op=dist.ReduceOp.MIN)
                held = bool(flag.item())
            if spread and not held:
                if rank == 0:
                    bucket = [(n, t.contiguous()) for n, t in bucket]
                else:
                    bucket = [
                        (n, torch.empty(s, dtype=getattr(torch, d), device=device))
                        for n, d, s, at in entries
                        if at == index
                    ]
                for _, tensor in bucket:
                    dist.broadcast(tensor, src=0)
            done = None
            if on_cuda:
                done = torch.cuda.Event()
                done.record()  # on the stream current while this bucket was made
                before = done
            yield bucket, done

    def checked() -> Iterator[tuple[str, Any]]:
        position = 0
        for bucket, done in bucket_tensors():
            for name, tensor in bucket:
                if position >= len(expected):
                    raise RuntimeError(f"the learner yielded {name!r} past its weight metadata")
                want, dtype_name, shape, _ = expected[position]
                got = (name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape))
                if got != (want, dtype_name, list(shape)):
                    raise RuntimeError(
                        f"the learner's weights drifted from their metadata at tensor "
                        f"{position}: {got} where {(want, dtype_name, list(shape))} was declared"
                    )
                position += 1
                if done is not None:
                    current = torch.cuda.current_stream()
                    current.wait_event(done)
                    tensor.record_stream(current)
                yield name, tensor
        if position != len(expected):
            raise RuntimeError(
                f"the learner yielded {position} tensors on rank {rank}, its weight metadata "
                f"declares {len(expected)}"
            )

    def params() -> list[Any]:
        from vllm.distributed.weight_transfer.base import ParamMeta

        return [ParamMeta(n, getattr(torch, d), tuple(s)) for n, d, s, _ in entries]

    from vllm.distributed.weight_transfer import base

    WeightSource: Any = base.WeightSource  # 0.26-0.32: metadata a method; 0.33: a property
    if vllm_compat.cached_source_metadata():  # vLLM >= 0.33

        class CachedLearnerWeights(WeightSource):
            meta = entries

            @functools.cached_property
            def metadata(self) -> list[Any]:
                return params()

            def iter_full(self) -> Iterator[tuple[str, Any]]:
                return checked()

            def __iter__(self) -> Iterator[tuple[str, Any]]:
                return checked()

        return CachedLearnerWeights()

    class LearnerWeights(WeightSource):
        meta = entries

        def metadata(self) -> list[Any]:
            return params()

        def __iter__(self) -> Iterator[tuple[str, Any]]:
            return checked()

    return LearnerWeights()


def _torch_dtype(name: str | None) -> Any:
    import torch

    return None if name is None else getattr(torch, name)


def open_nccl(address: str, world_size: int) -> Any:
    """Rank 0's endpoint (rank 0 of ``world_size``) of the transfer group at ``tcp://H:P``."""
    from vllm.distributed.weight_transfer.nccl_common import trainer_init

    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    info = {"master_address": host, "master_port": int(port), "world_size": world_size}
    return trainer_init(info, rank=0)


def nccl_send(group: Any, source: Any, bucket_bytes: int, num_buffers: int) -> None:
    """Broadcast ``source``'s tensors into the group, packed into ``bucket_bytes`` chunks."""
    from vllm.distributed.weight_transfer.packed_tensor import packed_nccl_broadcast_producer

    packed_nccl_broadcast_producer(
        iterator=iter(source),
        group=group,
        src=0,
        post_iter_func=lambda item: item[1],
        buffer_size_bytes=bucket_bytes,
        num_buffers=num_buffers,
    )


def ipc_sender(
    source: Any, engine_actors: list[Any], bucket_bytes: int, rank: int, call_timeout_s: float
) -> Any:
    """vLLM's IPC trainer side for this rank, driving the engine actors (rank 0 only calls
    them, each call bounded by ``call_timeout_s``); ``send_weights()`` on every rank sends one
    version. vLLM >= 0.32: its IPC trainer engine over its Ray client; 0.26: its static packed
    sender, with the update started and finished here (:mod:`rstar2.rollout.vllm_compat`)."""
    from rstar2.rollout import vllm_compat

    # vLLM's IPC buffer must hold the largest tensor (our buckets may exceed bucket_bytes by one)
    largest = max((tensor_nbytes(d, s) for _, d, s, _ in source.meta), default=0)
    size = max(bucket_bytes, largest)
    if not vllm_compat.trainer_engines():
        return _StaticIpcSender(source, engine_actors, size, rank, call_timeout_s)
    from vllm.distributed.weight_transfer.clients import RayVLLMWeightSyncClient
    from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
    from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

    info = IPCTrainerInitInfo(packed=True, packed_buffer_size_bytes=size, rank=rank)
    client = RayVLLMWeightSyncClient(engine_actors)
    return WeightTransferTrainerFactory.trainer_init(info, client=client, source=source)


class _StaticIpcSender:
    """vLLM 0.26's IPC trainer side: ``IPCWeightTransferEngine.trainer_send_weights`` packs the
    source's tensors into a buffer of ``buffer_bytes``, all-gathers the ranks' handles, and hands
    each chunk to :meth:`_send` on rank 0, which loads it into every engine actor."""

    def __init__(
        self, source: Any, actors: list[Any], buffer_bytes: int, rank: int, timeout_s: float
    ) -> None:
        self.source, self.actors, self.buffer_bytes = source, actors, buffer_bytes
        self.rank, self.timeout_s = rank, timeout_s

    def send_weights(self) -> None:
        from vllm.distributed.weight_transfer.ipc_engine import (  # type: ignore[attr-defined]
            IPCTrainerSendWeightsArgs,  # vLLM 0.26 only
            IPCWeightTransferEngine,
        )

        args = IPCTrainerSendWeightsArgs(
            send_mode=self._send, packed=True, packed_buffer_size_bytes=self.buffer_bytes
        )
        self._on_engines("start_weight_update")
        send = IPCWeightTransferEngine.trainer_send_weights  # type: ignore[attr-defined]
        try:
            send(iter(self.source), args)
        except BaseException:  # no engine is left inside an update it cannot finish
            with contextlib.suppress(Exception):
                self._on_engines("finish_weight_update")
            raise
        self._on_engines("finish_weight_update")

    def _send(self, update_info: Any) -> None:
        from dataclasses import asdict

        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        request = WeightTransferUpdateRequest(update_info=asdict(update_info))
        self._on_engines("update_weights", request)

    def _on_engines(self, method: str, *args: Any) -> None:
        """Rank 0 calls ``method`` on every engine actor and waits, at most ``timeout_s``;
        EngineDown naming the engine when one is gone or does not answer in time."""
        if self.rank != 0:
            return
        import ray.exceptions

        from rstar2.rollout.engine import EngineDown

        refs = [getattr(a, method).remote(*args) for a in self.actors]
        end = time.monotonic() + self.timeout_s  # one deadline for all of them
        for index, ref in enumerate(refs):
            try:
                ray.get(ref, timeout=max(0.0, end - time.monotonic()))
            except ray.exceptions.GetTimeoutError:
                raise EngineDown(
                    f"engine {index} did not answer {method} in {self.timeout_s:g} s"
                ) from None
            except (ray.exceptions.ActorDiedError, ray.exceptions.ActorUnavailableError) as exc:
                raise EngineDown(
                    f"engine {index} is gone ({method}): {exc}".splitlines()[0]
                ) from exc


def tensor_nbytes(dtype: str, shape: Sequence[int]) -> int:
    """Bytes of a tensor of ``dtype`` (a torch dtype name) and ``shape``."""
    import torch

    n = 1
    for d in shape:
        n *= int(d)
    return n * torch.empty((), dtype=getattr(torch, dtype)).element_size()
