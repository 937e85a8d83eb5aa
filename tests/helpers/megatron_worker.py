"""One rank of a megatron learner run on CPU, for the parity tests:

    python -m torch.distributed.run --nproc-per-node N -m tests.helpers.megatron_worker \\
        MODEL_DIR OUT.pt TP PP

For each loss aggregation, a fresh learner on MODEL_DIR gives: the batch's log-probs, one train
step's metrics and gradients (HF-named, gathered), the log-probs after it, and the exported HF
weights; rank 0 writes them all to OUT.pt.
"""

from __future__ import annotations

import sys

from tests.helpers.megatron_cpu import install

install()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from rstar2.algo.loss import LossSettings  # noqa: E402
from rstar2.config import MegatronLearnerConfig, OptimConfig  # noqa: E402
from rstar2.learner.megatron.convert import hf_tensors  # noqa: E402
from rstar2.learner.megatron.learner import MegatronLearner, MegatronLearnerSettings  # noqa: E402
from tests.helpers.learner_data import random_batch  # noqa: E402

AGGREGATIONS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")
PARITY_OPTIM = OptimConfig(lr=1e-3, warmup_steps=0, weight_decay=0.0)
MICRO_BATCH_TOKENS = 96  # several micro-batches per step


def settings(model_dir: str, tp: int, pp: int, agg: str) -> MegatronLearnerSettings:
    return MegatronLearnerSettings(
        model_path=model_dir,
        optim=PARITY_OPTIM,
        learner=MegatronLearnerConfig(
            backend="megatron",
            tensor_parallel_size=tp,
            pipeline_parallel_size=pp,
            micro_batch_tokens_per_gpu=MICRO_BATCH_TOKENS,
            activation_checkpointing=False,
        ),
        loss=LossSettings(loss_agg_mode=agg),  # type: ignore[arg-type]
        device="cpu",
    )


def _gradients(learner: MegatronLearner) -> dict[str, torch.Tensor]:
    """This stage's accumulated gradients, gathered over TP, HF-named (with global indices)."""
    from megatron.core import parallel_state as ps

    offset = learner.shard.layers(learner.dims.num_layers).start
    out: dict[str, torch.Tensor] = {}
    for name, param in learner.model.module.named_parameters():
        grad = param.main_grad.detach().contiguous()
        shards = [torch.empty_like(grad) for _ in range(learner.shard.tp)]
        dist.all_gather(shards, grad, group=ps.get_tensor_model_parallel_group())
        out.update(hf_tensors(name, shards, learner.dims, offset))
    every: list[dict[str, torch.Tensor] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(every, out)
    return {k: v for part in every if part for k, v in part.items()}


def run(model_dir: str, tp: int, pp: int, agg: str) -> dict[str, object]:
    learner = MegatronLearner(settings(model_dir, tp, pp, agg))
    batch = random_batch(6, seed=0)
    before = learner.compute_logprobs(batch)
    grads: dict[str, torch.Tensor] = {}
    step = learner._apply_update

    def capture_then_step() -> dict[str, float]:
        grads.update(_gradients(learner))
        return step()

    learner._apply_update = capture_then_step  # type: ignore[method-assign]
    metrics = learner.train_step(batch)
    after = learner.compute_logprobs(batch)
    weights = {n: t.clone() for bucket in learner.named_weights(1 << 20) for n, t in bucket}
    learner.close()
    return {
        "before": before,
        "after": after,
        "metrics": metrics,
        "grads": grads,
        "weights": weights,
    }


def main(model_dir: str, out: str, tp: int, pp: int) -> None:
    results = {agg: run(model_dir, tp, pp, agg) for agg in AGGREGATIONS}
    if dist.get_rank() == 0:
        torch.save(results, out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
