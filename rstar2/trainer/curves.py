"""``curves.png``: reward, response length and tool calls per step, from ``metrics.jsonl``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PANELS = (
    ("reward_mean", "reward (mean over rollouts)"),
    ("response_tokens_mean", "response tokens (mean)"),
    ("tool_calls_per_traj", "tool calls per trajectory"),
)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_curves(metrics_path: Path, out_path: Path) -> Path | None:
    """Write the figure; None (and no file) when there is no step yet."""
    rows = [r for r in read_metrics(metrics_path) if "reward_mean" in r]
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PANELS), figsize=(5 * len(PANELS), 3.6))
    steps = [r["step"] for r in rows]
    for ax, (key, title) in zip(axes, PANELS, strict=True):
        ax.plot(steps, [r.get(key, float("nan")) for r in rows], marker=".", linewidth=1)
        ax.set_title(title)
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
    evals = [r for r in read_metrics(metrics_path) if any(k.startswith("eval/") for k in r)]
    for r in evals:  # held-out accuracy as points on the reward panel
        for k, v in r.items():
            if k.startswith("eval/") and k.endswith("/accuracy"):
                axes[0].scatter([r["step"]], [v], marker="x", color="black")
    fig.tight_layout()
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    return out_path
