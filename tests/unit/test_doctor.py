"""rstar2 doctor's pure parts: how a check prints, the exit status, what a config requires."""

from __future__ import annotations

import argparse

from rstar2.doctor.checks import Check, exit_code, render
from rstar2.doctor.command import add_arguments, wanted


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_a_line_per_check_and_only_required_failures_fail():
    checks = [
        Check("torch", True, "2.13.0", required=True),
        Check("transformer-engine", False, "not importable:\n  ModuleNotFoundError"),
    ]
    lines = [render(c) for c in checks]
    assert lines[0].split() == ["ok", "torch", "2.13.0"]
    assert lines[1].startswith("warn ") and "\n" not in lines[1]
    assert exit_code(checks) == 0
    assert exit_code([*checks, Check("redis", False, "refused", required=True)]) == 1
    assert render(Check("redis", False, "refused", required=True)).startswith("FAIL ")


def test_requirements_come_from_flags_config_and_image(monkeypatch):
    monkeypatch.delenv("RSTAR2_ACCELERATOR", raising=False)
    plain = wanted(_args())
    assert plain.components == {"torch"} and plain.accelerator is None
    config = wanted(
        _args(
            "learner.backend=megatron",
            "cluster.ray=true",
            "sandbox.mode=redis",
            "sandbox.redis_url=redis://h:6379/0",
            "cluster.accelerator=rocm",
        )
    )
    assert {"vllm", "megatron-core", "ray"} <= config.components
    assert config.redis_url == "redis://h:6379/0" and config.accelerator == "rocm"
    monkeypatch.setenv("RSTAR2_ACCELERATOR", "rocm")
    image = wanted(_args("--redis", "redis://x:1"))
    assert image.accelerator == "rocm" and {"vllm", "megatron-core", "ray"} <= image.components
    assert wanted(_args("--accelerator", "cpu")).accelerator == "cpu"
