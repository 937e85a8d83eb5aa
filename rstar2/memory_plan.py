"""Per-GPU memory of a run's two phases, from the config and the model's shape alone (pure).

The learner phase (one GPU of the fullest learner rank): bf16 weights, fp32 gradients, fp32
master weights and Adam moments (sharded over data-parallel ranks by the distributed
optimizer), the activations of one micro-batch of ``learner.micro_batch_tokens_per_gpu``
tokens, and the log-prob path's logits; its peak is the larger of the backward's and the
optimizer step's. The rollout phase (one engine GPU): what vLLM reserves
(``rollout.gpu_memory_utilization`` of the device), its weights and the KV cache left beside
them, and, colocated, the learner state that stays resident while the engines generate
(none with ``learner.offload_while_generating``). Colocated, the engines sleep (weights and KV
cache freed) while the learner steps.

What each figure counts is named beside it; what is not counted: the CUDA/HIP context and
allocator slack (a GiB or two per process), NCCL buffers, vLLM's CUDA graphs. The megatron
learner's figure is checked against a GPU's ``torch.cuda.max_memory_allocated``
(perf/learner_memory.py, README); the torch backend's is the same arithmetic for FSDP2's fp32
state and is not checked.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rstar2.config import Config, ConfigError, MegatronLearnerConfig
from rstar2.model_shapes import KNOWN_SHAPES, DecoderShape

GIB = 2**30
DEVICE_GIB = {"rocm": 192.0, "cuda": 80.0}  # MI300X, H100 80GB


def read_dims(model_path: str) -> tuple[DecoderShape, str]:
    """The model's dimensions and where they came from: ``model_path``'s config.json, else
    the known shape of a hub id (saying so); ConfigError naming ``model.path`` otherwise."""
    config_file = Path(model_path) / "config.json"
    if config_file.is_file():
        return DecoderShape.from_hf_config(json.loads(config_file.read_text())), str(config_file)
    if model_path in KNOWN_SHAPES:
        return DecoderShape.from_hf_config(KNOWN_SHAPES[model_path]), (
            f"the known shape of {model_path} (no config.json here)"
        )
    known = ", ".join(KNOWN_SHAPES)
    raise ConfigError(
        "model.path",
        f"{model_path} has no config.json here and is not a known shape ({known}): point it "
        "at a folder holding the model's config.json",
    )


@dataclass(frozen=True)
class Phase:
    """One phase on one GPU: named parts in bytes; ``peak`` is what must fit."""

    name: str
    parts: tuple[tuple[str, float], ...]
    peak: float
    note: str = ""


@dataclass(frozen=True)
class MemoryPlan:
    device_bytes: float
    learner: Phase
    rollout: Phase
    shape_source: str

    def lines(self) -> list[str]:
        """What ``rstar2 layout`` prints."""
        out = [f"memory per GPU of {self.device_bytes / GIB:.0f} GiB ({self.shape_source}):"]
        for phase in (self.learner, self.rollout):
            parts = ", ".join(f"{name} {b / GIB:.1f}" for name, b in phase.parts)
            share = phase.peak / self.device_bytes
            out.append(f"  {phase.name}: peak {phase.peak / GIB:.1f} GiB ({share:.0%}) = {parts}")
            if phase.note:
                out.append(f"    {phase.note}")
        return out


def device_bytes(cfg: Config) -> float:
    gib = cfg.cluster.gpu_memory_gib or DEVICE_GIB.get(cfg.cluster.accelerator, 0.0)
    return gib * GIB


def plan_memory(cfg: Config, dims: DecoderShape, shape_source: str = "") -> MemoryPlan:
    learner = _learner_phase(cfg, dims)
    state = sum(b for name, b in learner.parts if name in _STATE_PARTS)
    return MemoryPlan(device_bytes(cfg), learner, _rollout_phase(cfg, dims, state), shape_source)


_STATE_PARTS = ("weights", "grads", "optimizer")


def _learner_phase(cfg: Config, dims: DecoderShape) -> Phase:
    section = cfg.learner
    tokens = section.micro_batch_tokens_per_gpu
    if isinstance(section, MegatronLearnerConfig):
        tp, pp = section.tensor_parallel_size, section.pipeline_parallel_size
        sp = section.sequence_parallel
        dp = max(1, section.num_ranks // (tp * pp))
        layers = -(-dims.layers // pp)
        embedding = dims.vocab * dims.hidden / tp
        head = 0.0 if dims.tied and pp == 1 else embedding  # the last stage's output layer
        first = embedding + layers * dims.layer_params / tp
        last = layers * dims.layer_params / tp + head + (embedding if pp == 1 else 0.0)
        params = max(first, last)
        weights, grads = 2 * params, 4 * params  # bf16 weights, fp32 grad buffer
        optimizer = 12 * params / dp  # fp32 master + Adam moments, distributed over DP
        in_flight = pp  # 1F1B: the first stage holds PP micro-batches' stored activations
        backend = f"megatron TP {tp} x PP {pp} x DP {dp}"
    else:
        tp, sp, in_flight, layers, dp = 1, False, 1, dims.layers, 1
        ranks = section.num_ranks
        # FSDP2: fp32 parameters, gradients and Adam moments sharded over the ranks, plus one
        # layer gathered whole (and the next prefetched) in bf16 for compute
        weights = 4 * dims.weight_params / ranks + 2 * 2 * dims.layer_params
        grads, optimizer = 4 * dims.weight_params / ranks, 8 * dims.weight_params / ranks
        params = dims.weight_params / ranks
        backend = f"torch FSDP2 over {ranks} ranks"
    activations = _activation_bytes(dims, tokens, tp, sp, layers, section.activation_checkpointing)
    activations *= in_flight
    logits = tokens * _padded_vocab(dims.vocab, tp) / tp * 8  # bf16 out, fp32 grad, bf16 grad
    state = weights + grads + optimizer
    optimizer_step = 4 * params / dp  # Adam's temporaries over the rank's shard
    peak = state + max(activations + logits, optimizer_step)
    parts = (
        ("weights", weights),
        ("grads", grads),
        ("optimizer", optimizer),
        ("activations", activations),
        ("logits", logits),
    )
    checkpointing = "recomputed per layer" if section.activation_checkpointing else "all stored"
    note = (
        f"{backend}; {tokens} tokens per micro-batch, activations {checkpointing}; the "
        f"optimizer step's peak is {(state + optimizer_step) / GIB:.1f} GiB"
    )
    return Phase("learner", parts, peak, note)


def _padded_vocab(vocab: int, tp: int) -> int:
    """megatron-core pads the vocabulary to a multiple of 128 x TP."""
    step = 128 * tp
    return -(-vocab // step) * step


def _activation_bytes(
    dims: DecoderShape, tokens: int, tp: int, sp: bool, layers: int, checkpointing: bool
) -> float:
    """bf16 tensors one layer keeps for its backward, per token: the norms' inputs and
    outputs and the residual stream (5 x hidden, split over TP with sequence parallel), q, k,
    v with their normed and rotated copies (3 x their width), the attention output twice (its
    own and the output projection's input), the MLP's two up projections and their SwiGLU
    product (3 x intermediate); all sharded over TP. With checkpointing a layer keeps only its
    input, and one layer at a time is recomputed."""
    hidden = dims.hidden / (tp if sp else 1)
    qkv = (dims.heads + 2 * dims.kv_heads) * dims.head_dim / tp
    attention = dims.heads * dims.head_dim / tp
    per_layer = 2 * (5 * hidden + 3 * qkv + 2 * attention + 3 * dims.intermediate / tp)
    if not checkpointing:
        return tokens * per_layer * layers
    return tokens * (2 * hidden * layers + per_layer)


def _rollout_phase(cfg: Config, dims: DecoderShape, learner_state: float) -> Phase:
    r, c = cfg.rollout, cfg.cluster
    device = device_bytes(cfg)
    reserve = r.gpu_memory_utilization * device
    weights = 2 * dims.weight_params / r.tensor_parallel_size
    kv = max(0.0, reserve - weights)
    kv_tokens = kv * r.tensor_parallel_size / dims.kv_bytes_per_token
    offload = getattr(cfg.learner, "offload_while_generating", False)
    resident = learner_state if c.colocate and not offload else 0.0
    parts: tuple[tuple[str, float], ...] = (("engine weights", weights), ("KV cache", kv))
    if c.colocate:
        parts += (("learner state", resident),)
        sleeps = (
            "colocated: the engines sleep while the learner steps; the learner state "
            + ("moves to host memory" if offload else "stays on the GPU")
            + " while they generate"
        )
    else:
        sleeps = "split: engines on their own GPUs"
    note = (
        f"engine TP {r.tensor_parallel_size} reserves {r.gpu_memory_utilization:g} of the "
        f"device; KV cache (with vLLM's activation workspace) ~{kv_tokens / 1e6:.2f}M tokens "
        f"per engine; {sleeps}"
    )
    return Phase("rollout", parts, reserve + resident, note)


def check_fits(plan: MemoryPlan, cfg: Config, *, learner_only: bool = False) -> None:
    """ConfigError naming the key to change when a phase's peak passes the device (nothing to
    check on CPU); ``learner_only``: a learner-only job (no engines)."""
    device = plan.device_bytes
    if not device:
        return
    if plan.learner.peak > device:
        raise ConfigError(
            "learner.micro_batch_tokens_per_gpu",
            f"the learner phase needs ~{plan.learner.peak / GIB:.1f} GiB per GPU, more than "
            f"the {device / GIB:.0f} GiB a GPU has (rstar2 layout): lower it, or spread the "
            "model over more ranks (learner.tensor_parallel_size, learner.num_ranks)",
        )
    if not learner_only and plan.rollout.peak > device:
        resident = plan.rollout.peak - cfg.rollout.gpu_memory_utilization * device
        room = max(0.0, (device - resident) / device)
        offload = hasattr(cfg.learner, "offload_while_generating")
        raise ConfigError(
            "rollout.gpu_memory_utilization",
            f"{cfg.rollout.gpu_memory_utilization:g} of the GPU beside the learner's resident "
            f"{resident / GIB:.1f} GiB passes the {device / GIB:.0f} GiB a GPU has: use at "
            f"most {room:.2f}" + (", or learner.offload_while_generating: true" if offload else ""),
        )
