"""Run under torchrun with 2 ranks (gloo): FSDP2 training, sharded save / load, weights out.

    torchrun --nproc_per_node 2 -m tests.helpers.fsdp_worker MODEL_DIR OUT_DIR

Every rank is given the whole of tests.helpers.learner_data.random_batch(8, seed=1) and trains on
its half:
two steps, a sharded checkpoint after the first, then a fresh learner loads it and repeats the
second step. Rank 0 writes both runs' final weights to OUT_DIR; every rank writes what it would
hand vLLM's IPC sender (``spread<rank>.pt``, see ``weights_on_this_rank``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

from rstar2.config import OptimConfig, TorchLearnerConfig
from rstar2.learner.torch_backend import TorchLearner, TorchLearnerSettings
from tests.helpers.learner_data import full_weights, random_batch, weights_on_this_rank


def main() -> None:
    model_dir, out = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    batch = random_batch(8, seed=1)
    settings = TorchLearnerSettings(
        model_path=model_dir,
        optim=OptimConfig(lr=1e-2, warmup_steps=0),
        learner=TorchLearnerConfig(micro_batch_tokens_per_gpu=64),
        device="cpu",
    )
    learner = TorchLearner(settings)
    learner.train_step(batch)
    learner.save(out / "ckpt")
    second = learner.train_step(batch)
    full = full_weights(learner)
    resumed = TorchLearner(settings)
    resumed.load(out / "ckpt")
    again = resumed.train_step(batch)
    full_again = full_weights(resumed)
    torch.save(weights_on_this_rank(resumed, 40_000), out / f"spread{rank}.pt")
    if rank == 0:
        torch.save({"weights": full, "metrics": second}, out / "run.pt")
        torch.save({"weights": full_again, "metrics": again}, out / "resumed.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
