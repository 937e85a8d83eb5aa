"""The problems a run trains and evaluates on: loaded, decontaminated (training only), templated.

Guarantees: a training problem that overlaps a built-in benchmark (:mod:`rstar2.data.decontam`)
is dropped when ``data.decontaminate`` is set, and the run folder's ``decontamination.json``
says how many were dropped from which source; evaluation sets are never decontaminated. Bad
rows (see :func:`rstar2.data.sources.load_rows`) and prompts longer than
``data.max_prompt_tokens`` are skipped and counted in :attr:`Problems.skipped`, or with
``data.strict`` stop the run with a one-line DataError; a source left empty is a DataError.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rstar2.agent.template import ChatTemplate
from rstar2.config import Config
from rstar2.data.schema import DataError, problem_text
from rstar2.data.sources import LoadedDataset, SkippedRow, load_rows

DECONTAMINATION = "decontamination.json"
_SHOWN = 3  # skipped rows named in the warning


@dataclass
class Problems:
    rows: list[dict[str, Any]]
    prompts: list[list[int]]
    truths: list[str]
    decontaminated: int = 0  # problems dropped for overlapping a benchmark
    skipped: list[SkippedRow] = field(default_factory=list)

    def skip_counts(self) -> dict[str, int]:
        """Skipped rows by kind (``malformed``, ``duplicate_id``, ``too_long``)."""
        return dict(Counter(s.kind for s in self.skipped))

    def skip_warning(self, key: str) -> str | None:
        """One line naming how many rows were skipped, why, and the first few; None if none."""
        if not self.skipped:
            return None
        kinds = ", ".join(f"{n} {kind.replace('_', ' ')}" for kind, n in self.skip_counts().items())
        first = "; ".join(str(s) for s in self.skipped[:_SHOWN])
        more = f"; and {len(self.skipped) - _SHOWN} more" if len(self.skipped) > _SHOWN else ""
        return (
            f"{key}: skipped {len(self.skipped)} row(s) ({kinds}): {first}{more} "
            "(data.strict: true stops on them instead)"
        )


def load_train_problems(cfg: Config, template: ChatTemplate, run_dir: Path) -> Problems:
    """``data.train_datasets``, decontaminated as ``data.decontaminate`` says."""
    from rstar2.data import benchmark_decontaminator

    decontaminator = benchmark_decontaminator() if cfg.data.decontaminate else None
    rows: list[dict[str, Any]] = []
    wheres: list[str] = []
    skipped: list[SkippedRow] = []
    report: dict[str, Any] = {"enabled": decontaminator is not None, "sources": {}}
    for spec in cfg.data.train_datasets:
        loaded = _load(spec, cfg.data.strict, "data.train_datasets")
        skipped += loaded.skipped
        kept = [
            (i, r)
            for i, r in enumerate(loaded.rows)
            if decontaminator is None or not decontaminator.is_contaminated(problem_text(r))
        ]
        report["sources"][spec] = {
            "rows": len(loaded.rows),
            "dropped": len(loaded.rows) - len(kept),
        }
        rows += [r for _, r in kept]
        wheres += [f"{spec}: problem {i + 1}" for i, _ in kept]
    report["dropped"] = sum(s["dropped"] for s in report["sources"].values())
    (run_dir / DECONTAMINATION).write_text(json.dumps(report, indent=2) + "\n")
    problems = _templated(rows, wheres, template, cfg, "data.train_datasets")
    problems.decontaminated = report["dropped"]
    problems.skipped = skipped + problems.skipped
    return problems


def load_eval_problems(cfg: Config, template: ChatTemplate) -> dict[str, Problems]:
    """Each of ``data.eval_datasets``, as it is (less its bad rows)."""
    out = {}
    for spec in cfg.data.eval_datasets:
        loaded = _load(spec, cfg.data.strict, "data.eval_datasets")
        wheres = [f"{spec}: problem {i + 1}" for i in range(len(loaded.rows))]
        problems = _templated(loaded.rows, wheres, template, cfg, "data.eval_datasets")
        problems.skipped = loaded.skipped + problems.skipped
        out[spec] = problems
    return out


def _load(spec: str, strict: bool, key: str) -> LoadedDataset:
    try:
        return load_rows(spec, strict=strict)
    except DataError as exc:
        hint = " (data.strict is on: set it to false to skip bad rows)" if strict else ""
        raise DataError(f"{key}: {exc}{hint}") from None


def _templated(
    rows: Sequence[dict[str, Any]],
    wheres: Sequence[str],
    template: ChatTemplate,
    cfg: Config,
    key: str,
) -> Problems:
    max_tokens = cfg.data.max_prompt_tokens
    out = Problems([], [], [])
    for row, where in zip(rows, wheres, strict=True):
        ids = template.encode_prompt(list(row["prompt"]))
        if len(ids) > max_tokens:
            reason = f"prompt of {len(ids)} tokens is over data.max_prompt_tokens ({max_tokens})"
            if cfg.data.strict:
                raise DataError(f"{key}: {where}: {reason} (data.strict is on)")
            out.skipped.append(SkippedRow(where, reason, "too_long"))
            continue
        out.rows.append(row)
        out.prompts.append(ids)
        out.truths.append(str(row["reward_model"]["ground_truth"]))
    if not out.rows:
        why = "fits data.max_prompt_tokens" if rows else "is left once bad rows are skipped"
        raise DataError(f"{key}: no problem {why}")
    return out
