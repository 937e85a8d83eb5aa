"""``rstar2 eval``: sample ``n`` tool-using answers per problem, grade them, write a report.

Every problem of a dataset (a built-in benchmark or a file) is answered ``n`` times through the
same agent loop and scheduler as training; each answer is graded by the math reward. Reported:
avg@n (the mean over problems of the fraction of correct answers, i.e. pass@1 estimated from n
samples), unbiased pass@k for k = 1, 2, 4, ... up to n (Chen et al. 2021), mean response tokens,
tool calls and tool errors per answer, how answers ended, and a per-problem table.
``report.json`` (everything, per problem included) and ``report.md`` go to the output folder.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from rstar2.agent.loop import AgentSettings, Trajectory
from rstar2.agent.template import ChatTemplate, PromptFormat


@dataclass(frozen=True, kw_only=True)
class EvalSettings:
    n: int = 16
    temperature: float = 0.6
    top_p: float = 1.0
    max_tokens: int = 30720
    max_turns: int = 30
    seed: int = 0


@dataclass
class ProblemResult:
    index: int
    problem: str
    answer: str
    correct: int
    n: int
    mean_response_tokens: float
    mean_tool_calls: float
    finish_reasons: dict[str, int] = field(default_factory=dict)

    @property
    def accuracy(self) -> float:
        return self.correct / self.n if self.n else 0.0


def pass_at_k(n: int, correct: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``correct`` are right: 1 - C(n-c, k)/C(n, k)."""
    if not 0 < k <= n:
        raise ValueError(f"k must be in 1..{n}")
    if n - correct < k:
        return 1.0
    return 1.0 - math.comb(n - correct, k) / math.comb(n, k)


def k_values(n: int) -> list[int]:
    ks = [1]
    while ks[-1] * 2 <= n:
        ks.append(ks[-1] * 2)
    if ks[-1] != n:
        ks.append(n)
    return ks


def summarize(
    dataset: str, results: Sequence[ProblemResult], trajs_total: dict[str, float]
) -> dict[str, Any]:
    """The report (pure): overall figures plus the per-problem list."""
    n = results[0].n if results else 0
    overall = {
        "dataset": dataset,
        "problems": len(results),
        "samples_per_problem": n,
        f"avg@{n}": _mean([r.accuracy for r in results]),
        "pass@k": {
            str(k): _mean([pass_at_k(r.n, r.correct, k) for r in results]) for k in k_values(n)
        }
        if n
        else {},
        "mean_response_tokens": _mean([r.mean_response_tokens for r in results]),
        "mean_tool_calls": _mean([r.mean_tool_calls for r in results]),
        **trajs_total,
    }
    return {"summary": overall, "problems": [asdict(r) | {"accuracy": r.accuracy} for r in results]}


def _mean(values: Sequence[float]) -> float:
    return round(sum(values) / len(values), 6) if values else 0.0


def render_markdown(report: dict[str, Any]) -> str:
    s = report["summary"]
    n = s["samples_per_problem"]
    lines = [
        f"# Evaluation: {s['dataset']}",
        "",
        f"{s['problems']} problems x {n} samples.",
        "",
        "| metric | value |",
        "|---|---|",
        f"| avg@{n} (pass@1) | {100 * s[f'avg@{n}']:.1f}% |",
        *[f"| pass@{k} | {100 * v:.1f}% |" for k, v in s["pass@k"].items() if k != "1"],
        f"| mean response tokens | {s['mean_response_tokens']:.0f} |",
        f"| mean tool calls per answer | {s['mean_tool_calls']:.2f} |",
        f"| tool error ratio | {100 * s['tool_error_ratio']:.1f}% |",
        "",
        "| # | answer | correct | accuracy | tokens | tool calls | problem |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in report["problems"]:
        problem = " ".join(p["problem"].split())
        problem = problem[:80] + ("..." if len(problem) > 80 else "")
        answer = p["answer"].replace("|", "\\|")
        lines.append(
            f"| {p['index']} | {answer} | {p['correct']}/{p['n']} | {100 * p['accuracy']:.0f}% "
            f"| {p['mean_response_tokens']:.0f} | {p['mean_tool_calls']:.2f} "
            f"| {problem.replace('|', '/')} |"
        )
    return "\n".join(lines) + "\n"


async def evaluate(
    *,
    dataset: str,
    rows: Sequence[dict[str, Any]],
    run: Any,
    scorer: Any,
    template: ChatTemplate,
    settings: EvalSettings,
    progress: Any = None,
) -> dict[str, Any]:
    """Answer every row ``settings.n`` times with ``run(prompt_ids, agent_settings)`` (an async
    callable returning a :class:`Trajectory`), grade with ``scorer.ascore``, and summarize."""
    agent = AgentSettings(
        max_turns=settings.max_turns,
        max_response_tokens=settings.max_tokens,
        temperature=settings.temperature,
        top_p=settings.top_p,
    )

    async def one(row: dict[str, Any], k: int) -> tuple[Trajectory, float]:
        prompt = template.encode_prompt(list(row["prompt"]))
        seeded = replace(agent, seed=settings.seed + 7919 * k)
        traj: Trajectory = await run(prompt, seeded)
        reward = await scorer.ascore(traj.response_text, str(row["reward_model"]["ground_truth"]))
        if progress is not None:
            progress.update(1)
        return traj, reward

    jobs = [one(row, k) for row in rows for k in range(settings.n)]
    done = await asyncio.gather(*jobs)
    results: list[ProblemResult] = []
    calls = errors = 0
    for i, row in enumerate(rows):
        chunk = done[i * settings.n : (i + 1) * settings.n]
        trajs = [t for t, _ in chunk]
        calls += sum(t.num_tool_calls for t in trajs)
        errors += sum(t.num_tool_errors for t in trajs)
        results.append(
            ProblemResult(
                index=i,
                problem=str(row["prompt"][-1]["content"]),
                answer=str(row["reward_model"]["ground_truth"]),
                correct=sum(1 for _, r in chunk if r >= 1.0),
                n=settings.n,
                mean_response_tokens=_mean([len(t.response_ids) for t in trajs]),
                mean_tool_calls=_mean([t.num_tool_calls for t in trajs]),
                finish_reasons=dict(Counter(t.finish_reason for t in trajs)),
            )
        )
    totals = {"tool_error_ratio": round(errors / calls, 6) if calls else 0.0}
    report = summarize(dataset, results, totals)
    report["settings"] = asdict(settings)
    return report


def write_report(report: dict[str, Any], out_dir: Path) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / "report.json", out_dir / "report.md"
    json_path.write_text(json.dumps(report, indent=2) + "\n")
    md_path.write_text(render_markdown(report))
    return json_path, md_path


def add_arguments(p: argparse.ArgumentParser) -> None:
    from rstar2.chat import add_service_arguments

    add_service_arguments(p)
    p.add_argument("--dataset", required=True, help="aime24|aime25|hmmt25|math500 or a file")
    p.add_argument("--n", type=int, default=16, help="samples per problem")
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-tokens", type=int, default=30720, help="response budget per answer")
    p.add_argument("--max-turns", type=int, default=30, help="assistant turns per answer")
    p.add_argument("--limit", type=int, help="only the first N problems")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="report folder (default: runs/eval-DATASET-TIME)")
    p.add_argument("--max-model-len", type=int, help="engine context (default: budget + 4096)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


async def run_eval_command(args: argparse.Namespace) -> int:
    """The ``rstar2 eval`` command; returns the exit code (2 with one line on a user error)."""
    from rstar2.data.sources import load_rows

    if args.n < 1 or args.max_tokens < 1 or args.max_turns < 1:
        print("rstar2 eval: --n, --max-tokens and --max-turns must be positive", file=sys.stderr)
        return 2
    if args.model and not (Path(args.model) / "config.json").is_file():
        print(f"rstar2 eval: {args.model} is not a model folder (no config.json)", file=sys.stderr)
        return 2
    tokenizer_path = args.tokenizer or args.model
    if not tokenizer_path:
        print(
            "rstar2 eval: --server needs --tokenizer (the served model's folder)", file=sys.stderr
        )
        return 2
    loaded = load_rows(args.dataset)  # DataError: exit 2 in rstar2.cli
    rows = loaded.rows[: args.limit] if args.limit else loaded.rows
    out = args.out or Path("runs") / f"eval-{loaded.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    settings = EvalSettings(
        n=args.n,
        temperature=args.temperature,
        top_p=args.top_p,
        max_tokens=args.max_tokens,
        max_turns=args.max_turns,
        seed=args.seed,
    )
    report = await _evaluate_with_services(args, loaded.name, rows, tokenizer_path, settings)
    json_path, md_path = write_report(report, out)
    s = report["summary"]
    print(
        f"{s['dataset']}: avg@{settings.n} {100 * s[f'avg@{settings.n}']:.1f}%, "
        f"{s['mean_response_tokens']:.0f} tokens and {s['mean_tool_calls']:.2f} tool calls "
        f"per answer; wrote {json_path} and {md_path}"
    )
    return 0


async def _evaluate_with_services(
    args: argparse.Namespace,
    dataset: str,
    rows: Sequence[dict[str, Any]],
    tokenizer_path: str,
    settings: EvalSettings,
) -> dict[str, Any]:
    from tqdm import tqdm
    from transformers import AutoTokenizer

    from rstar2.chat import SANDBOX_REFUSAL, engine_spec, sandbox_section
    from rstar2.config import RewardConfig, SchedulerConfig
    from rstar2.runtime import Runtime, ServicesSpec
    from rstar2.runtime.placement import LocalPlacement

    template = PromptFormat.load(tokenizer_path).template(
        AutoTokenizer.from_pretrained(tokenizer_path)
    )
    max_model_len = args.max_model_len or settings.max_tokens + 4096
    spec = ServicesSpec(
        engine=engine_spec(args, tokenizer_path, max_model_len),
        sandbox=sandbox_section(args),
        reward=RewardConfig(),
        scheduler=SchedulerConfig(),
        sandbox_refusal=SANDBOX_REFUSAL,
    )
    async with (
        Runtime(LocalPlacement()) as runtime,
        runtime.services(spec) as services,
    ):
        with tqdm(
            total=len(rows) * settings.n, desc="eval", unit="answer", disable=args.quiet
        ) as bar:

            async def run(prompt: list[int], agent: AgentSettings) -> Trajectory:
                return await services.run(template, prompt, agent)

            return await evaluate(
                dataset=dataset,
                rows=rows,
                run=run,
                scorer=services.scorer,
                template=template,
                settings=settings,
                progress=bar,
            )
