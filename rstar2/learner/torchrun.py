"""A learner-only job under ``torchrun`` (``rstar2 sft`` on several ranks): how many ranks
torchrun started, and their process group.

torchrun starts every rank with the same command; each rank builds the learner of
``learner.num_ranks`` ranks (which must be torchrun's world size) and is given the whole batch,
taking its data-parallel share itself (:class:`~rstar2.learner.protocol.Learner`). Rank 0
alone writes the run folder.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch
import torch.distributed as dist


def torchrun_world(env: Mapping[str, str] | None = None) -> int | None:
    """The number of ranks torchrun (or another launcher with its environment) started this
    process among, or None when it was not started that way."""
    env = os.environ if env is None else env
    if "WORLD_SIZE" in env and "RANK" in env and "MASTER_ADDR" in env:
        return int(env["WORLD_SIZE"])
    return None


def init_torchrun_group(accelerator: str) -> torch.device:
    """Join torchrun's process group (NCCL on GPUs, RCCL being torch's "nccl" on ROCm; gloo on
    CPU) and return this rank's device (its node-local GPU, ``LOCAL_RANK``)."""
    if accelerator != "cpu" and torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend)
    return device


def broadcast_from_rank0(value: str) -> str:
    """Rank 0's ``value`` on every rank (one name for the run folder, say)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return str(box[0])
