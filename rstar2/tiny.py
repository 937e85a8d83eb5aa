"""Tiny models for CPU tests, demos and the toy recipe: built locally in seconds, no hub.

:func:`build_tiny_model` writes an HF folder (config, float32 safetensors, tokenizer) that both
transformers and vLLM load: a Qwen3- or Qwen2-architecture model with untied embeddings (vLLM's
CPU weight reload mishandles tied ones) and a byte-level BPE tokenizer trained on ``corpus`` with
the ChatML special tokens ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>`` (end of turn).
head_dim is a multiple of 32 so vLLM's CPU attention takes its fast path.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def build_tokenizer(
    out_dir: Path, corpus: Iterable[str], vocab_size: int = 1024, digit_group: int | None = None
) -> None:
    """Train a byte-level BPE tokenizer on ``corpus`` and save it as an HF tokenizer.

    ``digit_group``: split digit runs into pieces of at most this many digits before BPE (as
    GPT-4's tokenizer does with 3), so a number tokenizes the same wherever it appears.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if digit_group is None:
        tok.pre_tokenizer = byte_level
    else:
        digits = pre_tokenizers.Split(Regex(rf"\d{{1,{digit_group}}}"), behavior="isolated")
        tok.pre_tokenizer = pre_tokenizers.Sequence([digits, byte_level])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(out_dir)


def build_tiny_model(
    out_dir: Path,
    corpus: Iterable[str],
    *,
    arch: Literal["qwen3", "qwen2"] = "qwen3",
    hidden_size: int = 128,
    num_layers: int = 2,
    vocab_size: int = 1024,
    num_heads: int = 2,
    num_kv_heads: int = 1,
    max_position_embeddings: int = 2048,
    digit_group: int | None = None,
    tie_word_embeddings: bool = False,
    seed: int = 0,
) -> Path:
    """Write tokenizer + randomly initialised model to ``out_dir``; returns ``out_dir``."""
    import torch
    from transformers import (
        AutoTokenizer,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    build_tokenizer(out_dir, corpus, vocab_size, digit_group)
    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    common: dict[str, Any] = dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=64,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = (
        Qwen3ForCausalLM(Qwen3Config(**common))
        if arch == "qwen3"
        else Qwen2ForCausalLM(Qwen2Config(**common))
    )
    model.generation_config.eos_token_id = common["eos_token_id"]
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir
