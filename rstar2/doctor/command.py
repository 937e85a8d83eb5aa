"""``rstar2 doctor``: what is required comes from the flags, the config and the image."""

from __future__ import annotations

import argparse
import os

from rstar2.doctor.checks import exit_code, render
from rstar2.doctor.probes import Wanted, run

IMAGE_COMPONENTS = frozenset({"torch", "vllm", "megatron-core", "ray", "transformers"})


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="a run's YAML config: its accelerator, backend and services")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted config overrides")
    p.add_argument(
        "--require",
        action="append",
        default=[],
        choices=["vllm", "megatron-core", "transformer-engine", "ray", "transformers"],
        help="a component that must import (repeatable; torch always must)",
    )
    p.add_argument(
        "--accelerator",
        choices=["cpu", "cuda", "rocm"],
        help="GPUs that must be seen (default: the config's, or the image's RSTAR2_ACCELERATOR)",
    )
    p.add_argument("--redis", metavar="URL", help="a Redis that must answer")
    p.add_argument("--sandbox", metavar="URL", help="a sandbox-pool server that must answer")
    p.add_argument(
        "--ray",
        metavar="ADDRESS",
        default=os.environ.get("RAY_ADDRESS"),
        help="a Ray cluster to join and list (default: RAY_ADDRESS)",
    )
    p.add_argument(
        "--smoke",
        action="store_true",
        help="also one sandbox call and one learner step on the first GPU (or the CPU)",
    )


def wanted(args: argparse.Namespace) -> Wanted:
    """Required checks: the flags', the config's (when given) and, in an image, its stack.
    The accelerator: the flag's, else the config's, else the image's."""
    components = {"torch", *args.require}
    accelerator = args.accelerator
    redis_url, sandbox_url = args.redis, args.sandbox
    if args.config or args.overrides:
        from rstar2.config_io import load_config

        config = load_config(args.config, args.overrides)
        accelerator = accelerator or config.cluster.accelerator
        components.add("vllm")
        if config.learner.backend == "megatron":
            components.add("megatron-core")
        if config.cluster.ray:
            components.add("ray")
        if config.cluster.colocate:
            components.add("vllm sleep mode")
        sandbox = config.sandbox
        redis_url = redis_url or getattr(sandbox, "redis_url", None)
        sandbox_url = sandbox_url or getattr(sandbox, "url", None)
    image_accelerator = os.environ.get("RSTAR2_ACCELERATOR")
    if image_accelerator in ("cuda", "rocm"):
        components |= IMAGE_COMPONENTS
        accelerator = accelerator or image_accelerator
    return Wanted(
        components=frozenset(components),
        accelerator=accelerator,
        redis_url=redis_url,
        sandbox_url=sandbox_url,
        ray_address=args.ray,
        smoke=args.smoke,
    )


def main(args: argparse.Namespace) -> int:
    checks = []
    for check in run(wanted(args)):
        checks.append(check)
        print(render(check), flush=True)
    failed = [c.name for c in checks if c.required and not c.ok]
    if failed:
        print(f"rstar2 doctor: {len(failed)} required check(s) failed: {', '.join(failed)}")
    return exit_code(checks)
