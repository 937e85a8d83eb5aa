"""The torch learner: a transformers causal LM (Qwen3 / Qwen2 from an HF folder), FSDP2 when
several ranks run it (``torchrun``; gloo on CPU, NCCL/RCCL on GPU).

- Sequences are packed into rows of at most ``micro_batch_tokens_per_gpu`` tokens with per-sequence
  position ids (:mod:`rstar2.learner.packing`); gradients accumulate over the micro-batches and
  one AdamW step (linear warm-up, global grad-norm clip) follows.
- The loss is :func:`rstar2.algo.loss.policy_loss`, aggregated exactly as over the whole batch
  (across micro-batches and ranks), whatever the micro-batch split. Under several ranks every
  rank is given the whole batch and takes its share (every ``world``-th sequence).
- Parameters and optimizer state are fp32; on GPU the forward runs under bf16 autocast.
- Checkpoints use torch.distributed.checkpoint (sharded under FSDP2) plus each rank's LR
  schedule and step: load then train equals the uninterrupted run bit for bit on CPU. A step
  draws no random numbers (no dropout), so the learner neither reads nor resets anyone's RNG.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from rstar2.algo.loss import LossSettings
from rstar2.config import ConfigError, OptimConfig, TorchLearnerConfig
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
class TorchLearnerSettings:
    """The learner's own config sections, whole, plus what the run decides: which weights,
    which device, the loss (from ``algorithm``) and the seed. SFT passes an ``optim`` with its
    own learning rate and warm-up."""

    model_path: str
    optim: OptimConfig = field(default_factory=OptimConfig)
    learner: TorchLearnerConfig = field(default_factory=TorchLearnerConfig)
    loss: LossSettings = field(default_factory=LossSettings)
    device: str = "auto"  # "auto": cuda when available, else cpu
    bf16_autocast: bool = True  # on GPU; parameters and optimizer state stay fp32
    # "auto": flex_attention on GPU (packed rows as block-sparse masks: 1.45x SDPA's tokens/s
    # for a Qwen3-1.7B shape on an H200), sdpa on CPU
    attn_implementation: str = "auto"
    seed: int = 0

    @classmethod
    def from_config(
        cls, cfg: Config, model_path: str, *, optim: OptimConfig | None = None
    ) -> TorchLearnerSettings:
        """The settings a run's config gives; ``optim`` replaces ``cfg.optim`` (SFT's)."""
        if not isinstance(cfg.learner, TorchLearnerConfig):
            raise ConfigError("learner.backend", "this learner is the torch backend")
        return cls(**run_fields(cfg, model_path, optim))


class TorchLearner:
    """See the module docstring. Under torchrun, call after ``dist.init_process_group``."""

    def __init__(self, settings: TorchLearnerSettings, model: Any = None) -> None:
        """``model``: an already built transformers causal LM (fp32) to train instead of
        loading ``settings.model_path`` (benchmarks build random-init models this way)."""
        from transformers import AutoModelForCausalLM

        self.settings = settings
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        self.device = _pick_device(settings.device, self.rank)
        self.bf16_autocast = settings.bf16_autocast  # may be switched off, e.g. for parity runs
        if model is None:
            with torch.random.fork_rng(devices=[]):  # any weight it initialises: seeded, and
                torch.manual_seed(settings.seed)  # the caller's global RNG left as it was
                model = AutoModelForCausalLM.from_pretrained(
                    settings.model_path,
                    dtype=torch.float32,
                    attn_implementation=_attention(settings.attn_implementation, self.device),
                )
        model.config.use_cache = False
        if settings.learner.activation_checkpointing:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        model.to(self.device)
        if self.world > 1:
            from torch.distributed.fsdp import fully_shard

            for layer in model.model.layers:
                fully_shard(layer)
            fully_shard(model)
        self.model = model
        self._offloaded: list[tuple[dict[str, Any], str]] = []  # optimizer state moved to host
        self._on_host = False
        self.reset_optimizer()
        self._step = 0

    @property
    def step(self) -> int:
        return self._step

    def reset_optimizer(self) -> None:
        """Fresh AdamW state and a new warm-up (a new RL stage); the step count goes on."""
        self.reload()
        settings = self.settings
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=settings.optim.lr,
            betas=settings.optim.betas,
            weight_decay=settings.optim.weight_decay,
        )
        warmup = settings.optim.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0
        )

    # ---- forward ----

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.device.type == "cuda" and self.bf16_autocast:
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _token_logprobs(self, mb: MicroBatch) -> torch.Tensor:
        """log p(target) at every position of the packed row (0 where nothing is predicted)."""
        with self._autocast():
            out = self.model(input_ids=mb.input_ids, position_ids=mb.position_ids, use_cache=False)
        logits = out.logits[0].float()
        targets = mb.targets[0]
        chosen = logits.gather(-1, targets[:, None]).squeeze(-1)
        return (chosen - torch.logsumexp(logits, dim=-1)) * mb.valid[0]

    def compute_logprobs(self, batch: Sequence[TrainSequence]) -> list[list[float]]:
        """Every rank is given the whole batch, computes its share's log-probs and returns all
        of them (gathered over ranks)."""
        self.reload()
        mine = self._share(batch)
        groups = self._plan(batch, mine)
        rounds = self._max_over_ranks(len(groups))
        found: dict[int, list[float]] = {}
        self.model.eval()
        with torch.no_grad():
            for r in range(rounds):
                mb = pack(batch, groups[min(r, len(groups) - 1)] if groups else [0])
                lp = self._token_logprobs(mb.to(self.device))  # every rank runs each round
                if r < len(groups):
                    found.update(zip(mb.indices, unpack(lp, mb.lengths), strict=True))
        if self.world > 1:
            parts: list[Any] = [None] * self.world
            dist.all_gather_object(parts, found)
            found = {i: v for part in parts for i, v in part.items()}
        return [found[i] for i in range(len(batch))]

    # ---- the update ----

    def train_step(self, batch: Sequence[TrainSequence]) -> dict[str, float]:
        """One step on the whole ``batch`` (every rank is given all of it and trains on its
        share: every ``world``-th sequence)."""
        self.reload()
        totals = BatchTotals.of(batch)
        sums: dict[str, float] = {}
        tokens = 0
        for mb, real in self._micro_batches(batch):
            lp = self._token_logprobs(mb)
            loss, metrics = micro_batch_objective(mb, lp, self.settings.loss, totals)
            weight = self.world if real else 0.0  # FSDP averages gradients over ranks
            (loss * weight).backward()
            if real:
                tokens += mb.num_tokens
                for k, v in metrics.items():
                    sums[k] = sums.get(k, 0.0) + v
        metrics = {k: self._sum_over_ranks(v) for k, v in sums.items()}
        return metrics | self._apply_update() | {"tokens": self._sum_over_ranks(float(tokens))}

    def sft_step(self, batch: Sequence[TrainSequence]) -> dict[str, float]:
        """One optimizer step of supervised learning: the mean negative log-likelihood of the
        tokens where ``loss_mask`` is 1 (over the whole batch, across micro-batches and ranks)."""
        self.reload()
        total = float(sum(sum(x.loss_mask) for x in batch))
        nll_sum = 0.0
        for mb, real in self._micro_batches(batch):
            nll = -(self._token_logprobs(mb) * mb.loss_mask[0]).sum()
            weight = self.world / max(total, 1.0) if real else 0.0
            (nll * weight).backward()
            if real:
                nll_sum += float(nll.detach())
        nll_mean = self._sum_over_ranks(nll_sum) / max(total, 1.0)
        return {"nll": nll_mean, "loss_tokens": total} | self._apply_update()

    def _micro_batches(self, batch: Sequence[TrainSequence]) -> Iterator[tuple[MicroBatch, bool]]:
        """This rank's share of the batch in packed micro-batches on the device, in training
        mode. Every rank runs the same number of rounds (FSDP collectives); a rank with fewer
        repeats its first (or the batch's first sequence), marked not real (weight 0).
        Gradients are reduced across ranks on the last round only."""
        if not batch:
            raise ValueError("an empty batch")
        groups = self._plan(batch, self._share(batch))
        rounds = self._max_over_ranks(len(groups))
        self.model.train()
        sync = getattr(self.model, "set_requires_gradient_sync", None)  # FSDP2 only
        for r in range(rounds):
            if sync is not None:
                sync(r == rounds - 1)
            group = groups[min(r, len(groups) - 1)] if groups else [0]
            yield pack(batch, group).to(self.device), r < len(groups)

    def _share(self, batch: Sequence[TrainSequence]) -> list[int]:
        """The indices of this rank's sequences: every ``world``-th, from its rank."""
        return list(range(self.rank, len(batch), self.world))

    def _plan(self, batch: Sequence[TrainSequence], indices: list[int]) -> list[list[int]]:
        """``indices`` grouped into micro-batches (indices into ``batch``)."""
        budget = self.settings.learner.micro_batch_tokens_per_gpu
        groups = plan([len(batch[i].token_ids) for i in indices], budget)
        return [[indices[j] for j in g] for g in groups]

    def _apply_update(self) -> dict[str, float]:
        """Clip the accumulated gradients, step optimizer and schedule; the step's metrics."""
        grad_norm = torch.nn.utils.clip_grad_norm_(
            self.model.parameters(), self.settings.optim.grad_clip_norm
        )
        full_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
        lr = float(self.scheduler.get_last_lr()[0])
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._step += 1
        return {"grad_norm": float(full_norm.item()), "lr": lr, "step": float(self._step)}

    def export_hf(self, folder: str | Path) -> None:
        """Write the full model as an HF folder (rank 0 writes; every rank must call)."""
        self.reload()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(self.model, options=options)
        if self.rank == 0:
            self.model.save_pretrained(str(folder), state_dict=state, safe_serialization=True)
        if self.world > 1:
            dist.barrier()

    # ---- colocation ----

    def offload(self) -> None:
        """Parameters and optimizer state to host memory and the GPU's cached blocks freed, so
        colocated engines can use the memory; every later call that computes brings them back
        first (:meth:`reload`), bit-equal. A checkpoint saved meanwhile is written from host
        memory. No-op on CPU or when already offloaded."""
        if self.device.type == "cpu" or self._on_host:
            return
        host = torch.device("cpu")
        self.model.to(host)  # FSDP2 re-registers its shards (FSDPModule._apply)
        for state in self.optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.device.type != "cpu":
                    state[key] = value.to(host)
                    self._offloaded.append((state, key))
        self._on_host = True
        torch.cuda.empty_cache()

    def reload(self) -> None:
        """Undo :meth:`offload` (no-op when the state is on the device)."""
        if not self._on_host:
            return
        self.model.to(self.device)
        for state, key in self._offloaded:
            state[key] = state[key].to(self.device)
        self._offloaded, self._on_host = [], False

    # ---- weights and checkpoints ----

    def named_weights(
        self, bucket_bytes: int, dtype: torch.dtype | None = None, *, every_rank: bool = False
    ) -> Iterator[list[tuple[str, Any]]]:
        """Buckets of whole units: a decoder layer (``model.layers.N.*``) or another module.
        Engines fuse a layer's projections (q/k/v, gate/up) and cannot load part of one, so a
        unit larger than ``bucket_bytes`` is a bucket of its own. Every rank yields one list
        per bucket, after that bucket's gathers (in step); only rank 0's hold tensors unless
        ``every_rank`` (every rank holds them after FSDP2's gathers)."""
        self.reload()
        bucket: list[tuple[str, Any]] = []
        size = 0
        for unit in self._units(dtype):  # every rank holds the gathered tensors: same sizes
            nbytes = sum(t.numel() * t.element_size() for _, t in unit)
            if size and size + nbytes > bucket_bytes:
                yield bucket
                bucket, size = [], 0
            if self.rank == 0 or every_rank:
                bucket.extend(unit)
            size += nbytes
        if size:
            yield bucket

    def _units(self, dtype: torch.dtype | None) -> Iterator[list[tuple[str, Any]]]:
        unit: list[tuple[str, Any]] = []
        key = None
        tied = bool(getattr(self.model.config, "tie_word_embeddings", False))
        for name, tensor in self.model.state_dict().items():
            if tied and name == "lm_head.weight":  # the embedding itself; engines tie it too
                continue
            if hasattr(tensor, "full_tensor"):  # an FSDP2 shard: gather (every rank takes part)
                tensor = tensor.full_tensor()
            this = _unit_of(name)
            if unit and this != key:
                yield unit
                unit = []
            key = this
            unit.append((name, tensor.detach() if dtype is None else tensor.detach().to(dtype)))
        if unit:
            yield unit

    def save(self, path: str | Path) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(folder))
        extra = {
            "step": self._step,
            "scheduler": self.scheduler.state_dict(),
            "world": self.world,
        }
        torch.save(extra, folder / f"extra-rank{self.rank}.pt")

    def load(self, path: str | Path) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        self.reload()
        folder = Path(path)
        extra_path = folder / f"extra-rank{self.rank}.pt"
        if not extra_path.is_file():
            raise FileNotFoundError(f"{folder} is not a learner checkpoint for rank {self.rank}")
        extra = torch.load(extra_path, weights_only=False)
        if extra["world"] != self.world:
            raise ValueError(f"{folder} was saved by {extra['world']} ranks, not {self.world}")
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        dcp.load({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(folder))  # in place
        set_state_dict(
            self.model, self.optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd
        )
        self.scheduler.load_state_dict(extra["scheduler"])
        self._step = int(extra["step"])

    def close(self) -> None:
        """Drop the model and optimizer (idempotent); a process group stays its owner's."""
        for name in ("model", "optimizer", "scheduler"):
            self.__dict__.pop(name, None)

    # ---- collectives (no-ops on one rank) ----

    def _sum_over_ranks(self, value: float) -> float:
        if self.world == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self._comm_device())
        dist.all_reduce(t)
        return float(t.item())

    def _max_over_ranks(self, value: int) -> int:
        if self.world == 1:
            return value
        t = torch.tensor([value], dtype=torch.int64, device=self._comm_device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def _comm_device(self) -> torch.device:
        return self.device if dist.get_backend() == "nccl" else torch.device("cpu")


def _attention(choice: str, device: torch.device) -> str:
    if choice != "auto":
        return choice
    return "flex_attention" if device.type == "cuda" else "sdpa"


def _unit_of(name: str) -> str:
    """``model.layers.3.mlp.up_proj.weight`` -> ``model.layers.3``; else the owning module."""
    parts = name.split(".")
    if "layers" in parts:
        i = parts.index("layers")
        if i + 1 < len(parts) and parts[i + 1].isdigit():
            return ".".join(parts[: i + 2])
    return ".".join(parts[:-1])


def _pick_device(choice: str, rank: int) -> torch.device:
    if choice == "cpu" or (choice == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    # the launcher's node-local rank (torchrun, the Ray group) where it says; else by rank
    local = os.environ.get("LOCAL_RANK")
    index = int(local) if local is not None else rank % max(torch.cuda.device_count(), 1)
    torch.cuda.set_device(index)
    return torch.device("cuda", index)
