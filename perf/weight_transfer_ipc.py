"""Weight transfer between two processes on one GPU through CUDA IPC (the colocated path):
a learner process holds bf16 weights of the Qwen3-1.7B shape, a receiver process copies them
into its own model of the same shape, in the sync's buckets (512 MiB, whole tensors). GB/s
against the device-to-device copy rate of the same GPU measured in the same run.

    python -m perf.weight_transfer_ipc

Two transports, both with CUDA IPC handles exported once (opening a handle costs far more than
a bucket's copy; an earlier variant re-sending handles every sync ran at 0.05x the copy rate):

- ``shared``: the receiver maps the learner's own tensors and copies each bucket out of them,
  one CUDA graph per bucket captured at open (the addresses never change; a replay is one
  launch). The learner's tensors stay put between syncs (the optimizer updates them in place),
  so bucket messages stream without waiting and one acknowledgement closes the sync. One copy
  per byte: the transport's floor.
- ``packed``: the protocol of vLLM's packed IPC producer (what ``IpcSync`` drives through vLLM)
  — the learner packs each bucket into one of two IPC buffers, the receiver copies out of it
  and releases the buffer. Two copies per byte, each bucket waiting for a free buffer (vLLM's
  worker adds a clone before ``load_weights``: three).

Two in-process references say what the GPU itself does with these tensors: one 512 MiB copy
(``device_copy_gb_per_s``, the issue's yardstick) and the same 310 tensors copied into 310
others (per-tensor ``copy_``, and replayed from one CUDA graph). Per-tensor copies run well
below the contiguous copy on an H200 (0.74x from a graph), so no transfer into a model's
separate tensors can reach the contiguous rate; ``shared_gpu_gb_per_s`` (the receiver's
copies alone, CUDA events) shows what IPC costs against ``in_process_graph_copy_gb_per_s``.
Messages go through a pipe (an ``mp.Queue``'s feeder thread added ~0.1 ms per message), read
by polling without sleeping (a blocked read's wake-up costs tens of microseconds a message).
``first_round_s`` is the sync that opens the handles; ``*_round_s`` the median of the later
ones. One JSON line out.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

import torch
import torch.multiprocessing as mp

BUCKET_BYTES = 512 << 20
SMALL_BYTES = 1 << 20
ROUNDS = 20
_CAPTURED: list[Any] = []


def _shapes() -> list[tuple[str, tuple[int, ...]]]:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from perf.shapes import QWEN3_1_7B

    with torch.device("meta"):
        model = Qwen3ForCausalLM(Qwen3Config(**dict[str, Any](QWEN3_1_7B)))
    return [(n, tuple(p.shape)) for n, p in model.named_parameters()]


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _buckets(named: list[tuple[str, torch.Tensor]]) -> list[list[tuple[str, torch.Tensor]]]:
    out: list[list[tuple[str, torch.Tensor]]] = [[]]
    size = 0
    for name, t in named:
        if out[-1] and size + _nbytes(t) > BUCKET_BYTES:
            out.append([])
            size = 0
        out[-1].append((name, t))
        size += _nbytes(t)
    return out


def _copy(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
    """``dst[i].copy_(src[i])``: one copy each for large tensors (the copy engine's rate; a
    ``_foreach_copy_`` kernel ran at 0.67x it), one ``_foreach_copy_`` for the small rest
    (launches would cost more than the bytes)."""
    small = [(d, s) for d, s in zip(dst, src, strict=True) if _nbytes(s) < SMALL_BYTES]
    for d, s in zip(dst, src, strict=True):
        if _nbytes(s) >= SMALL_BYTES:
            d.copy_(s, non_blocking=True)
    if small:
        torch._foreach_copy_([d for d, _ in small], [s for _, s in small])


def _views(buffer: torch.Tensor, bucket: list[tuple[str, tuple[int, ...]]]) -> list[torch.Tensor]:
    """The bucket's tensors as bf16 views of a packed uint8 buffer, in order."""
    out, at = [], 0
    for _, shape in bucket:
        n = 2 * int(torch.Size(shape).numel())
        out.append(buffer[at : at + n].view(torch.bfloat16).view(shape))
        at += n
    return out


def _captured(bucket: list[tuple[str, torch.Tensor]], mine: dict[str, torch.Tensor]) -> Any:
    """The bucket's copies into ``mine`` as one CUDA graph of one multi-tensor copy launch
    (perf.multi_copy): the addresses on both sides never change, so a sync replays it."""
    from perf.multi_copy import MultiCopy

    copy = MultiCopy([mine[name] for name, _ in bucket], [t for _, t in bucket])
    return _graph_of(copy)


def _per_tensor_graph(bucket: list[tuple[str, torch.Tensor]], mine: dict[str, torch.Tensor]) -> Any:
    """The same copies, one ``copy_`` per tensor, as one CUDA graph (the earlier receiver)."""

    def copies() -> None:
        for name, tensor in bucket:
            mine[name].copy_(tensor, non_blocking=True)

    return _graph_of(copies)


def _graph_of(fn: Any) -> Any:
    fn()  # compiles a Triton kernel outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    _CAPTURED.append(fn)  # the graph's tensors and tables live as long as the process
    return graph


def _receiver(shapes: list[tuple[str, tuple[int, ...]]], conn: Any) -> None:
    torch.cuda.set_device(0)
    mine = {n: torch.empty(s, dtype=torch.bfloat16, device="cuda") for n, s in shapes}
    shared: list[list[tuple[str, torch.Tensor]]] = []
    slots: list[torch.Tensor] = []
    layout: list[list[tuple[str, tuple[int, ...]]]] = []
    graphs: list[Any] = []
    first, last = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    while True:
        message = _recv_spinning(conn)
        kind = message[0]
        if kind == "stop":
            break
        if kind == "open":  # both transports' handles, once
            shared, slots = message[1], message[2]
            layout = [[(n, tuple(t.shape)) for n, t in bucket] for bucket in shared]
            graphs = [_captured(bucket, mine) for bucket in shared]
        elif kind == "shared":  # copy one bucket out of the learner's tensors
            if message[1] == 0:
                first.record()
            graphs[message[1]].replay()
            if message[2]:  # the sync's last bucket: the GPU time of the sync's copies too
                last.record()
                torch.cuda.synchronize()
                conn.send(first.elapsed_time(last) / 1e3)
        elif kind == "packed":  # copy one bucket out of a packed buffer, release it
            index, slot = message[1], message[2]
            views = _views(slots[slot], layout[index])
            _copy([mine[n] for n, _ in layout[index]], views)
            torch.cuda.synchronize()
            conn.send(slot)
    shared, slots = [], []
    conn.send(float(sum(t.float().sum().item() for t in mine.values())))


def _recv_spinning(conn: Any) -> Any:
    """``conn.recv()`` after polling without sleeping: a blocked read costs a wake-up (tens of
    microseconds) per message, which at ~2 ms per sync is several percent of it."""
    while not conn.poll():
        pass
    return conn.recv()


def _copy_rate(nbytes: int) -> float:
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(20):
        dst.copy_(src)
    torch.cuda.synchronize()
    return nbytes * 20 / (time.perf_counter() - start) / 1e9


def _sync_shared(conn: Any, buckets: list[Any], gpu_s: list[float]) -> None:
    for index in range(len(buckets)):
        conn.send(("shared", index, index == len(buckets) - 1))
    gpu_s.append(_recv_spinning(conn))


def _sync_packed(conn: Any, buckets: list[Any], slots: list[torch.Tensor]) -> None:
    free = list(range(len(slots)))
    for index, bucket in enumerate(buckets):
        slot = free.pop(0) if free else _recv_spinning(conn)  # wait for a released buffer
        views = _views(slots[slot], [(n, tuple(t.shape)) for n, t in bucket])
        _copy(views, [t for _, t in bucket])
        torch.cuda.synchronize()  # the receiver reads on another process's stream
        conn.send(("packed", index, slot))
    for _ in range(len(slots) - len(free)):
        _recv_spinning(conn)


def _timed(fn: Any, rounds: int) -> list[float]:
    times = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times


def main() -> dict[str, Any]:
    shapes = _shapes()
    torch.manual_seed(0)
    learner = [(n, torch.randn(s, dtype=torch.bfloat16, device="cuda")) for n, s in shapes]
    total = sum(_nbytes(t) for _, t in learner)
    buckets = _buckets(learner)
    largest = max(sum(_nbytes(t) for _, t in b) for b in buckets)
    slots = [torch.empty(largest, dtype=torch.uint8, device="cuda") for _ in range(2)]
    ctx = mp.get_context("spawn")
    conn, their_end = ctx.Pipe()  # a pipe, not a Queue: no feeder thread between messages
    proc = ctx.Process(target=_receiver, args=(shapes, their_end))
    proc.start()
    start = time.perf_counter()
    conn.send(("open", buckets, slots))
    gpu_s: list[float] = []
    _sync_shared(conn, buckets, gpu_s)
    first = time.perf_counter() - start
    shared = _timed(lambda: _sync_shared(conn, buckets, gpu_s), ROUNDS)
    packed = _timed(lambda: _sync_packed(conn, buckets, slots), ROUNDS)
    conn.send(("stop",))
    checksum = conn.recv()
    proc.join(timeout=60)
    expected = float(sum(t.float().sum().item() for _, t in learner))
    targets = [torch.empty_like(t) for _, t in learner]
    in_process = _timed(lambda: _copy(targets, [t for _, t in learner]), 5)
    named_targets = dict(zip([n for n, _ in learner], targets, strict=True))
    per_tensor = _per_tensor_graph(learner, named_targets)
    in_process_graph = _timed(per_tensor.replay, 5)
    fused = _captured(learner, named_targets)
    in_process_fused = _timed(fused.replay, 5)
    copy = _copy_rate(BUCKET_BYTES)

    def rate(times: list[float]) -> float:
        return total / statistics.median(times) / 1e9

    out = {
        "benchmark": "weight_transfer_ipc",
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "model": "qwen3-1.7b-shape, bf16",
        "bytes": total,
        "tensors": len(learner),
        "buckets": len(buckets),
        "bucket_mib": BUCKET_BYTES >> 20,
        "rounds": ROUNDS,
        "first_round_s": round(first, 4),
        "shared_round_s": round(statistics.median(shared), 5),
        "shared_best_round_s": round(min(shared), 5),
        "shared_gb_per_s": round(rate(shared), 1),
        # the copies alone (CUDA events in the receiver): what messaging adds is the rest
        "shared_gpu_gb_per_s": round(rate(gpu_s[1:]), 1),
        "packed_round_s": round(statistics.median(packed), 5),
        "packed_gb_per_s": round(rate(packed), 1),
        "device_copy_gb_per_s": round(copy, 1),
        "in_process_tensor_copy_gb_per_s": round(total / min(in_process) / 1e9, 1),
        "in_process_graph_copy_gb_per_s": round(total / min(in_process_graph) / 1e9, 1),
        "in_process_multi_copy_gb_per_s": round(total / min(in_process_fused) / 1e9, 1),
        "shared_over_copy": round(rate(shared) / copy, 3),
        "packed_over_copy": round(rate(packed) / copy, 3),
        "weights_equal": abs(checksum - expected) <= 1e-3 * max(1.0, abs(expected)),
    }
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
