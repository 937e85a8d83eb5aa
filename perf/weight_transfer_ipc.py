"""Weight transfer between two processes on one GPU through CUDA IPC (the colocated path):
a learner process shares its bf16 weights bucket by bucket, a receiver copies each tensor into
its own model of the same shape. GB/s against the device-to-device copy rate of the same GPU
measured in the same run.

    python -m perf.weight_transfer_ipc        # Qwen3-1.7B shape, 512 MiB buckets

Each bucket: the learner puts its tensors (CUDA IPC handles, no copy) on a queue once; the
receiver opens them and keeps them (the learner's parameters stay where they are: the optimizer
updates them in place). Every later sync sends only the bucket's index: the receiver copies it
into its own tensors, synchronises and acknowledges. ``first_round_s`` is the first sync
(handles opened), ``round_s`` the best later one. One JSON line out.
"""

from __future__ import annotations

import json
import time
from typing import Any

import torch
import torch.multiprocessing as mp

BUCKET_BYTES = 512 << 20


def _shapes() -> list[tuple[str, tuple[int, ...]]]:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from perf.learner import QWEN3_1_7B

    with torch.device("meta"):
        model = Qwen3ForCausalLM(Qwen3Config(**dict[str, Any](QWEN3_1_7B)))
    return [(n, tuple(p.shape)) for n, p in model.named_parameters()]


def _buckets(named: list[tuple[str, torch.Tensor]]) -> list[list[tuple[str, torch.Tensor]]]:
    out: list[list[tuple[str, torch.Tensor]]] = [[]]
    size = 0
    for name, t in named:
        nbytes = t.numel() * t.element_size()
        if out[-1] and size + nbytes > BUCKET_BYTES:
            out.append([])
            size = 0
        out[-1].append((name, t))
        size += nbytes
    return out


def _receiver(shapes: list[tuple[str, tuple[int, ...]]], inbox: Any, acks: Any) -> None:
    torch.cuda.set_device(0)
    mine = {n: torch.empty(s, dtype=torch.bfloat16, device="cuda") for n, s in shapes}
    opened: dict[int, list[tuple[str, torch.Tensor]]] = {}
    while True:
        message = inbox.get()
        if message is None:
            break
        index, bucket = message
        if bucket is not None:
            opened[index] = bucket
        for name, tensor in opened[index]:
            mine[name].copy_(tensor, non_blocking=True)
        torch.cuda.synchronize()
        acks.put(1)
    opened.clear()
    checksum = float(sum(t.float().sum().item() for t in mine.values()))
    acks.put(checksum)


def _copy_rate(nbytes: int) -> float:
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        dst.copy_(src)
    torch.cuda.synchronize()
    return nbytes * 10 / (time.perf_counter() - start) / 1e9


def main() -> dict[str, Any]:
    shapes = _shapes()
    torch.manual_seed(0)
    learner = [(n, torch.randn(s, dtype=torch.bfloat16, device="cuda")) for n, s in shapes]
    total = sum(t.numel() * t.element_size() for _, t in learner)
    buckets = _buckets(learner)
    ctx = mp.get_context("spawn")
    inbox, acks = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_receiver, args=(shapes, inbox, acks))
    proc.start()
    rounds = []
    for r in range(5):  # the first round sends and opens the IPC handles
        torch.cuda.synchronize()
        start = time.perf_counter()
        for index, bucket in enumerate(buckets):
            inbox.put((index, bucket if r == 0 else None))
            acks.get()
        rounds.append(time.perf_counter() - start)
    inbox.put(None)
    checksum = acks.get()
    proc.join(timeout=60)
    expected = float(sum(t.float().sum().item() for _, t in learner))
    best = min(rounds[1:])
    ipc = total / best / 1e9
    copy = _copy_rate(BUCKET_BYTES)
    out = {
        "benchmark": "weight_transfer_ipc",
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "model": "qwen3-1.7b-shape, bf16",
        "bytes": total,
        "buckets": len(buckets),
        "bucket_mib": BUCKET_BYTES >> 20,
        "first_round_s": round(rounds[0], 4),
        "round_s": round(best, 4),
        "ipc_gb_per_s": round(ipc, 1),
        "device_copy_gb_per_s": round(copy, 1),
        "ipc_over_copy": round(ipc / copy, 3),
        "weights_equal": abs(checksum - expected) <= 1e-3 * max(1.0, abs(expected)),
    }
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
