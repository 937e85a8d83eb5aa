"""The trainer's periodic evaluation: every eval dataset at the current weights (avg@n, tool
calls and response length per answer), each with its report folder."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from rstar2.agent.loop import AgentSettings, Trajectory
from rstar2.agent.template import ChatTemplate
from rstar2.config import Config
from rstar2.runtime import Services
from rstar2.trainer.problems import Problems
from rstar2.trainer.wiring import agent_settings


async def evaluate_all(
    config: Config,
    services: Services,
    template: ChatTemplate,
    evals: dict[str, Problems],
    out_dir: Path,
    *,
    say: Callable[[str], None],
    quiet: bool,
    step: int,
) -> dict[str, float]:
    """Every dataset of ``evals`` through ``services`` with ``eval``'s settings; each one's
    report under ``out_dir/<dataset>/``; returns ``eval/<dataset>/{accuracy, tool_calls,
    response_tokens}``."""
    from tqdm import tqdm

    from rstar2.eval import EvalSettings, evaluate, write_report

    cfg = config.eval
    settings = EvalSettings(
        n=cfg.num_samples,
        temperature=cfg.temperature,
        max_tokens=cfg.max_response_tokens,
        max_turns=cfg.max_turns,
        seed=config.seed,
    )
    agent = agent_settings(config, cfg.max_turns, cfg.max_response_tokens)
    out: dict[str, float] = {}
    for spec, problems in evals.items():
        name = Path(spec).stem

        async def run(prompt: list[int], settings: AgentSettings) -> Trajectory:
            merged = replace(agent, temperature=settings.temperature, seed=settings.seed)
            return await services.run(template, prompt, merged)

        with tqdm(
            total=len(problems.rows) * settings.n,
            desc=f"eval {name}",
            unit="answer",
            leave=False,
            disable=quiet,
        ) as bar:
            report = await evaluate(
                dataset=name,
                rows=problems.rows,
                run=run,
                scorer=services.scorer,
                template=template,
                settings=settings,
                progress=bar,
            )
        write_report(report, out_dir / name)
        s = report["summary"]
        out[f"eval/{name}/accuracy"] = s[f"avg@{settings.n}"]
        out[f"eval/{name}/tool_calls"] = s["mean_tool_calls"]
        out[f"eval/{name}/response_tokens"] = s["mean_response_tokens"]
        say(
            f"eval step {step} {name}: avg@{settings.n} {100 * s[f'avg@{settings.n}']:.1f}%, "
            f"{s['mean_tool_calls']:.2f} tool calls per answer"
        )
    return out
