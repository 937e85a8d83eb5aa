"""The megatron model's weights as HF-named full tensors (weight sync and HF export).

Every rank of the learner calls :func:`hf_units` and iterates it to the end (collectives); global
rank 0 receives the tensors, in layer order, whole layers at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from rstar2.learner.megatron.convert import Dims, Shard, hf_tensors


def hf_units(
    gpt: Any,
    shard: Shard,
    dims: Dims,
    dp_rank: int,
    dtype: torch.dtype | None,
    *,
    on_device: bool = False,
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """One list per decoder layer (and per other module) of HF-named full tensors, in layer
    order, on global rank 0 (empty elsewhere): gathered over TP within each stage, then
    sent to rank 0 by the stage's leader (TP rank 0 of data-parallel replica 0). Every rank
    yields one list per unit, after that unit's collectives (in step). The tensors are on the
    host, or with ``on_device`` on the parameters' device (a weight sync: no round trip through
    host memory), except a later pipeline stage's, which reach rank 0 through the host."""
    from megatron.core import parallel_state as ps

    params = dict(gpt.named_parameters())
    mine = (shard.pp_rank, shard.tp_rank, dp_rank, list(params))
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    rank = dist.get_rank()
    per_stage = dims.num_layers // shard.pp
    for stage in range(shard.pp):
        leader = next(r for r, (p, t, d, _) in enumerate(everyone) if (p, t, d) == (stage, 0, 0))
        names = everyone[leader][3]
        offset = stage * per_stage
        unit: list[tuple[str, torch.Tensor]] = []
        key: str | None = None
        for name in names:
            shards: list[torch.Tensor] | None = None
            if shard.pp_rank == stage:
                param = params[name].detach().contiguous()
                gathered = [torch.empty_like(param) for _ in range(shard.tp)]
                dist.all_gather(gathered, param, group=ps.get_tensor_model_parallel_group())
                # pickled to rank 0 (another stage's leader) or asked for on the host: copied
                shards = gathered if on_device and leader == 0 else [t.cpu() for t in gathered]
            if leader != 0 and rank in (0, leader):
                box: list[Any] = [shards]
                if rank == leader:
                    dist.send_object_list(box, dst=0)
                else:
                    dist.recv_object_list(box, src=leader)
                    shards = box[0]
            this = _unit_key(name, offset)
            if key is not None and this != key:  # every rank sees the same names: in step
                yield unit
                unit = []
            key = this
            if rank == 0 and shards is not None:
                for hf_name, t in hf_tensors(name, shards, dims, offset):
                    unit.append((hf_name, t if dtype is None else t.to(dtype)))
        if key is not None:
            yield unit


def _unit_key(name: str, offset: int) -> str:
    parts = name.split(".")
    if parts[:2] == ["decoder", "layers"]:
        return f"layer{int(parts[2]) + offset}"
    return parts[0]
