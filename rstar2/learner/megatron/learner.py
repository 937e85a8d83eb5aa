"""The megatron learner: the :class:`~rstar2.learner.protocol.Learner` protocol over a
megatron-core GPTModel with tensor and pipeline parallelism.

Same semantics as the torch backend (:mod:`rstar2.learner.torch_backend`):
- sequences packed into micro-batches of at most ``micro_batch_tokens_per_gpu`` tokens
  (:mod:`rstar2.learner.packing`), run as THD packed sequences through megatron's pipeline
  schedule (1F1B under PP);
- the GRPO-RoC loss aggregated exactly as over the whole batch: each micro-batch's loss is
  weighted by its share of the batch's tokens (or sequences), whatever the split;
- log-probs from vocab-parallel cross entropy on the last pipeline stage (the vocabulary is
  never gathered), broadcast to every rank;
- AdamW with linear warm-up and a global grad-norm clip, through megatron's optimizer
  (its distributed optimizer where there are data-parallel ranks); fp32 master weights.

Every rank of the learner's process group constructs one and calls every method (collectives);
results are the same on every rank. A process group is created (one rank) when none exists.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from rstar2.algo.loss import LossSettings
from rstar2.config import ConfigError, MegatronLearnerConfig, OptimConfig
from rstar2.learner.megatron import checkpoint
from rstar2.learner.megatron.convert import Dims, Fetch, Shard, mcore_shard
from rstar2.learner.megatron.export import hf_units
from rstar2.learner.megatron.layout import ModelShape, check_layout
from rstar2.learner.megatron.model import ModelSpec, build_model, rope_theta
from rstar2.learner.megatron.rope import rope_inverse_frequencies
from rstar2.learner.megatron.schedule import Objective, Pipeline
from rstar2.learner.megatron.setup import (
    build_optimizer,
    ensure_process_group,
    hf_fetch,
    load_weights,
    pick_device,
    wrap_ddp,
)
from rstar2.learner.packing import (
    BatchTotals,
    MicroBatch,
    micro_batch_objective,
    pack,
    plan,
    unpack,
)
from rstar2.learner.protocol import TrainSequence
from rstar2.learner.settings import run_fields

if TYPE_CHECKING:
    from rstar2.config import Config


@dataclass(frozen=True, kw_only=True)
class MegatronLearnerSettings:
    """The learner's config sections, whole, plus the run's weights, device, loss and seed."""

    model_path: str
    optim: OptimConfig = field(default_factory=OptimConfig)
    learner: MegatronLearnerConfig = field(
        default_factory=lambda: MegatronLearnerConfig(backend="megatron")
    )
    loss: LossSettings = field(default_factory=LossSettings)
    device: str = "auto"  # "auto": this rank's GPU when there is one, else cpu
    seed: int = 0

    @classmethod
    def from_config(
        cls, cfg: Config, model_path: str, *, optim: OptimConfig | None = None
    ) -> MegatronLearnerSettings:
        if not isinstance(cfg.learner, MegatronLearnerConfig):
            raise ConfigError("learner.backend", "this learner is the megatron backend")
        return cls(**run_fields(cfg, model_path, optim))


class MegatronLearner:
    def __init__(self, settings: MegatronLearnerSettings, *, weights: Fetch | None = None) -> None:
        """``weights`` fetches HF tensors by name (default: the safetensors of
        ``settings.model_path``, whose ``config.json`` gives the model's shape)."""
        from megatron.core import parallel_state as ps
        from transformers import AutoConfig

        self.settings = settings
        self.device = pick_device(settings.device)
        ensure_process_group(self.device)
        self.world = dist.get_world_size()
        self.hf_config = AutoConfig.from_pretrained(settings.model_path)
        self.layout = check_layout(settings.learner, ModelShape.from_hf(self.hf_config), self.world)
        if not ps.model_parallel_is_initialized():
            from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

            ps.initialize_model_parallel(self.layout.tensor_parallel, self.layout.pipeline_parallel)
            model_parallel_cuda_manual_seed(settings.seed)  # the RNG streams megatron forks
        elif (
            ps.get_tensor_model_parallel_world_size(),
            ps.get_pipeline_model_parallel_world_size(),
        ) != (
            self.layout.tensor_parallel,
            self.layout.pipeline_parallel,
        ):
            raise RuntimeError(
                "megatron's parallel state is set up for another layout in this process "
                "(megatron.core.parallel_state.destroy_model_parallel() first)"
            )
        self.shard = Shard(
            tp_rank=ps.get_tensor_model_parallel_rank(),
            tp=self.layout.tensor_parallel,
            pp_rank=ps.get_pipeline_model_parallel_rank(),
            pp=self.layout.pipeline_parallel,
        )
        # on GPU: bf16 parameters and compute, fp32 master weights and gradients (megatron's
        # mixed-precision optimizer); on CPU everything is fp32
        self.bf16 = self.device.type == "cuda"
        self.spec = ModelSpec(
            hf_config=self.hf_config,
            layout=self.layout,
            params_dtype=torch.bfloat16 if self.bf16 else torch.float32,
            activation_checkpointing=settings.learner.activation_checkpointing,
        )
        self.dims: Dims = self.spec.dims
        model = build_model(
            self.spec, pre_process=self.shard.first_stage, post_process=self.shard.last_stage
        )
        fetch = weights or hf_fetch(settings.model_path)
        load_weights(model, mcore_shard(fetch, self.dims, self.shard))
        self.data_parallel = self.layout.data_parallel
        self.dp_rank = ps.get_data_parallel_rank()
        self.model = wrap_ddp(model.to(self.device), distributed_optimizer=self.data_parallel > 1)
        inv_freq = rope_inverse_frequencies(
            rope_theta(self.hf_config), self.dims.head_dim, self.device
        )
        self.pipeline = Pipeline(self.model, self.spec, self.shard, inv_freq, self.device)
        self._step = 0
        self.reset_optimizer()

    @property
    def step(self) -> int:
        return self._step

    # ---- forward ----

    def compute_logprobs(self, batch: Sequence[TrainSequence]) -> list[list[float]]:
        """log p(token | prefix) of every token after the first (0.0 for the first), as the
        torch backend gives them; the same lists on every rank."""
        mbs, real = self._micro_batches(batch)
        self.model.eval()
        with torch.no_grad():
            outs = self.pipeline.run(mbs, forward_only=True, objective=None)
        mine: dict[int, list[float]] = {}
        if self.shard.last_stage and real:
            for mb, lp in zip(mbs, outs, strict=True):
                for i, values in zip(mb.indices, unpack(lp, mb.lengths), strict=True):
                    mine[i] = values
        found = self._from_last_stage(mine)
        if self.data_parallel > 1:
            from megatron.core import parallel_state as ps

            parts: list[Any] = [None] * self.data_parallel
            dist.all_gather_object(parts, found, group=ps.get_data_parallel_group())
            found = {i: v for part in parts for i, v in part.items()}
        return [found[i] for i in range(len(batch))]

    # ---- the update ----

    def train_step(self, batch: Sequence[TrainSequence]) -> dict[str, float]:
        if not batch:
            raise ValueError("an empty batch")
        settings, totals = self.settings.loss, BatchTotals.of(batch)
        mbs, real = self._micro_batches(batch)
        weight = self.data_parallel if real else 0.0  # DDP averages over data-parallel ranks

        def objective(mb: MicroBatch, lp: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
            value, metrics = micro_batch_objective(mb, lp, settings, totals)
            return value * weight, metrics

        return self._step_on(mbs, real, objective)

    def sft_step(self, batch: Sequence[TrainSequence]) -> dict[str, float]:
        """One optimizer step of supervised learning: the mean negative log-likelihood of the
        tokens where ``loss_mask`` is 1 (over the whole batch, across micro-batches and ranks)."""
        if not batch:
            raise ValueError("an empty batch")
        total = float(sum(sum(x.loss_mask) for x in batch))
        mbs, real = self._micro_batches(batch)
        weight = self.data_parallel / max(total, 1.0) if real else 0.0

        def objective(mb: MicroBatch, lp: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
            nll = -(lp * mb.loss_mask).sum()
            return nll * weight, {"nll": float(nll.detach()) / max(total, 1.0)}

        metrics = self._step_on(mbs, real, objective)
        metrics.pop("tokens")
        return metrics | {"loss_tokens": total}

    def _step_on(self, mbs: list[MicroBatch], real: bool, objective: Objective) -> dict[str, float]:
        """Forward and backward of every micro-batch with ``objective``, then the update; the
        objective's metrics summed over micro-batches and data-parallel ranks."""
        self.model.train()
        outs = self.pipeline.run(mbs, forward_only=False, objective=objective)
        sums: dict[str, float] = {}
        for metrics in outs:
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + (v if real else 0.0)
        sums = self._from_last_stage(sums)
        sums["tokens"] = float(sum(mb.num_tokens for mb in mbs)) if real else 0.0
        sums = self._sum_over_data_parallel(sums)
        return sums | self._apply_update()

    def reset_optimizer(self) -> None:
        """Fresh AdamW state and a new warm-up (a new RL stage); the step count goes on."""
        self.optimizer = build_optimizer(
            self.settings.optim, self.model, data_parallel=self.data_parallel, bf16=self.bf16
        )
        self._optimizer_steps = 0

    # ---- weights ----

    def named_weights(
        self, bucket_bytes: int, dtype: torch.dtype | None = None, *, every_rank: bool = False
    ) -> Iterator[list[tuple[str, Any]]]:
        """HF-named full tensors in buckets of whole decoder layers (every rank takes part and
        yields one list per bucket, in step; rank 0's hold the tensors, the others are empty:
        the shards are gathered to rank 0, so ``every_rank`` changes nothing here). The tensors
        stay on the learner's device, as the torch backend's do (a weight sync on a GPU is
        device to device: through host memory it ran at ~3 GB/s on an H100)."""
        bucket: list[tuple[str, Any]] = []
        size = 0
        units = hf_units(
            self.model.module, self.shard, self.dims, self.dp_rank, dtype, on_device=True
        )
        for unit in units:
            nbytes = _from_rank_0(sum(t.numel() * t.element_size() for _, t in unit))
            if size and size + nbytes > bucket_bytes:
                yield bucket
                bucket, size = [], 0
            bucket.extend(unit)
            size += nbytes
        if size:
            yield bucket

    def export_hf(self, folder: str | Path) -> None:
        """Write the policy as an HF folder (safetensors, the config, and the generation config
        of the weights it started from: engines take their stop tokens and sampling defaults
        from it); rank 0 writes."""
        state = {
            n: t
            for unit in hf_units(self.model.module, self.shard, self.dims, self.dp_rank, None)
            for n, t in unit
        }
        if dist.get_rank() == 0:
            from safetensors.torch import save_file

            out = Path(folder)
            out.mkdir(parents=True, exist_ok=True)
            save_file({n: t.contiguous() for n, t in state.items()}, out / "model.safetensors")
            self.hf_config.save_pretrained(out)
            _generation_config(self.settings.model_path, self.hf_config).save_pretrained(out)
        dist.barrier()

    def save(self, path: str | Path) -> None:
        """Model, optimizer, step counts and RNG states (:mod:`.checkpoint`); collective."""
        counters = checkpoint.Counters(
            step=self._step,
            optimizer_steps=self._optimizer_steps,
            tensor_parallel=self.layout.tensor_parallel,
            pipeline_parallel=self.layout.pipeline_parallel,
            data_parallel=self.layout.data_parallel,
        )
        checkpoint.save(Path(path), self.model, self.optimizer, counters)

    def load(self, path: str | Path) -> None:
        """Restore :meth:`save`'s folder, written at this or another TP/PP layout; collective."""
        counters = checkpoint.load(Path(path), self.model, self.optimizer, self.layout)
        self._step = counters.step
        self._optimizer_steps = counters.optimizer_steps

    def close(self) -> None:
        for name in ("pipeline", "model", "optimizer"):
            self.__dict__.pop(name, None)

    # ---- internals ----

    def _micro_batches(self, batch: Sequence[TrainSequence]) -> tuple[list[MicroBatch], bool]:
        """This data-parallel rank's share of ``batch`` (every ``data_parallel``-th sequence),
        packed (``indices`` refer to the whole batch), and whether it is real: a rank with no
        sequence runs the first one with weight 0, so every rank joins the reductions."""
        mine = list(range(self.dp_rank, len(batch), self.data_parallel))
        real = bool(mine)
        mine = mine or [0]
        budget = self.settings.learner.micro_batch_tokens_per_gpu
        groups = plan([len(batch[i].token_ids) for i in mine], budget)
        return [pack(batch, [mine[j] for j in g]).to(self.device) for g in groups], real

    def _apply_update(self) -> dict[str, float]:
        """Step the optimizer on the gradients the schedule reduced (data-parallel ranks,
        TP-replicated norms, tied embeddings across stages: megatron's finalize_model_grads);
        it clips to ``grad_clip_norm`` and returns the norm before clipping."""
        warmup = self.settings.optim.warmup_steps
        factor = min(1.0, (self._optimizer_steps + 1) / warmup) if warmup else 1.0
        lr = self.settings.optim.lr * factor
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        ok, grad_norm, _ = self.optimizer.step()
        if not ok:
            raise RuntimeError("the optimizer step failed (non-finite gradients)")
        self._zero_grads()
        self._optimizer_steps += 1
        self._step += 1
        return {"grad_norm": float(grad_norm), "lr": lr, "step": float(self._step)}

    def _zero_grads(self) -> None:
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()

    def _sum_over_data_parallel(self, values: dict[str, float]) -> dict[str, float]:
        if self.data_parallel == 1:
            return values
        from megatron.core import parallel_state as ps

        keys = sorted(values)
        device = self.device if dist.get_backend() == "nccl" else torch.device("cpu")
        t = torch.tensor([values[k] for k in keys], dtype=torch.float64, device=device)
        dist.all_reduce(t, group=ps.get_data_parallel_group(with_context_parallel=False))
        return dict(zip(keys, t.tolist(), strict=True))

    def _from_last_stage(self, value: Any) -> Any:
        """``value`` as the last pipeline stage has it, on every rank."""
        from megatron.core import parallel_state as ps

        if self.shard.pp == 1:
            return value
        box = [value]
        src = ps.get_pipeline_model_parallel_last_rank()
        dist.broadcast_object_list(box, src=src, group=ps.get_pipeline_model_parallel_group())
        return box[0]


def _generation_config(model_path: str, hf_config: Any) -> Any:
    """The source folder's generation config (as transformers' ``save_pretrained`` writes it
    for the torch backend), else one from the model config (its bos/eos/pad ids)."""
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(model_path)
    except OSError:
        return GenerationConfig.from_model_config(hf_config)


def _from_rank_0(value: int) -> int:
    """Rank 0's ``value`` on every rank (bucket sizes: only rank 0 holds the tensors)."""
    if dist.get_world_size() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return int(box[0])
