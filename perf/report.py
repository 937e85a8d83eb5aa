"""A suite run's report.md and PNG plots, from its results file's content."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from perf.figures import Change, Figure, table


def plots(run: dict[str, Any], out_dir: Path) -> list[Path]:
    """The plots this run's benchmarks allow; [] where matplotlib is missing (GPU machine)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import NullFormatter
    except ImportError:
        return []
    results = {name: b["result"] for name, b in run["benchmarks"].items() if b.get("result")}
    made = []
    sandbox = results.get("sandbox")
    if sandbox:
        cells = [
            (k, r)
            for k, r in sorted(sandbox["rows"].items())
            if k.endswith("/c1") and r.get("cdf_ms")
        ]
        workloads = sorted({k.split("/")[1] for k, _ in cells})
        colors = {"embedded": "#4c72b0", "http": "#55a868", "baseline": "#c44e52"}
        shown = {"embedded": "embedded pool", "http": "HTTP", "baseline": "fresh python3"}
        fig, axes = plt.subplots(
            1, len(workloads), figsize=(3.2 * len(workloads), 3.4), squeeze=False
        )
        for ax, workload in zip(axes[0], workloads, strict=True):
            for key, row in cells:
                system, wl, _ = key.split("/")
                if wl == workload:
                    cdf = row["cdf_ms"]
                    ys = [i / (len(cdf) - 1) for i in range(len(cdf))]
                    ax.plot(
                        cdf,
                        ys,
                        color=colors.get(system),
                        label=shown.get(system, system),
                        drawstyle="steps-post",
                    )
            low, high = ax.get_xlim()
            if high > 10 * max(low, 1e-3):  # a log axis only where it spans a decade
                ax.set_xscale("log")
                ax.xaxis.set_minor_formatter(NullFormatter())  # labels would overlap
            ax.set_title(workload, fontsize=10)
            ax.set_xlabel("ms per call")
            ax.grid(alpha=0.3)
        axes[0][0].set_ylabel("fraction of calls")
        axes[0][0].legend(fontsize=7)
        fig.suptitle("sandbox latency CDF, one call at a time")
        made.append(_save(fig, out_dir / "sandbox-latency-cdf.png"))
    sim = results.get("rollout_sim")
    if sim:
        fig, ax = plt.subplots(figsize=(7, 4))
        names = list(sim["policies"])
        spans = [sim["policies"][n]["makespan_s"] for n in names]
        ax.bar(names, spans, color="#4c72b0")
        ax.axhline(sim["lower_bound_s"], color="#c44e52", linestyle="--", label="lower bound")
        ax.set_ylabel("simulated makespan (s)")
        ax.set_title(
            f"rollout makespan per policy ({sim['trajectories']} trajectories, "
            f"{sim['engines']} engines)"
        )
        ax.legend()
        made.append(_save(fig, out_dir / "rollout-makespan-per-policy.png"))
    bars: dict[str, float] = {}
    if results.get("learner"):
        learner = results["learner"]
        bars[f"torch ({learner['device']}, {learner['model']})"] = learner["tokens_per_s"]
    backends = results.get("learner_backends") or {}
    mfu: dict[str, float] = {}
    for name, row in backends.get("results", {}).items():
        if "error" in row:  # a failed row (an OOM): in the results file, not on the plot
            continue
        bars[name] = row["tokens_per_s"]
        mfu[name] = row["mfu"]
    if bars:
        fig, ax = plt.subplots(figsize=(7, 4))
        drawn = ax.bar(list(bars), list(bars.values()), color="#55a868")
        ax.bar_label(drawn, labels=[f"MFU {mfu[n]:.0%}" if n in mfu else "" for n in bars])
        ax.margins(y=0.12)
        ax.set_ylabel("tokens/s")
        where = f": {backends['model']}, {backends['device']}" if backends else ""
        ax.set_title(f"learner throughput per backend{where}")
        plt.setp(ax.get_xticklabels(), rotation=20, ha="right")
        made.append(_save(fig, out_dir / "learner-tokens-per-s.png"))
    return made


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def markdown(
    run: dict[str, Any],
    figures: list[Figure],
    changes: list[Change],
    images: list[Path],
    out_dir: Path,
) -> str:
    hw = run["hardware"]
    lines = [
        f"# perf: {run['host']} at {run['commit']} ({run['date']})",
        "",
        f"Hardware: {hw.get('cpu_model', hw.get('cpu'))}, {hw['cores']} cores, "
        f"{hw['memory_gib']} GiB"
        + (f", {hw['gpu']}" if hw.get("gpu") else "")
        + f". Suite: {'quick' if run['quick'] else 'full'}"
        + (", GPU" if run.get("gpu") else "")
        + ".",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in run["versions"].items() if v) + ".",
        "",
        "Ratio figures divide by a reference measured in the same run and hold across runs on "
        "a noisy machine; absolute figures hold only where nothing else runs.",
    ]
    if run.get("baseline"):
        flagged = sum(c.flagged for c in changes)
        lines += [
            "",
            f"Compared with {run['baseline']}: {flagged} figure(s) more than 5% worse "
            "(marked `!`).",
        ]
    lines += ["", "| benchmark | seconds | status |", "|---|---|---|"]
    for name, bench in run["benchmarks"].items():
        lines.append(f"| {name} | {bench['seconds']:.0f} | {bench['status']} |")
    lines += ["", "```", *table(figures, changes), "```", ""]
    for image in images:
        lines += [f"![{image.stem}]({image.relative_to(out_dir)})", ""]
    return "\n".join(lines)
