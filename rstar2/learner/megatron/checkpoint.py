"""Megatron learner checkpoints through megatron-core's ``dist_checkpointing``.

A checkpoint folder holds ``dist/`` (model and optimizer as sharded tensors: every rank writes
its own shards, and any TP/PP layout can load them, each rank reading only what it holds),
``learner.json`` (step counts and the layout that wrote it) and ``rng-rank{r}.pt`` per rank.

Guarantees: :func:`save` then :func:`load` at the same layout restores weights, fp32 master
weights, Adam moments, step counts and RNG states exactly (the next step is bit-identical). With
one data-parallel replica a checkpoint loads at any other TP/PP layout of one replica (weights and
optimizer state resharded; the RNG states, which belong to ranks of the old layout, are left as
they are). With the distributed optimizer (several replicas) megatron-core 0.16's format that
loads without TE/Apex (``dp_reshardable``) reshards over data-parallel ranks only: such a
checkpoint loads at the same TP and PP, any number of replicas above one; anything else is a
ConfigError saying so.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from rstar2.learner.megatron.layout import Layout

LEARNER_FILE = "learner.json"
# the distributed optimizer's format that loads at another data-parallel width (megatron-core
# 0.16 with its torch-Adam fallback: the model-space formats failed to load, see the notes)
DISTRIBUTED_OPTIMIZER_FORMAT = "dp_reshardable"


@dataclass(frozen=True)
class Counters:
    step: int
    optimizer_steps: int  # since the last reset_optimizer (the warm-up's position)
    tensor_parallel: int
    pipeline_parallel: int
    data_parallel: int

    def same_layout(self, layout: Layout) -> bool:
        return (self.tensor_parallel, self.pipeline_parallel, self.data_parallel) == (
            layout.tensor_parallel,
            layout.pipeline_parallel,
            layout.data_parallel,
        )


def save(folder: Path, model: Any, optimizer: Any, counters: Counters) -> None:
    """Write the checkpoint (every rank calls; collective)."""
    from megatron.core import dist_checkpointing

    materialize_adam_state(optimizer)
    rank = dist.get_rank()
    if rank == 0:
        (folder / "dist").mkdir(parents=True, exist_ok=True)
    dist.barrier()
    dist_checkpointing.save(_state(model, optimizer, loading=False), str(folder / "dist"))
    torch.save(_rng_state(), folder / f"rng-rank{rank}.pt")
    if rank == 0:
        (folder / LEARNER_FILE).write_text(json.dumps(asdict(counters)) + "\n")
    dist.barrier()


def load(folder: Path, model: Any, optimizer: Any, layout: Layout) -> Counters:
    """Restore ``folder`` into ``model`` and ``optimizer`` (every rank calls; collective);
    ConfigError when it is not a megatron learner checkpoint or was written at a layout this
    one cannot load (module docstring)."""
    from megatron.core import dist_checkpointing

    from rstar2.config import ConfigError

    meta = folder / LEARNER_FILE
    if not meta.is_file() or not (folder / "dist").is_dir():
        raise ConfigError(
            "learner.backend",
            f"{folder} is not a megatron learner checkpoint (no {LEARNER_FILE}): was it written "
            "with another learner backend?",
        )
    counters = Counters(**json.loads(meta.read_text()))
    distributed = (counters.data_parallel > 1, layout.data_parallel > 1)
    same_model_split = (counters.tensor_parallel, counters.pipeline_parallel) == (
        layout.tensor_parallel,
        layout.pipeline_parallel,
    )
    if distributed[0] != distributed[1] or (any(distributed) and not same_model_split):
        raise ConfigError(
            "learner",
            f"{folder} was written at TP={counters.tensor_parallel} x "
            f"PP={counters.pipeline_parallel} x DP={counters.data_parallel}; this learner is "
            f"TP={layout.tensor_parallel} x PP={layout.pipeline_parallel} x "
            f"DP={layout.data_parallel}. A checkpoint of several data-parallel replicas (the "
            "distributed optimizer) loads only at the same TP and PP with several replicas, and "
            "one of a single replica only with a single replica",
        )
    materialize_adam_state(optimizer)
    with torch.no_grad():  # the distributed optimizer's format loads only without autograd
        loaded = dist_checkpointing.load(
            _state(model, optimizer, loading=True), str(folder / "dist")
        )
        model.module.load_state_dict(loaded["model"])
        optimizer.load_state_dict(loaded["optimizer"])
    from rstar2.learner.megatron.setup import use_fused_adamw

    _own_step_counters(optimizer)
    use_fused_adamw(optimizer)  # a loaded state's groups carry the saving process's kernels
    rng = folder / f"rng-rank{dist.get_rank()}.pt"
    if counters.same_layout(layout) and rng.is_file():
        _set_rng_state(torch.load(rng, weights_only=False))
    dist.barrier()
    return counters


def materialize_adam_state(optimizer: Any) -> None:
    """Give every parameter of megatron's (torch) AdamW a state where it has none yet: zero
    moments and step 0, which is exactly what AdamW starts from. megatron-core's distributed
    optimizer cannot describe its state for a checkpoint before the first step otherwise (its
    TE/Apex-free path reads every parameter's ``step``)."""
    for part in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = part.optimizer
        for group in inner.param_groups:
            on_device = group.get("fused") or group.get("capturable")
            for param in group["params"]:
                if not inner.state[param]:
                    inner.state[param] = {
                        "step": torch.tensor(
                            0.0, dtype=torch.float32, device=param.device if on_device else "cpu"
                        ),
                        "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
                        "exp_avg_sq": torch.zeros_like(param, memory_format=torch.preserve_format),
                    }


def _own_step_counters(optimizer: Any) -> None:
    """Set every parameter's AdamW ``step`` to the step the checkpoint recorded, in a tensor of
    its own. megatron-core 0.16's distributed optimizer keeps that step in its param groups and,
    for torch's AdamW (no TE/Apex), leaves the per-parameter ``step`` of a loaded state at what
    the state held before the load, or one tensor shared by every parameter (which AdamW's
    multi-tensor step then advances once per parameter): either way the bias corrections after
    a resume were wrong (found as a resume that was not bit-exact at DP=2)."""
    for part in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = part.optimizer
        for group in inner.param_groups:
            step = group.get("step")
            for param in group["params"]:
                state = inner.state.get(param)
                if not state or "step" not in state:
                    continue
                value = float(step) if step is not None else float(state["step"])
                state["step"] = torch.tensor(
                    value, dtype=torch.float32, device=state["step"].device
                )


def _state(model: Any, optimizer: Any, *, loading: bool) -> dict[str, Any]:
    model_state = model.module.sharded_state_dict()
    metadata = {"distrib_optim_sharding_type": DISTRIBUTED_OPTIMIZER_FORMAT}
    return {
        "model": model_state,
        "optimizer": optimizer.sharded_state_dict(
            model_state, is_loading=loading, metadata=metadata
        ),
    }


def _rng_state() -> dict[str, Any]:
    from megatron.core import tensor_parallel

    state: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    state["tracker"] = tensor_parallel.get_cuda_rng_tracker().get_states()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    from megatron.core import tensor_parallel

    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    tensor_parallel.get_cuda_rng_tracker().set_states(state["tracker"])
