"""``OpenAIServerEngine``: the Engine protocol over a running ``vllm serve`` (OpenAI API).

Prompts are sent as token ids to ``/v1/completions`` and sampled ids come back as
``token_id:N`` strings with their log-probs (``return_tokens_as_token_ids``), so nothing is
re-tokenised. KV usage and queue lengths are read from the server's Prometheus ``/metrics``
(``vllm:kv_cache_usage_perc``, ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
``vllm:num_preemptions_total``, and ``vllm:prefix_cache_queries_total`` / ``_hits_total``, which
leave out preempted requests' re-admissions); capacity from ``vllm:cache_config_info``.
:meth:`OpenAIServerEngine.create` reads them once before the scheduler is built (it needs the
capacity), then keeps them fresh in a background task (the dispatcher reads ``kv_stats()``
without awaiting).
Weight updates go through the dev-mode ``/collective_rpc`` endpoint (server started with
``VLLM_SERVER_DEV_MODE=1`` and the rstar2 worker extension).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from rstar2.rollout.engine import EngineDown, FinishReason, Generation, KVStats, SamplingSettings

_METRICS_TIMEOUT_S = 10.0  # one /metrics read; a server that takes longer keeps its last stats
_METRIC = re.compile(r"^(vllm:[a-z_]+)(\{[^}]*\})?\s+([0-9.eE+-]+)$", re.MULTILINE)


@dataclass(frozen=True)
class OpenAIServerConfig:
    """A running server: its base URL and the served model's name."""

    url: str
    model: str


class ServerUnreachable(Exception):
    """No vLLM server answers /metrics at the URL, or it reports no KV cache."""


class OpenAIServerEngine:
    """Built by :meth:`create` for a rollout (stats read and kept fresh); constructed directly,
    ``kv_stats()`` stays at zero until :meth:`refresh_kv_stats` is awaited."""

    def __init__(self, url: str, model: str, *, timeout_s: float = 600.0) -> None:
        self.url = url.rstrip("/")
        self.model = model
        self._session: aiohttp.ClientSession | None = None
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._kv = KVStats(0, 0, 0, 0)
        self._block_size = 16  # vLLM's default, until /metrics says (refresh_kv_stats)
        self._refresher: asyncio.Task[None] | None = None
        self.stats_failures = 0  # background reads that failed (the last stats were kept)

    @classmethod
    async def create(
        cls,
        url: str,
        model: str,
        *,
        tasks: asyncio.TaskGroup | None = None,
        stats_interval_s: float = 0.25,
        timeout_s: float = 600.0,
    ) -> OpenAIServerEngine:
        """The engine with its KV capacity and block size read from the server, and a task
        (in ``tasks``, else the running loop; stopped by :meth:`aclose`) that reads the stats
        again every ``stats_interval_s``. :class:`ServerUnreachable` when the first read
        fails or the server reports no KV capacity."""
        engine = cls(url, model, timeout_s=timeout_s)
        try:
            stats = await engine.refresh_kv_stats()
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            await engine.aclose()
            reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            raise ServerUnreachable(f"no vLLM server answers at {engine.url} ({reason})") from None
        if stats.capacity_tokens <= 0:
            await engine.aclose()
            raise ServerUnreachable(
                f"the server at {engine.url} reports no KV cache capacity "
                "(vllm:cache_config_info on /metrics): is it a vLLM server?"
            )
        spawn = tasks.create_task if tasks else asyncio.get_running_loop().create_task
        engine._refresher = spawn(engine._keep_fresh(stats_interval_s))
        return engine

    async def _keep_fresh(self, interval_s: float) -> None:
        """Read /metrics every ``interval_s``; a failed read keeps the last stats (a server
        that went away shows in its next request, which raises EngineDown)."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.refresh_kv_stats()
            except Exception:  # any failed read, a malformed page included: not the run's end
                self.stats_failures += 1

    @property
    def block_size(self) -> int:
        return self._block_size

    async def aclose(self) -> None:
        """Stop the stats task and the HTTP session (idempotent)."""
        if self._refresher is not None:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresher
            self._refresher = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self._session

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingSettings) -> Generation:
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": list(prompt_ids),
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "logprobs": 0,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
        }
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if sampling.stop_token_ids:
            body["stop_token_ids"] = list(sampling.stop_token_ids)
        if sampling.ignore_eos:  # vLLM's extra sampling parameter
            body["ignore_eos"] = True
        try:
            async with self._http().post(f"{self.url}/v1/completions", json=body) as resp:
                if resp.status != 200:
                    detail = (await resp.text())[:300]
                    extra = {"http": resp.status, "detail": detail}
                    return Generation([], [], "error", extra=extra)
                data = await resp.json()
        except aiohttp.ClientConnectionError as exc:  # refused, reset, or the server went away
            raise EngineDown(f"vLLM server {self.url}: {exc}") from exc
        choice = data["choices"][0]
        lp = choice.get("logprobs") or {}
        ids = [int(t.removeprefix("token_id:")) for t in lp.get("tokens", [])]
        logprobs = [float(x) for x in lp.get("token_logprobs", [])]
        reason: FinishReason = "length" if choice.get("finish_reason") == "length" else "stop"
        return Generation(token_ids=ids, logprobs=logprobs, finish_reason=reason)

    async def refresh_kv_stats(self) -> KVStats:
        """Read the server's /metrics; :meth:`kv_stats` returns the last reading."""
        timeout = aiohttp.ClientTimeout(total=_METRICS_TIMEOUT_S)
        async with self._http().get(f"{self.url}/metrics", timeout=timeout) as resp:
            resp.raise_for_status()
            text = await resp.text()
        values: dict[str, float] = {}
        labels: dict[str, str] = {}
        for name, label, value in _METRIC.findall(text):
            values[name] = values.get(name, 0.0) + float(value)
            labels[name] = label
        blocks = _label(labels.get("vllm:cache_config_info", ""), "num_gpu_blocks")
        block_size = _label(labels.get("vllm:cache_config_info", ""), "block_size")
        capacity = int(float(blocks or 0) * float(block_size or 0))
        if block_size:
            self._block_size = int(float(block_size))
        self._kv = KVStats(
            capacity_tokens=capacity,
            used_tokens=round(values.get("vllm:kv_cache_usage_perc", 0.0) * capacity),
            num_running=int(values.get("vllm:num_requests_running", 0)),
            num_waiting=int(values.get("vllm:num_requests_waiting", 0)),
            num_preemptions=int(values.get("vllm:num_preemptions_total", 0)),
            prefix_queries_tokens=_count(values, "vllm:prefix_cache_queries_total"),
            prefix_hits_tokens=_count(values, "vllm:prefix_cache_hits_total"),
        )
        return self._kv

    def alive(self) -> bool:
        """Not probed here: a server that went away shows in its next request."""
        return True

    def kv_stats(self) -> KVStats:
        return self._kv

    async def begin_weight_update(self) -> None:
        """Nothing to prepare: each bucket is loaded as it comes."""

    async def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        """Stage one bucket in a file the server can read (same node) and load it."""
        from safetensors.torch import save_file

        tensors = {name: t.detach().contiguous().cpu() for name, t in named_tensors}
        folder = "/dev/shm" if os.path.isdir("/dev/shm") else None
        with tempfile.NamedTemporaryFile(dir=folder, suffix=".safetensors") as staged:
            save_file(tensors, staged.name)
            rpc = {"method": "load_weights_file", "args": [staged.name]}
            async with self._http().post(f"{self.url}/collective_rpc", json=rpc) as resp:
                resp.raise_for_status()

    async def finish_weight_update(self) -> None:
        """Drop the server's prefix cache: its KV was computed by the old weights."""
        async with self._http().post(f"{self.url}/reset_prefix_cache") as resp:
            resp.raise_for_status()


def _count(values: dict[str, float], name: str) -> int | None:
    """A counter's value, None when the server does not export it."""
    return int(values[name]) if name in values else None


def _label(labels: str, key: str) -> str | None:
    match = re.search(rf'{key}="([^"]*)"', labels)
    return match.group(1) if match else None
