"""The capacity plan's inputs: model shapes, accelerator datasheets, and every assumed number
with its unit, source and flag (:mod:`perf.plan` reads them; nothing here measures)."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perf.shapes import QWEN2_5_14B, DecoderShape

# published configs (config.json of each model on its hub page)
SHAPES = {
    "Qwen/Qwen3-14B": DecoderShape(5120, 17408, 40, 40, 8, 128, 151936),
    "Qwen/Qwen3-8B": DecoderShape(4096, 12288, 36, 32, 8, 128, 151936),
    "Qwen/Qwen3-1.7B": DecoderShape(2048, 6144, 28, 16, 8, 128, 151936, tied=True),
    "Qwen/Qwen3-0.6B": DecoderShape(1024, 3072, 28, 16, 8, 128, 151936, tied=True),
    "Qwen/Qwen2.5-1.5B": DecoderShape(
        1536, 8960, 28, 12, 2, 128, 151936, tied=True, family="qwen2"
    ),
    "Qwen/Qwen2.5-0.5B": DecoderShape(896, 4864, 24, 14, 2, 64, 151936, tied=True, family="qwen2"),
    # the Qwen2 architecture with full multi-head attention: 16 KV heads of 64 dims
    "Qwen/Qwen1.5-0.5B": DecoderShape(
        1024, 2816, 24, 16, 16, 64, 151936, tied=True, family="qwen2"
    ),
    "Qwen/Qwen2.5-14B": QWEN2_5_14B,
}


class PlanInputError(ValueError):
    """An input the plan cannot use; the message says which and what to do."""


def model_shape(cfg: Any) -> DecoderShape:
    """The policy's shape: a local checkpoint's ``config.json`` (a toy run's tiny model), else
    the published shape of a known hub id."""
    local = Path(cfg.model.path) / "config.json"
    if local.is_file():
        try:
            return DecoderShape.from_hf_config(json.loads(local.read_text()))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise PlanInputError(f"model.path: {local} is not a decoder's config ({exc})") from None
    shape = SHAPES.get(cfg.model.path)
    if shape is None:
        known = ", ".join(sorted(SHAPES))
        hint = " (the toy recipe builds it on its first run)" if cfg.model.tiny else ""
        raise PlanInputError(
            f"model.path: no {local}{hint} and no known shape for {cfg.model.path!r} ({known})"
        )
    return shape


@dataclass(frozen=True)
class Datasheet:
    name: str
    peak_tflops: float  # dense bf16 matrix peak
    hbm_tb_per_s: float
    memory_gb: float


# cluster.accelerator -> the GPU the recipes of that kind run on
DATASHEETS = {
    "rocm": Datasheet("MI300X", 1307.4, 5.3, 192.0),
    "cuda": Datasheet("H200 SXM", 989.4, 4.8, 141.0),
}


@dataclass(frozen=True)
class Assumption:
    name: str
    value: float | None  # None: not given, and no datasheet or default has it
    unit: str
    source: str
    flag: str


H200_RESULTS = "perf/results/nvidia-h200-*.json"
# from the accelerator's datasheet unless set
DATASHEET_FIELDS = {
    "peak_tflops": ("TFLOP/s", "dense bf16 matrix peak"),
    "hbm_tb_per_s": ("TB/s", "HBM peak bandwidth"),
    "gpu_memory_gb": ("GB", "memory"),
}
# name -> (default, unit, source); each has a --flag of its name with "-" for "_"
DEFAULTS: dict[str, tuple[float | None, str, str]] = {
    "engine_prefill_mfu": (
        0.63,
        "frac",
        f"prefill GEMMs, Qwen2.5-14B layers on one H200 (step_cost in {H200_RESULTS})",
    ),
    "hbm_efficiency": (
        0.93,
        "frac",
        f"KV and weight reads, share of HBM peak on one H200 (step_cost in {H200_RESULTS})",
    ),
    "engine_step_overhead_s": (
        0.0,
        "s",
        "the engine's host time per step beyond the datasheet's reads and FLOPs (scheduling, "
        "input preparation, torch sampling over the vocabulary, output processing; 0: left "
        "out); fitted to vLLM 0.26 on one H100 by perf.rl_step_fit",
    ),
    "engine_host_overlap": (
        0.0,
        "frac",
        "the share of the engine's host time per step that its GPU work hides: a step of GPU "
        "time g takes g + overhead - overlap x min(g, overhead) (0: added whole); fitted with "
        "--engine-step-overhead-s by perf.rl_step_fit",
    ),
    "engine_max_num_seqs": (
        128.0,
        "seqs",
        "vLLM's max_num_seqs, the requests an engine runs at once: rstar2.rollout.vllm_engine "
        "sets none, and AsyncLLM's default (UsageContext.ENGINE_CONTEXT) is "
        "SchedulerConfig.DEFAULT_MAX_NUM_SEQS, 128 in vLLM 0.26 and 0.32",
    ),
    "tp_efficiency": (
        0.8,
        "frac",
        "assumed: share of the TP-width speed-up an engine keeps (all-reduces per layer)",
    ),
    "engine_activation_gb": (
        15.0,
        "GB",
        "assumed: vLLM activation and graph memory per GPU (scheduler/sim_model.py)",
    ),
    "median_response_tokens": (
        3072.0,
        "tokens",
        "scheduler/trace.py paper_like: the paper's response lengths, median ~3K",
    ),
    "tool_latency_s": (0.3, "s", "scheduler/trace.py paper_like: ~0.3 s per tool call"),
    "tool_response_tokens": (
        128.0,
        "tokens",
        "scheduler/trace.py paper_like and scheduler/sim_model.py: a tool response's tokens",
    ),
    "reward_verif_per_s_per_core": (
        300.0,
        "1/s",
        "perf.reward: cold verifications per core, 2-core CI machine (~300-330)",
    ),
    "reward_cores": (
        None,
        "cores",
        "unset: the config's reward.num_workers (0 means min(4, cores): taken as 4)",
    ),
    "learner_mfu": (
        0.43,
        "frac",
        f"megatron learner, Qwen3-1.7B shape, one H200 ({H200_RESULTS}); assumed at 14B",
    ),
    "learner_layer_overhead_s": (
        0.0,
        "s",
        "per layer per micro-batch, on top of the FLOPs at --learner-mfu (kernel launches, "
        "norms, the framework's host time; 0: the MFU absorbs them); fitted with "
        "--learner-mfu by perf.rl_step_fit (three H100 steps: ~0.0043 s at MFU ~0.81)",
    ),
    "learner_tokens_per_s": (
        None,
        "tok/s",
        "the whole learner's training tokens/s; unset: FLOPs at --learner-mfu of the peak",
    ),
    "ipc_gb_per_s": (
        3.1,
        "GB/s",
        "the colocated weight transfer through vLLM's packed sender and receiver (what "
        "IpcSync uses): 3.13 fitted on three H100 steps with vLLM 0.26 by perf.rl_step_fit "
        "(perf/results/rl-step); 0: --ipc-share-of-copy of a device copy",
    ),
    "ipc_layer_s": (
        0.010,
        "s",
        "per decoder layer per sync, on top of the bytes (the receiver's per-tensor work): "
        "0.0100 fitted on three H100 steps with vLLM 0.26 by perf.rl_step_fit (all of 28 "
        "layers: the steps' common intercept over 28; perf/results/rl-step)",
    ),
    "ipc_share_of_copy": (
        0.87,
        "frac",
        f"with --ipc-gb-per-s 0: the shared-handle CUDA-IPC transport / a device copy, "
        f"one H200 ({H200_RESULTS})",
    ),
    "device_copy_share_of_hbm": (
        0.44,
        "frac",
        "H200: a 2.1 TB/s device copy of its 4.8 TB/s HBM (each byte read and written)",
    ),
    "wake_s": (
        0.3,
        "s",
        "vLLM's sleep (level 2), both wake-ups and the learner's cache release per step: "
        "0.18-0.28 s on one H100 with vLLM 0.26 (perf/results/rl-step; 5 s was assumed before)",
    ),
}


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_flags(p: argparse.ArgumentParser) -> None:
    """One ``--flag`` per assumption (datasheet fields default to the config's accelerator)."""
    for name, (unit, what) in DATASHEET_FIELDS.items():
        p.add_argument(flag(name), dest=name, type=float, help=f"{unit} (the datasheet's {what})")
    for name, (default, unit, _source) in DEFAULTS.items():
        p.add_argument(
            flag(name), dest=name, type=float, default=default, help=f"{unit} (default {default})"
        )


def assumptions(args: argparse.Namespace, accelerator: str) -> dict[str, Assumption]:
    """Every assumed number, as given by its flag, else the accelerator's datasheet or the
    default, with where it came from."""
    out = {}
    sheet = DATASHEETS.get(accelerator)
    for name, (unit, what) in DATASHEET_FIELDS.items():
        given = getattr(args, name)
        if given is not None:
            out[name] = Assumption(name, given, unit, f"set by {flag(name)}", flag(name))
        elif sheet is not None:
            value = getattr(sheet, "memory_gb" if name == "gpu_memory_gb" else name)
            source = f"{sheet.name} datasheet ({accelerator}): {what}"
            out[name] = Assumption(name, value, unit, source, flag(name))
        else:
            source = f"no datasheet for accelerator {accelerator}"
            out[name] = Assumption(name, None, unit, source, flag(name))
    for name, (default, unit, source) in DEFAULTS.items():
        value = getattr(args, name)
        if value != default:
            source = f"set by {flag(name)} (default {default}: {source})"
        out[name] = Assumption(name, value, unit, source, flag(name))
    return out


def required(a: dict[str, Assumption], name: str) -> float:
    """An assumption's value; with none, an input error naming the flag that gives it."""
    value = a[name].value
    if value is None:
        raise PlanInputError(f"{a[name].flag}: {a[name].source}; give it")
    return value
