"""Optional metric sinks beside ``metrics.jsonl``: TensorBoard and Weights & Biases.

Both packages are optional. Asking for a sink whose package is missing is a config error,
raised before training starts. Every numeric field of a metrics line goes to the sinks under
its own name, at its ``step``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rstar2.config import ConfigError, LoggingConfig


class MetricSinks:
    def __init__(self, cfg: LoggingConfig, run_dir: Path, config: dict[str, Any]) -> None:
        self._tb: Any = None
        self._wandb: Any = None
        if cfg.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise ConfigError(
                    "logging.tensorboard", "needs the tensorboard package (pip install tensorboard)"
                ) from None
            self._tb = SummaryWriter(str(run_dir / "tensorboard"))
        if cfg.wandb_project:
            try:
                import wandb
            except ImportError:
                raise ConfigError(
                    "logging.wandb_project", "needs the wandb package (pip install wandb)"
                ) from None
            self._wandb = wandb.init(
                project=cfg.wandb_project,
                name=run_dir.name,
                id=run_dir.name,
                dir=str(run_dir),
                config=config,
                resume="allow",
            )

    def log(self, record: dict[str, Any]) -> None:
        step = int(record.get("step", 0))
        values = {
            k: float(v)
            for k, v in record.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and k != "step"
        }
        if not values:
            return
        if self._tb is not None:
            for key, value in values.items():
                self._tb.add_scalar(key, value, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(values, step=step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
