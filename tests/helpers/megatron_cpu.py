"""megatron-core 0.16 on CPU (gloo), for tests: the one module that patches third-party code
for the megatron backend, and never imported by the package itself.

megatron-core assumes CUDA in places unrelated to the arithmetic: ``torch.cuda.current_device()``
as a device, ``device="cuda"`` literals in the pipeline schedules and the optimizer (loss scale,
token counts), ``.cuda()`` on CPU tensors. :func:`install` redirects exactly those to the CPU:
- ``torch.cuda.current_device`` returns ``"cpu"`` (CPU builds of torch only);
- in every loaded ``megatron.core`` module the global ``torch`` is a proxy whose tensor factories
  map a CUDA device to the CPU and whose ``cuda.synchronize`` is a no-op (everything else is
  torch itself);
- ``Tensor.cuda()`` returns the tensor on a CPU-only build;
- ``Tensor.type()`` called from megatron.core code names a CPU float tensor as its CUDA type (the
  grad-clip code asserts ``param.grad.type() == "torch.cuda.FloatTensor"``);
- the model-parallel RNG tracker's "CUDA" states are CPU generator states.
Nothing changes on a machine with a GPU (install() is a no-op there). Call it in every process
before building a megatron model (the test workers do; so does the sitecustomize the end-to-end
tests put on PYTHONPATH).
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

import torch

_FACTORIES = ("tensor", "zeros", "ones", "empty", "full", "arange", "zeros_like", "empty_like")
_MODULES = (
    "megatron.core.optimizer",
    "megatron.core.optimizer.optimizer",
    "megatron.core.optimizer.clip_grads",
    "megatron.core.optimizer.distrib_optimizer",
    "megatron.core.distributed",
    "megatron.core.distributed.param_and_grad_buffer",
    "megatron.core.distributed.finalize_model_grads",
    "megatron.core.pipeline_parallel.schedules",
    "megatron.core.pipeline_parallel.p2p_communication",
    "megatron.core.models.gpt",
    "megatron.core.tensor_parallel",
    "megatron.core.tensor_parallel.random",
    "megatron.core.dist_checkpointing",
    "megatron.core.dist_checkpointing.exchange_utils",
    "megatron.core.dist_checkpointing.strategies.torch",
    "megatron.core.dist_checkpointing.strategies.filesystem_async",
    "megatron.core.dist_checkpointing.strategies.state_dict_saver",
    "megatron.core.dist_checkpointing.strategies.fully_parallel",
    "megatron.core.dist_checkpointing.strategies.async_utils",
)
_installed = False


def _cpu_device(value: Any) -> Any:
    if isinstance(value, str) and value.startswith("cuda"):
        return "cpu"
    if isinstance(value, torch.device) and value.type == "cuda":
        return torch.device("cpu")
    if isinstance(value, int):  # a CUDA ordinal
        return "cpu"
    return value


def _redirect(fn: Any) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        if "device" in kwargs:
            kwargs["device"] = _cpu_device(kwargs["device"])
        return fn(*args, **kwargs)

    return call


class _CpuCuda(types.ModuleType):
    """``torch.cuda`` where synchronising is a no-op and the current device is the CPU."""

    def __init__(self) -> None:
        super().__init__("torch.cuda")
        self.synchronize = lambda *a, **k: None
        self.current_device = lambda: "cpu"
        # the model-parallel RNG tracker keeps "CUDA" states: the CPU generator's state here,
        # and seeding leaves the process's CPU generator alone (dropout is off in these tests)
        self.get_rng_state = lambda *a, **k: torch.get_rng_state()
        self.manual_seed = lambda *a, **k: None

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cuda, name)


class _CpuTorch(types.ModuleType):
    """``torch``, with tensor factories that put CUDA-placed tensors on the CPU."""

    def __init__(self) -> None:
        super().__init__("torch")
        for name in _FACTORIES:
            setattr(self, name, _redirect(getattr(torch, name)))
        self.cuda = _CpuCuda()

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


def _type_as_cuda_for_megatron(original: Any) -> Any:
    def type_(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        name = original(self, *args, **kwargs)
        if args or kwargs or not isinstance(name, str) or not name.startswith("torch."):
            return name
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller.startswith("megatron.core") and not name.startswith("torch.cuda."):
            return "torch.cuda." + name.removeprefix("torch.")
        return name

    return type_


def install() -> None:
    """Apply the redirections (idempotent; a no-op where CUDA is available)."""
    global _installed
    if _installed or torch.cuda.is_available():
        return
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment,return-value]
    torch.Tensor.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
    torch.Tensor.type = _type_as_cuda_for_megatron(torch.Tensor.type)  # type: ignore[method-assign]
    for name in _MODULES:
        importlib.import_module(name)
    from megatron.core.tensor_parallel import random as tp_random

    tp_random._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    tp_random._set_cuda_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
    proxy = _CpuTorch()
    for name, module in list(sys.modules.items()):
        if name.startswith("megatron.core") and getattr(module, "torch", None) is torch:
            module.torch = proxy  # type: ignore[attr-defined]
    _installed = True
