"""The megatron layout check: what divides, what does not, and the key each error names."""

from __future__ import annotations

import pytest

from rstar2.config import ConfigError, MegatronLearnerConfig
from rstar2.learner.megatron.layout import ModelShape, check_layout

# Qwen3-14B's published shape
QWEN3_14B = ModelShape(
    num_layers=40,
    num_heads=40,
    num_kv_heads=8,
    hidden_size=5120,
    ffn_hidden_size=17408,
    vocab_size=151936,
)


def _section(tp: int = 1, pp: int = 1) -> MegatronLearnerConfig:
    return MegatronLearnerConfig(
        backend="megatron", tensor_parallel_size=tp, pipeline_parallel_size=pp
    )


def test_the_recipe_layout_on_64_gpus() -> None:
    layout = check_layout(_section(tp=4), QWEN3_14B, world_size=64)
    assert (layout.tensor_parallel, layout.pipeline_parallel, layout.data_parallel) == (4, 1, 16)
    assert layout.layers_per_stage == 40
    assert layout.padded_vocab_size % (128 * 4) == 0
    assert 0 <= layout.padded_vocab_size - QWEN3_14B.vocab_size < 128 * 4
    two_stages = check_layout(_section(tp=4, pp=2), QWEN3_14B, world_size=64)
    assert (two_stages.data_parallel, two_stages.layers_per_stage) == (8, 20)
    assert two_stages.world_size == 64


@pytest.mark.parametrize(
    ("tp", "pp", "world", "key", "words"),
    [
        (3, 1, 3, "learner.tensor_parallel_size", "40 attention heads do not divide by TP=3"),
        (10, 1, 10, "learner.tensor_parallel_size", "8 key/value heads do not divide by TP=10"),
        (1, 3, 3, "learner.pipeline_parallel_size", "40 layers do not divide by PP=3"),
        (4, 2, 12, "learner.tensor_parallel_size", "12 learner ranks are not a multiple"),
    ],
)
def test_a_layout_that_cannot_work_names_its_key(tp, pp, world, key, words) -> None:
    with pytest.raises(ConfigError) as info:
        check_layout(_section(tp, pp), QWEN3_14B, world_size=world)
    assert info.value.key == key and words in info.value.message


def test_shape_from_an_hf_config() -> None:
    from transformers import Qwen3Config

    config = Qwen3Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=300,
    )
    shape = ModelShape.from_hf(config)
    assert (shape.num_layers, shape.num_heads, shape.num_kv_heads) == (4, 4, 2)
    assert (shape.hidden_size, shape.ffn_hidden_size, shape.vocab_size) == (64, 128, 300)
    assert check_layout(_section(tp=2, pp=2), shape, world_size=4).padded_vocab_size == 512
