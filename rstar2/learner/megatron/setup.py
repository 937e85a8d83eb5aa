"""The process-level pieces of the megatron learner: its device and process group, weights
read from an HF folder, and megatron's DDP and optimizer set up the way the learner uses them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from rstar2.config import OptimConfig
from rstar2.learner.megatron.convert import Fetch


def wrap_ddp(model: torch.nn.Module, *, distributed_optimizer: bool) -> Any:
    """megatron's DDP around this rank's model: contiguous fp32 gradient buffers reduced over
    the data-parallel ranks, and finalize_model_grads after every backward schedule."""
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )

    config: Any = model.config
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, use_distributed_optimizer=distributed_optimizer
    )
    config.finalize_model_grads_func = finalize_model_grads
    return DistributedDataParallel(config, ddp_config, model)


def build_optimizer(optim: OptimConfig, model: Any, *, data_parallel: int, bf16: bool) -> Any:
    """megatron's optimizer for the DDP-wrapped ``model``: AdamW (decay on every parameter, as
    torch's AdamW in the torch backend), global grad-norm clip, the distributed optimizer over
    data-parallel ranks; with bf16 parameters, fp32 master weights.

    Without TE or Apex megatron-core falls back to torch's AdamW in its multi-tensor form; on
    GPU it is switched to torch's fused kernel (one launch per step instead of a pass per
    operation over every tensor; the same update up to float rounding)."""
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    config = OptimizerConfig(
        optimizer="adam",
        lr=optim.lr,
        weight_decay=optim.weight_decay,
        adam_beta1=optim.betas[0],
        adam_beta2=optim.betas[1],
        clip_grad=optim.grad_clip_norm,
        use_distributed_optimizer=data_parallel > 1,
        bf16=bf16,
        params_dtype=torch.bfloat16 if bf16 else torch.float32,
    )
    optimizer = get_megatron_optimizer(config, [model])
    use_fused_adamw(optimizer)
    return optimizer


def use_fused_adamw(optimizer: Any) -> None:
    """Switch megatron's torch AdamW to the fused kernel where every parameter is on a GPU
    (also after loading a state, whose groups carry the saving process's choice); CPU stays on
    the multi-tensor form."""
    for part in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = part.optimizer
        on_gpu = all(p.is_cuda for g in inner.param_groups for p in g["params"])
        if isinstance(inner, torch.optim.AdamW) and on_gpu:
            for group in inner.param_groups:
                group["foreach"], group["fused"] = False, True
            for state in inner.state.values():  # the fused kernel keeps its step on the device
                if "step" in state:
                    state["step"] = state["step"].to(device=state["exp_avg"].device)


def load_weights(model: torch.nn.Module, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
    state = dict(weights)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not m.endswith("_extra_state")]
    if missing or unexpected:
        raise ValueError(f"HF -> megatron weights: missing {missing}, unexpected {unexpected}")


def hf_fetch(folder: str | Path) -> Fetch:
    """Tensors of an HF folder by name, read lazily from its safetensors files."""
    from safetensors import safe_open

    root = Path(folder)
    index = root / "model.safetensors.index.json"
    if index.is_file():
        where = {k: root / v for k, v in json.loads(index.read_text())["weight_map"].items()}
    else:
        single = root / "model.safetensors"
        with safe_open(str(single), "pt") as f:
            where = {k: single for k in f.keys()}  # noqa: SIM118 -- safe_open is not a dict

    handles: dict[Path, Any] = {}  # one open (memory-mapped) file each, not one per tensor

    def fetch(name: str) -> torch.Tensor:
        if name not in where and name == "lm_head.weight":
            name = "model.embed_tokens.weight"
        path = where[name]
        if path not in handles:
            handles[path] = safe_open(str(path), "pt")
        return handles[path].get_tensor(name).float()

    return fetch


def pick_device(choice: str) -> torch.device:
    """``auto``: this rank's GPU where there is one, else the CPU; ``cuda``: this rank's GPU."""
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(choice)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return device


def ensure_process_group(device: torch.device) -> None:
    """The launcher's group (torchrun's environment) when none exists yet, else a one-rank
    group (a learner in the trainer's own process)."""
    if dist.is_initialized():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ:
        dist.init_process_group(backend)
        return
    init_one_rank_group(backend)


def init_one_rank_group(backend: str) -> None:
    """A process group of this process alone, whatever a launcher's environment says."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


def why_megatron_cannot_run(accelerator: str) -> str | None:
    """Why the megatron backend cannot run in this environment on ``accelerator``, or None.

    megatron-core must import; and on the CPU it must have been made to run there: megatron-core
    calls ``torch.cuda.current_device()`` on its model path, which a CPU-only torch refuses
    (tests/helpers/megatron_cpu.py redirects it for the CPU tests; nothing in the package does)."""
    try:
        import megatron.core  # noqa: F401
    except ImportError as e:
        return f"megatron-core does not import here ({e}); install it: pip install megatron-core"
    if accelerator != "cpu":
        return None
    try:
        torch.cuda.current_device()
    except (AssertionError, RuntimeError):
        return (
            "megatron-core needs a GPU (cluster.accelerator is 'cpu' and it assumes CUDA); "
            "use learner.backend 'torch' on the CPU"
        )
    return None
