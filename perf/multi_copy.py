"""One Triton launch that copies many tensors into many others (a weight bucket into a model's
separate tensors), for the CUDA-IPC benchmark's receiver.

Per-tensor ``copy_`` launches (310 for a Qwen3-1.7B, most of them 4-25 MB) each pay a ramp-up
and a tail on an H200, so they top out near 0.6-0.74x of one contiguous copy of the same bytes
(``_foreach_copy_``: 0.66x). One launch over a table of (source, destination, length) lets every
block stream 32 KiB of one tensor: 0.92x of the contiguous copy there
(``perf/results/weight-transfer-ipc-h200.json``). Sources and destinations are 16-byte aligned,
their byte lengths multiples of 8 (the constructor checks both).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_WORDS = 4096  # 8-byte words per block: 32 KiB (the fastest of 8-64 KiB on the H200)
NUM_WARPS = 4


@triton.jit
def _multi_copy(src_ptrs, dst_ptrs, block_tensor, block_start, words, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
    pid = tl.program_id(0)
    t = tl.load(block_tensor + pid)
    start = tl.multiple_of(tl.load(block_start + pid), BLOCK)
    n = tl.load(words + t)
    src = tl.multiple_of(tl.load(src_ptrs + t).to(tl.pointer_type(tl.int64)), 16)
    dst = tl.multiple_of(tl.load(dst_ptrs + t).to(tl.pointer_type(tl.int64)), 16)
    offs = start + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(src + offs, mask=mask, eviction_policy="evict_first")
    tl.store(dst + offs, x, mask=mask, cache_modifier=".cs")


class MultiCopy:
    """``dst[i].copy_(src[i])`` for every i in one launch; the tensors' addresses are taken
    once, so both lists must stay allocated (and may be captured in a CUDA graph)."""

    def __init__(self, dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
        words = []
        for s, d in zip(src, dst, strict=True):
            nbytes = s.numel() * s.element_size()
            if nbytes != d.numel() * d.element_size() or nbytes % 8:
                raise ValueError("sizes differ or are not multiples of 8 bytes")
            if (
                s.data_ptr() % 16
                or d.data_ptr() % 16
                or not (s.is_contiguous() and d.is_contiguous())
            ):
                raise ValueError("tensors must be contiguous and 16-byte aligned")
            words.append(nbytes // 8)
        table_tensor, table_start = [], []
        for i, n in enumerate(words):
            for start in range(0, n, BLOCK_WORDS):
                table_tensor.append(i)
                table_start.append(start)
        dev = src[0].device
        self._src = torch.tensor([s.data_ptr() for s in src], dtype=torch.int64, device=dev)
        self._dst = torch.tensor([d.data_ptr() for d in dst], dtype=torch.int64, device=dev)
        self._tensor = torch.tensor(table_tensor, dtype=torch.int32, device=dev)
        self._start = torch.tensor(table_start, dtype=torch.int64, device=dev)
        self._words = torch.tensor(words, dtype=torch.int64, device=dev)
        self._keep = (src, dst)

    def __call__(self) -> None:
        grid = (self._tensor.numel(),)
        _multi_copy[grid](
            self._src, self._dst, self._tensor, self._start, self._words,
            BLOCK=BLOCK_WORDS, num_warps=NUM_WARPS,
        )  # fmt: skip
