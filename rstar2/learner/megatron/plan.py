"""What a megatron learner layout puts on each rank, found before any GPU is booked.

:func:`plan_learner` checks the layout against the model's shape (:func:`.layout.check_layout`),
checks that the backend can build the model, lets megatron-core validate its own
TransformerConfig, and builds the whole GPTModel on the meta device (no memory, about a second
for a 14B model on a CPU) to count the parameters each pipeline stage's TP shard holds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

import torch

from rstar2.config import ConfigError, MegatronLearnerConfig
from rstar2.learner.megatron.layout import Layout, ModelShape, check_layout

# bytes per parameter: bf16 weights, fp32 gradient buffer, and (sharded over data-parallel
# ranks by the distributed optimizer) fp32 master weights and two Adam moments
_WEIGHTS_AND_GRADS_B = 2 + 4
_OPTIMIZER_B = 4 + 4 + 4
_LAYER = re.compile(r"decoder\.layers\.(\d+)\.")


@dataclass(frozen=True)
class LearnerPlan:
    layout: Layout
    total_params: int
    params_per_rank: tuple[int, ...]  # one TP shard of each pipeline stage, first to last

    def state_bytes_per_rank(self) -> int:
        """Weights, gradients and optimizer state of the fullest rank (activations not
        included)."""
        per_param = _WEIGHTS_AND_GRADS_B + _OPTIMIZER_B / self.layout.data_parallel
        return int(max(self.params_per_rank) * per_param)

    def describe(self) -> str:
        lay = self.layout
        stages = ", ".join(f"{p / 1e9:.2f}B" for p in self.params_per_rank)
        return (
            f"TP={lay.tensor_parallel} x PP={lay.pipeline_parallel} x DP={lay.data_parallel}"
            f"{' + sequence parallel' if lay.sequence_parallel else ''}; "
            f"{self.total_params / 1e9:.2f}B parameters, {lay.layers_per_stage} layers per "
            f"stage, vocabulary padded to {lay.padded_vocab_size}; per rank by stage: {stages}; "
            f"~{self.state_bytes_per_rank() / 2**30:.0f} GiB of weights, gradients and optimizer "
            "state on the fullest rank (activations come on top)"
        )


def plan_learner(section: MegatronLearnerConfig, hf_config: Any, world_size: int) -> LearnerPlan:
    """The plan, or ConfigError naming the key (``learner.*`` for the layout, ``model.path``
    for a model the backend cannot build). Uses a one-rank process group and megatron's
    parallel state when there are none, and leaves none behind."""
    from rstar2.learner.megatron.model import ModelSpec, build_model, check_model

    layout = check_layout(section, ModelShape.from_hf(hf_config), world_size)
    try:
        check_model(hf_config)
    except ValueError as e:
        raise ConfigError("model.path", str(e)) from None
    # the whole model as one stage (TP as planned); its layers are then counted per stage
    whole = replace(
        layout, pipeline_parallel=1, layers_per_stage=ModelShape.from_hf(hf_config).num_layers
    )
    spec = ModelSpec(hf_config=hf_config, layout=whole, params_dtype=torch.bfloat16)
    with _one_rank_parallel_state():
        try:
            with torch.device("meta"):
                model = build_model(spec, pre_process=True, post_process=True)
        except (ValueError, AssertionError) as e:  # megatron-core's own config validation
            raise ConfigError("learner", f"megatron-core refuses this layout: {e}") from None
    per_stage = [0] * layout.pipeline_parallel
    for name, param in model.named_parameters():
        size = param.numel() // (
            layout.tensor_parallel if getattr(param, "tensor_model_parallel", False) else 1
        )
        layer = _LAYER.match(name)
        if layer:
            per_stage[int(layer.group(1)) // layout.layers_per_stage] += size
        elif name.startswith("embedding."):
            per_stage[0] += size
            if spec.dims.tied_embeddings and layout.pipeline_parallel > 1:
                per_stage[-1] += size  # the last stage keeps a copy as its output layer
        else:
            per_stage[-1] += size
    total = sum(p.numel() for p in model.parameters())
    return LearnerPlan(layout=layout, total_params=total, params_per_rank=tuple(per_stage))


class _one_rank_parallel_state:
    def __enter__(self) -> None:
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        self._group = not dist.is_initialized()
        if self._group:
            from rstar2.learner.megatron.setup import init_one_rank_group

            init_one_rank_group("gloo")
        self._state = not ps.model_parallel_is_initialized()
        if self._state:
            ps.initialize_model_parallel(1, 1)

    def __exit__(self, *exc: object) -> None:
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        if self._state:
            ps.destroy_model_parallel()
        if self._group:
            dist.destroy_process_group()
