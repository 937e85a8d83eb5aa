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
from rstar2.learner.megatron.convert import Dims, Fetch, Shard, hf_tensors, mcore_shard
from rstar2.learner.megatron.layout import ModelShape, check_layout
from rstar2.learner.megatron.model import ModelSpec, build_model
from rstar2.learner.megatron.setup import (
    ensure_process_group,
    hf_fetch,
    load_weights,
    pick_device,
    wrap_ddp,
)
from rstar2.learner.packing import MicroBatch, micro_batch_loss, pack, plan, unpack
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
            ps.initialize_model_parallel(self.layout.tensor_parallel, self.layout.pipeline_parallel)
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
            outs = self._run(mbs, forward_only=True, loss=None)
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
        per_seq = self.settings.loss.loss_agg_mode != "token-mean"
        total = float(len(batch)) if per_seq else float(sum(sum(x.loss_mask) for x in batch))
        mbs, real = self._micro_batches(batch)
        self.model.train()
        weight = self.data_parallel if real else 0.0  # DDP averages over data-parallel ranks
        outs = self._run(mbs, forward_only=False, loss=(per_seq, max(total, 1.0), weight))
        sums: dict[str, float] = {}
        for metrics in outs:
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + (v if real else 0.0)
        sums = self._from_last_stage(sums)
        sums["tokens"] = float(sum(mb.num_tokens for mb in mbs)) if real else 0.0
        sums = self._sum_over_data_parallel(sums)
        return sums | self._apply_update()

    def sft_step(self, batch: Sequence[TrainSequence]) -> dict[str, float]:
        raise NotImplementedError("SFT with the megatron backend is not implemented yet")

    def reset_optimizer(self) -> None:
        """Fresh AdamW state and a new warm-up (a new RL stage); the step count goes on."""
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        o = self.settings.optim
        config = OptimizerConfig(
            optimizer="adam",
            lr=o.lr,
            weight_decay=o.weight_decay,
            adam_beta1=o.betas[0],
            adam_beta2=o.betas[1],
            clip_grad=o.grad_clip_norm,
            use_distributed_optimizer=self.data_parallel > 1,
            bf16=self.bf16,
            params_dtype=self.spec.params_dtype,
        )
        self.optimizer = get_megatron_optimizer(config, [self.model])
        self._optimizer_steps = 0

    # ---- weights ----

    def named_weights(
        self, bucket_bytes: int, dtype: torch.dtype | None = None
    ) -> Iterator[list[tuple[str, Any]]]:
        """HF-named full tensors in buckets of whole decoder layers (every rank takes part;
        rank 0 yields the tensors, the others empty buckets)."""
        bucket: list[tuple[str, Any]] = []
        size = 0
        for unit in self._hf_units(dtype):
            nbytes = sum(t.numel() * t.element_size() for _, t in unit)
            if bucket and size + nbytes > bucket_bytes:
                yield bucket
                bucket, size = [], 0
            bucket.extend(unit)
            size += nbytes
        if bucket or dist.get_rank() != 0:
            yield bucket

    def export_hf(self, folder: str | Path) -> None:
        """Write the policy as an HF folder (safetensors, the run's config); rank 0 writes."""
        state = {n: t for unit in self._hf_units(None) for n, t in unit}
        if dist.get_rank() == 0:
            from safetensors.torch import save_file

            out = Path(folder)
            out.mkdir(parents=True, exist_ok=True)
            save_file({n: t.contiguous() for n, t in state.items()}, out / "model.safetensors")
            self.hf_config.save_pretrained(out)
        dist.barrier()

    def close(self) -> None:
        for name in ("model", "optimizer"):
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

    def _run(
        self,
        mbs: list[MicroBatch],
        *,
        forward_only: bool,
        loss: tuple[bool, float, float] | None,
    ) -> list[Any]:
        """Every micro-batch through the pipeline; the last stage's per-micro-batch outputs."""
        from megatron.core.packed_seq_params import PackedSeqParams
        from megatron.core.pipeline_parallel import get_forward_backward_func

        settings = self.settings.loss
        n = len(mbs)
        it = iter(mbs)

        def forward_step(_data: Any, model: Any) -> tuple[torch.Tensor, Any]:
            mb = next(it)
            bounds = [0, *torch.tensor(mb.lengths).cumsum(0).tolist()]
            cu = torch.tensor(bounds, dtype=torch.int32, device=self.device)
            longest = max(mb.lengths)
            packed = PackedSeqParams(
                qkv_format="thd",
                cu_seqlens_q=cu,
                cu_seqlens_kv=cu,
                max_seqlen_q=longest,
                max_seqlen_kv=longest,
            )
            out = model(
                input_ids=mb.input_ids,
                position_ids=mb.position_ids,
                attention_mask=None,
                packed_seq_params=packed,
            )

            def reduce(logits: torch.Tensor) -> tuple[torch.Tensor, Any]:
                lp = self._token_logprobs(logits, mb.targets) * mb.valid  # [1, T]
                if loss is None:
                    return lp.sum() * 0, lp[0].detach()
                per_seq, total, weight = loss
                value, metrics = micro_batch_loss(mb, lp, settings)
                share = (len(mb.indices) if per_seq else float(mb.loss_mask.sum())) / total
                weighted = {k: v * share for k, v in metrics.items()}
                # the schedule divides by the number of micro-batches: undo it
                return value * share * n * weight, weighted

            return out, reduce

        run = get_forward_backward_func()
        return list(
            run(
                forward_step_func=forward_step,
                data_iterator=iter(range(n)),
                model=[self.model],
                num_microbatches=n,
                seq_length=max(mb.num_tokens for mb in mbs),
                micro_batch_size=1,
                forward_only=forward_only,
            )
        )

    def _token_logprobs(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """log p(target) from this rank's vocabulary slice of ``logits`` [1, T, V/TP], by
        vocab-parallel cross entropy (the vocabulary is never gathered). The padding rows of
        the vocabulary are masked out, so the distribution is the HF model's."""
        from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

        logits = logits.float()
        width = logits.shape[-1]
        start = self.shard.tp_rank * width
        if start + width > self.dims.vocab_size:
            padding = torch.arange(start, start + width, device=logits.device)
            logits = logits.masked_fill(padding >= self.dims.vocab_size, float("-inf"))
        nll = vocab_parallel_cross_entropy(logits.transpose(0, 1), targets.transpose(0, 1))
        return -nll.transpose(0, 1)

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

    def _hf_units(self, dtype: torch.dtype | None) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """One list per decoder layer (and per other module) of HF-named full tensors, in layer
        order, on global rank 0 (empty elsewhere): gathered over TP within each stage, then
        sent to rank 0 by the stage's leader (TP rank 0 of data-parallel replica 0)."""
        from megatron.core import parallel_state as ps

        gpt = self.model.module
        params = dict(gpt.named_parameters())
        mine = (self.shard.pp_rank, self.shard.tp_rank, self.dp_rank, list(params))
        everyone: list[Any] = [None] * self.world
        dist.all_gather_object(everyone, mine)
        rank = dist.get_rank()
        per_stage = self.dims.num_layers // self.shard.pp
        for stage in range(self.shard.pp):
            leader = next(
                r for r, (p, t, d, _) in enumerate(everyone) if (p, t, d) == (stage, 0, 0)
            )
            names = everyone[leader][3]
            offset = stage * per_stage
            unit: list[tuple[str, torch.Tensor]] = []
            key: str | None = None
            for name in names:
                shards: list[torch.Tensor] | None = None
                if self.shard.pp_rank == stage:
                    param = params[name].detach().contiguous()
                    gathered = [torch.empty_like(param) for _ in range(self.shard.tp)]
                    dist.all_gather(gathered, param, group=ps.get_tensor_model_parallel_group())
                    shards = [t.cpu() for t in gathered]
                if leader != 0 and rank in (0, leader):
                    box: list[Any] = [shards]
                    if rank == leader:
                        dist.send_object_list(box, dst=0)
                    else:
                        dist.recv_object_list(box, src=leader)
                        shards = box[0]
                if rank != 0 or shards is None:
                    continue
                this = _unit_key(name, offset)
                if unit and this != key:
                    yield unit
                    unit = []
                key = this
                for hf_name, t in hf_tensors(name, shards, self.dims, offset):
                    unit.append((hf_name, t if dtype is None else t.to(dtype)))
            if unit:
                yield unit

    def _sum_over_data_parallel(self, values: dict[str, float]) -> dict[str, float]:
        if self.data_parallel == 1:
            return values
        from megatron.core import parallel_state as ps

        keys = sorted(values)
        t = torch.tensor([values[k] for k in keys], dtype=torch.float64)
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


def _unit_key(name: str, offset: int) -> str:
    parts = name.split(".")
    if parts[:2] == ["decoder", "layers"]:
        return f"layer{int(parts[2]) + offset}"
    return parts[0]
