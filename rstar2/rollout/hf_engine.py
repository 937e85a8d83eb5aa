"""``HFEngine``: the Engine protocol over a transformers model in this process, without vLLM.

A reference engine: exact and slow (one request at a time, no batching, no paged KV). It is what
the trainer's fast tests run on, and a way to debug a model where vLLM does not install.
Sampling is seeded per request (``SamplingSettings.seed``, else the engine seed and a counter),
so the same request gives the same tokens however requests interleave. Log-probs are the
model's raw ones (before temperature), as vLLM reports them. Weight updates load HF-named
tensors in place.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterable, Sequence
from typing import Any

from rstar2.rollout.engine import FinishReason, Generation, KVStats, SamplingSettings

_CAPACITY_TOKENS = 1 << 20  # no paged KV: capacity is whatever memory allows


class HFEngine:
    def __init__(self, model: Any, *, seed: int = 0) -> None:
        self._model = model.eval()
        self._seed = seed
        self._counter = itertools.count()
        self._lock = asyncio.Lock()
        self._running = 0

    @classmethod
    def load(cls, model_path: str, *, seed: int = 0) -> HFEngine:
        import torch
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        return cls(model, seed=seed)

    @property
    def block_size(self) -> int:
        return 16

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingSettings) -> Generation:
        async with self._lock:
            self._running += 1
            try:
                return await self._generate(list(prompt_ids), sampling)
            finally:
                self._running -= 1

    async def _generate(self, ids: list[int], sampling: SamplingSettings) -> Generation:
        import torch

        seed = sampling.seed if sampling.seed is not None else self._seed + next(self._counter)
        gen = torch.Generator().manual_seed(seed)
        out: list[int] = []
        logprobs: list[float] = []
        reason: FinishReason = "length"
        past = None
        step_input = torch.tensor([ids])
        with torch.no_grad():
            for _ in range(sampling.max_tokens):
                result = self._model(input_ids=step_input, past_key_values=past, use_cache=True)
                past = result.past_key_values
                logits = result.logits[0, -1].float()
                token = _sample(logits, sampling, gen)
                out.append(token)
                logprobs.append(float(torch.log_softmax(logits, -1)[token]))
                if token in sampling.stop_token_ids:
                    reason = "stop"
                    break
                step_input = torch.tensor([[token]])
                await asyncio.sleep(0)  # let tool calls and other trajectories progress
        return Generation(token_ids=out, logprobs=logprobs, finish_reason=reason)

    def alive(self) -> bool:
        return True  # in this process

    def kv_stats(self) -> KVStats:
        return KVStats(_CAPACITY_TOKENS, 0, self._running, 0)

    async def begin_weight_update(self) -> None:
        pass

    async def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        import torch

        params = dict(self._model.named_parameters())
        with torch.no_grad():
            for name, tensor in named_tensors:
                if name in params:
                    params[name].copy_(tensor)
                elif name == "lm_head.weight" and "model.embed_tokens.weight" in params:
                    params["model.embed_tokens.weight"].copy_(tensor)  # tied embeddings

    async def finish_weight_update(self) -> None:
        pass

    async def aclose(self) -> None:
        self._model = None


def _sample(logits: Any, sampling: SamplingSettings, gen: Any) -> int:
    import torch

    if sampling.temperature == 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / sampling.temperature, -1)
    if sampling.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_p, -1) - sorted_p < sampling.top_p
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_p[keep])
        probs = probs / probs.sum()
    return int(torch.multinomial(probs, 1, generator=gen))
