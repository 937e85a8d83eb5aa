"""What every learner backend's settings take from a run's config, besides its own section."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rstar2.algo.loss import settings_from_config

if TYPE_CHECKING:
    from rstar2.config import Config, OptimConfig


def run_fields(cfg: Config, model_path: str, optim: OptimConfig | None) -> dict[str, Any]:
    """Weights, optimizer (``optim`` replaces ``cfg.optim``: SFT's), the learner section, loss,
    device family and seed, as the settings dataclasses name them."""
    return {
        "model_path": model_path,
        "optim": optim or cfg.optim,
        "learner": cfg.learner,
        "loss": settings_from_config(cfg.algorithm),
        "device": "cpu" if cfg.cluster.accelerator == "cpu" else "auto",
        "seed": cfg.seed,
    }
