"""The plan's engine model: bytes per weight and KV element of the config's dtype, one engine's
step cost over its TP (the datasheet model, or a measured ``--cost`` file scaled from the TP it
was measured at) and the KV tokens one engine holds (:mod:`perf.plan` reads them)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from perf.plan_inputs import Assumption, PlanInputError, required
from perf.rollout_sim import CostFileError
from perf.shapes import DTYPE_BYTES, DecoderShape
from scheduler.sim_model import StepCostModel


def dtype_bytes(cfg: Any) -> int:
    """Bytes per weight (and KV element: vLLM's KV cache follows the model) of the config's
    ``model.dtype``."""
    dtype = str(cfg.model.dtype)
    if dtype not in DTYPE_BYTES:
        raise PlanInputError(f"model.dtype: {dtype!r} has no known size ({', '.join(DTYPE_BYTES)})")
    return DTYPE_BYTES[dtype]


def _kv_bytes_per_token(shape: DecoderShape, nbytes: int) -> int:
    return shape.kv_bytes_per_token * nbytes // 2  # the shape counts bf16 K and V


def engine_cost(
    a: dict[str, Assumption],
    shape: DecoderShape,
    tp: int,
    measured: StepCostModel | None,
    *,
    measured_tp: int = 1,
    nbytes: int = 2,
) -> StepCostModel:
    """One engine's step cost over ``tp`` GPUs: a model measured at ``measured_tp`` GPUs,
    scaled by the speed-up of ``tp`` over ``measured_tp`` (``tp x --tp-efficiency`` over
    one GPU each), or the datasheet's single-GPU model at ``nbytes`` per weight and KV element
    scaled from one GPU, and ``--engine-step-overhead-s`` (the engine's scheduling and
    sampling on the host, which no datasheet has and a TP split does not shorten) of which
    ``--engine-host-overlap`` runs under the GPU's work."""
    eff = required(a, "tp_efficiency")

    def speedup(n: int) -> float:
        return n * eff if n > 1 else 1.0

    host, overlap = 0.0, 0.0  # a measured cost includes the engine's host time per step
    if measured is not None:
        base = measured
        scale = speedup(measured_tp) / speedup(tp)
    else:
        peak, hbm_peak = a["peak_tflops"].value, a["hbm_tb_per_s"].value
        if peak is None or hbm_peak is None:
            raise PlanInputError(
                "--cost: no datasheet for this accelerator; measure the engine "
                "(python -m perf.engine_cost --config ... --out FILE) or give --peak-tflops "
                "and --hbm-tb-per-s"
            )
        hbm = hbm_peak * 1e12 * required(a, "hbm_efficiency")
        base = StepCostModel(
            step_base_s=shape.weight_bytes(nbytes) / hbm,  # the weights, read once per step
            per_token_s=2 * shape.matmul_params / (peak * 1e12 * required(a, "engine_prefill_mfu")),
            per_kv_token_s=_kv_bytes_per_token(shape, nbytes) / hbm,
        )
        scale = 1 / speedup(tp)
        host = required(a, "engine_step_overhead_s")  # not divided over the TP ranks
        overlap = required(a, "engine_host_overlap")
        if not 0.0 <= overlap <= 1.0:
            raise PlanInputError("--engine-host-overlap: a share, between 0 and 1")
    return replace(
        base,
        host_s=host,
        host_overlap=overlap,
        step_base_s=base.step_base_s * scale,
        per_token_s=base.per_token_s * scale,
        per_kv_token_s=base.per_kv_token_s * scale,
        per_decode_token_s=None
        if base.per_decode_token_s is None
        else base.per_decode_token_s * scale,
    )


def cost_tp(path: str, given: int | None) -> Assumption:
    """The TP a ``--cost`` file was measured at: ``--cost-tp``, else the file's
    ``tensor_parallel_size`` (perf.engine_cost records it; perf.step_cost times one GPU),
    else 1, said so (a file from before the field was recorded)."""
    name, unit, flag = "cost_tp", "GPUs", "--cost-tp"
    if given is not None:
        if given < 1:
            raise PlanInputError("--cost-tp: must be a positive number of GPUs")
        return Assumption(name, given, unit, f"set by {flag} (the TP {path} was measured at)", flag)
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CostFileError(f"--cost {path}: {exc}") from exc
    meta = data if isinstance(data, dict) else {}
    tp = meta.get("tensor_parallel_size")
    if tp is None:
        source = f"assumed: {path} records no tensor_parallel_size (an older file): TP 1"
        return Assumption(name, 1, unit, source, flag)
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise CostFileError(f"--cost {path}: tensor_parallel_size must be a positive integer")
    what = ", ".join(f"{k} {meta[k]}" for k in ("dtype", "model") if meta.get(k))
    return Assumption(
        name, tp, unit, f"{path}: measured at TP {tp}" + (f" ({what})" if what else ""), flag
    )


def engine_kv_tokens(a: dict[str, Assumption], shape: DecoderShape, cfg: Any) -> int:
    """KV tokens one engine holds: vLLM's CPU KV space, or what a GPU's memory leaves after
    the weights and activations."""
    r = cfg.rollout
    nbytes = dtype_bytes(cfg)
    per_token = _kv_bytes_per_token(shape, nbytes)
    if cfg.cluster.accelerator == "cpu":
        return int(r.kv_cache_space_gb * 2**30 / per_token)
    tp = r.tensor_parallel_size
    per_gpu = (
        required(a, "gpu_memory_gb") * 1e9 * r.gpu_memory_utilization
        - shape.weight_bytes(nbytes) / tp
        - required(a, "engine_activation_gb") * 1e9
    )
    return max(0, int(per_gpu * tp / per_token))


def no_kv_space(a: dict[str, Assumption], shape: DecoderShape, cfg: Any) -> PlanInputError:
    """What to change when an engine has no KV space left."""
    r = cfg.rollout
    if cfg.cluster.accelerator == "cpu":
        return PlanInputError(
            f"rollout.kv_cache_space_gb: {r.kv_cache_space_gb} GB holds no KV token; raise it"
        )
    weights = shape.weight_bytes(dtype_bytes(cfg)) / r.tensor_parallel_size / 1e9
    return PlanInputError(
        f"engine KV: no GPU memory left for the KV cache ({weights:.1f} GB of "
        f"{cfg.model.dtype} weights per GPU + --engine-activation-gb "
        f"{required(a, 'engine_activation_gb'):g} exceed --gpu-memory-gb "
        f"{required(a, 'gpu_memory_gb'):g} x rollout.gpu_memory_utilization "
        f"{r.gpu_memory_utilization}); raise rollout.tensor_parallel_size or "
        "rollout.gpu_memory_utilization, or lower --engine-activation-gb"
    )
