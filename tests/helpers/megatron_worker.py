"""One rank of a megatron learner run on CPU, for the parity and checkpoint tests:

    python -m torch.distributed.run --nproc-per-node N -m tests.helpers.megatron_worker \\
        parity MODEL_DIR OUT.pt TP PP [sp]
    python -m torch.distributed.run --nproc-per-node 2 -m tests.helpers.megatron_worker \\
        checkpoint|checkpoint-dp MODEL_DIR OUT.pt CHECKPOINT_DIR

parity (``sp``: with sequence parallelism): for each loss aggregation, a fresh learner on
MODEL_DIR gives the batch's log-probs, one train step's metrics and gradients (HF-named,
gathered), the log-probs after it, and the exported HF weights; and one SFT step's metrics and
weights.
checkpoint: at TP=2, a step, a save, and the next step; a fresh TP=2 learner loads and takes the
same next step; a PP=2 learner loads the same checkpoint, gives its log-probs and takes the step.
checkpoint-dp: the same at DP=2 (see :func:`checkpoint_data_parallel`).
spread: at PP=2, then TP=2, what each rank hands vLLM's IPC sender (``weights_on_this_rank``)
and rank 0's full weights.
jobs OUT.pt SPEC_JSON: several of these in one set of rank processes (:func:`jobs`), so a test
module pays the processes' start once.
Rank 0 writes the results to OUT.pt.
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
from tests.helpers.learner_data import (  # noqa: E402
    full_weights,
    random_batch,
    weights_on_this_rank,
)
from tests.helpers.megatron_params import (  # noqa: E402
    AGGREGATIONS,
    CHECKPOINT_OPTIM,
    MICRO_BATCH_TOKENS,
    PARITY_OPTIM,
)


def settings(
    model_dir: str,
    tp: int,
    pp: int,
    agg: str,
    optim: OptimConfig = PARITY_OPTIM,
    sequence_parallel: bool = False,
) -> MegatronLearnerSettings:
    return MegatronLearnerSettings(
        model_path=model_dir,
        optim=optim,
        learner=MegatronLearnerConfig(
            backend="megatron",
            tensor_parallel_size=tp,
            pipeline_parallel_size=pp,
            sequence_parallel=sequence_parallel,
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


def run(model_dir: str, tp: int, pp: int, agg: str, sp: bool) -> dict[str, object]:
    learner = MegatronLearner(settings(model_dir, tp, pp, agg, sequence_parallel=sp))
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
    weights = full_weights(learner)
    learner.close()
    return {
        "before": before,
        "after": after,
        "metrics": metrics,
        "grads": grads,
        "weights": weights,
    }


def run_sft(model_dir: str, tp: int, pp: int, sp: bool) -> dict[str, object]:
    learner = MegatronLearner(settings(model_dir, tp, pp, "token-mean", sequence_parallel=sp))
    metrics = learner.sft_step(random_batch(6, seed=0))
    weights = full_weights(learner)
    learner.close()
    return {"metrics": metrics, "weights": weights}


def parity(model_dir: str, tp: int, pp: int, sp: bool) -> dict[str, object]:
    results: dict[str, object] = {agg: run(model_dir, tp, pp, agg, sp) for agg in AGGREGATIONS}
    return results | {"sft": run_sft(model_dir, tp, pp, sp)}


def checkpoint(model_dir: str, folder: str) -> dict[str, object]:
    from megatron.core import parallel_state as ps

    first, second, probe = (random_batch(6, seed=s) for s in (1, 2, 3))

    def learner(tp: int, pp: int) -> MegatronLearner:
        return MegatronLearner(settings(model_dir, tp, pp, "token-mean", CHECKPOINT_OPTIM))

    a = learner(2, 1)
    a.train_step(first)
    a.save(folder)
    saved = a.compute_logprobs(probe)
    going_on = {"metrics": a.train_step(second), "weights": full_weights(a)}
    going_on["after"] = a.compute_logprobs(probe)
    a.close()
    b = learner(2, 1)
    b.load(folder)
    resumed = {"step": b.step, "metrics": b.train_step(second), "weights": full_weights(b)}
    b.close()
    ps.destroy_model_parallel()
    c = learner(1, 2)
    c.load(folder)
    resharded = {"logprobs": c.compute_logprobs(probe), "metrics": c.train_step(second)}
    resharded["after"] = c.compute_logprobs(probe)
    c.close()
    return {"saved": saved, "going_on": going_on, "resumed": resumed, "resharded": resharded}


def checkpoint_data_parallel(model_dir: str, folder: str) -> dict[str, object]:
    """At DP=2 (the distributed optimizer): a checkpoint saved right after the optimizer is
    built (no state yet) and one after a step both load; the next step is bit-identical; a
    single-replica layout refuses the checkpoint with the reason."""
    from megatron.core import parallel_state as ps

    from rstar2.config import ConfigError

    first, second = (random_batch(6, seed=s) for s in (1, 2))

    def learner(tp: int) -> MegatronLearner:
        return MegatronLearner(settings(model_dir, tp, 1, "token-mean", CHECKPOINT_OPTIM))

    a = learner(1)
    a.save(folder + "-fresh")
    a.train_step(first)
    a.save(folder)
    going_on = {"metrics": a.train_step(second), "weights": full_weights(a)}
    a.close()
    b = learner(1)
    b.load(folder + "-fresh")
    b.load(folder)
    resumed = {"metrics": b.train_step(second), "weights": full_weights(b)}
    b.close()
    ps.destroy_model_parallel()
    c = learner(2)
    try:
        c.load(folder)
        refused = ""
    except ConfigError as e:
        refused = str(e)
    c.close()
    return {"going_on": going_on, "resumed": resumed, "refused": refused}


def spread(model_dir: str) -> dict[str, object]:
    from megatron.core import parallel_state as ps

    out: dict[str, object] = {}
    for tp, pp in ((1, 2), (2, 1)):
        learner = MegatronLearner(settings(model_dir, tp, pp, "token-mean"))
        here = weights_on_this_rank(learner, 40_000)
        every: list[object] = [None] * dist.get_world_size()
        dist.all_gather_object(every, here)
        out[f"tp{tp}pp{pp}"] = {"ranks": every, "full": full_weights(learner)}
        learner.close()
        ps.destroy_model_parallel()
    return out


def job(mode: str, model_dir: str, *args: str) -> dict[str, object]:
    """One run of ``mode`` (the module docstring's modes and their arguments)."""
    if mode == "parity":
        return parity(model_dir, int(args[0]), int(args[1]), list(args[2:]) == ["sp"])
    if mode == "spread":
        return spread(model_dir)
    if mode == "checkpoint":
        return checkpoint(model_dir, args[0])
    if mode == "checkpoint-dp":
        return checkpoint_data_parallel(model_dir, args[0])
    raise ValueError(f"unknown mode {mode!r}")


def jobs(spec: str) -> dict[str, object]:
    """Several runs in these processes, one after another (megatron's model-parallel state torn
    down between them): ``spec`` is a JSON object, a name for each run's argument list. A run
    that raises on every rank is recorded as ``{"error": its traceback}`` and the next one runs;
    the results are by name."""
    import json
    import traceback

    from megatron.core import parallel_state as ps

    out: dict[str, object] = {}
    for name, argv in json.loads(spec).items():
        try:
            out[name] = job(*argv)
        except Exception:
            out[name] = {"error": traceback.format_exc()}
        ps.destroy_model_parallel()
        dist.barrier()
    return out


def main(argv: list[str]) -> None:
    if argv[0] == "jobs":  # jobs OUT.pt SPEC_JSON
        out, results = argv[1], jobs(argv[2])
    else:
        out, results = argv[2], job(argv[0], argv[1], *argv[3:])
    if dist.get_rank() == 0:
        torch.save(results, out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":  # dist_checkpointing starts a spawn-context manager: keep the guard
    main(sys.argv[1:])
