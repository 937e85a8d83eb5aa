"""Megatron learner checkpoints through megatron-core's ``dist_checkpointing``.

A checkpoint folder holds ``dist/`` (model and optimizer as sharded tensors: every rank writes
its own shards, and any TP/PP layout can load them, each rank reading only what it holds),
``learner.json`` (step counts and the layout that wrote it) and ``rng-rank{r}.pt`` per rank.

Guarantees: :func:`save` then :func:`load` at the same layout restores weights, fp32 master
weights, Adam moments, step counts and RNG states exactly (the next step is bit-identical); at
another layout the weights and optimizer state are resharded and the RNG states, which belong to
ranks of the old layout, are left as they are.
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
    FileNotFoundError when it is not a megatron learner checkpoint."""
    from megatron.core import dist_checkpointing

    meta = folder / LEARNER_FILE
    if not meta.is_file() or not (folder / "dist").is_dir():
        raise FileNotFoundError(
            f"{folder} is not a megatron learner checkpoint (no {LEARNER_FILE})"
        )
    counters = Counters(**json.loads(meta.read_text()))
    with torch.no_grad():  # the distributed optimizer's format loads only without autograd
        loaded = dist_checkpointing.load(
            _state(model, optimizer, loading=True), str(folder / "dist")
        )
        model.module.load_state_dict(loaded["model"])
        optimizer.load_state_dict(loaded["optimizer"])
    rng = folder / f"rng-rank{dist.get_rank()}.pt"
    if counters.same_layout(layout) and rng.is_file():
        _set_rng_state(torch.load(rng, weights_only=False))
    dist.barrier()
    return counters


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
