"""The problems a run trains and evaluates on: loaded, decontaminated (training only), templated.

Guarantees: a training problem that overlaps a built-in benchmark (:mod:`rstar2.data.decontam`)
is dropped when ``data.decontaminate`` is set, and the run folder's ``decontamination.json``
says how many were dropped from which source; evaluation sets are never filtered. Prompts
longer than ``data.max_prompt_tokens`` are dropped; a source left empty is a DataError.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rstar2.agent.template import ChatTemplate
from rstar2.config import Config
from rstar2.data.schema import DataError, problem_text

DECONTAMINATION = "decontamination.json"


@dataclass
class Problems:
    rows: list[dict[str, Any]]
    prompts: list[list[int]]
    truths: list[str]
    decontaminated: int = 0  # problems dropped for overlapping a benchmark


def load_train_problems(cfg: Config, template: ChatTemplate, run_dir: Path) -> Problems:
    """``data.train_datasets``, decontaminated as ``data.decontaminate`` says."""
    from rstar2.data import benchmark_decontaminator
    from rstar2.data.sources import load_rows

    decontaminator = benchmark_decontaminator() if cfg.data.decontaminate else None
    rows: list[dict[str, Any]] = []
    report: dict[str, Any] = {"enabled": decontaminator is not None, "sources": {}}
    for spec in cfg.data.train_datasets:
        loaded = load_rows(spec).rows
        kept = [
            r
            for r in loaded
            if decontaminator is None or not decontaminator.is_contaminated(problem_text(r))
        ]
        report["sources"][spec] = {"rows": len(loaded), "dropped": len(loaded) - len(kept)}
        rows += kept
    report["dropped"] = sum(s["dropped"] for s in report["sources"].values())
    (run_dir / DECONTAMINATION).write_text(json.dumps(report, indent=2) + "\n")
    problems = _templated(rows, template, cfg.data.max_prompt_tokens, "data.train_datasets")
    problems.decontaminated = report["dropped"]
    return problems


def load_eval_problems(cfg: Config, template: ChatTemplate) -> dict[str, Problems]:
    """Each of ``data.eval_datasets``, as it is."""
    from rstar2.data.sources import load_rows

    return {
        spec: _templated(
            load_rows(spec).rows, template, cfg.data.max_prompt_tokens, "data.eval_datasets"
        )
        for spec in cfg.data.eval_datasets
    }


def _templated(
    rows: Sequence[dict[str, Any]], template: ChatTemplate, max_tokens: int, key: str
) -> Problems:
    out = Problems([], [], [])
    for row in rows:
        ids = template.encode_prompt(list(row["prompt"]))
        if len(ids) <= max_tokens:
            out.rows.append(row)
            out.prompts.append(ids)
            out.truths.append(str(row["reward_model"]["ground_truth"]))
    if not out.rows:
        raise DataError(f"{key}: no problem fits data.max_prompt_tokens")
    return out
