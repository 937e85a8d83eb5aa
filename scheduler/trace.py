"""Rollout traces: what each trajectory generates, turn by turn (pure, seeded).

A trace row (JSONL) is ``{"id", "prompt_tokens", "turns": [{"gen_tokens", "tool_latency_s"}]}``;
a turn without a tool call has ``tool_latency_s`` null (only the last turn may). Rows may also
carry ``"session"`` (trajectories of one prompt share it) and per turn ``"tool_tokens"`` (the
tool response appended to the context; the simulator's default applies when absent).

:func:`paper_like` follows the rStar2-Agent paper's stage-2 rollouts: 16 trajectories per prompt,
responses of 1K-12K tokens with a long tail (log-normal, median ~3K), 1-10 assistant turns, tool
calls of ~0.3 s. :func:`skewed` is a differently shaped one, for checking that a policy is not
tuned to that trace: short 1-2 turn trajectories, 5% of which carry 30% of the work.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class TraceError(ValueError):
    """A malformed trace file; the message names the line."""


@dataclass(frozen=True)
class TraceTurn:
    gen_tokens: int
    tool_latency_s: float | None
    tool_tokens: int | None = None


@dataclass(frozen=True)
class TraceRow:
    id: str
    prompt_tokens: int
    turns: tuple[TraceTurn, ...]
    session: str | None = None

    @property
    def response_tokens(self) -> int:
        return sum(t.gen_tokens for t in self.turns)


def paper_like(
    *,
    num_prompts: int = 512,
    samples_per_prompt: int = 16,
    min_response_tokens: int = 1024,
    max_response_tokens: int = 12288,
    median_response_tokens: int = 3072,
    response_sigma: float = 0.7,
    max_turns: int = 10,
    tool_latency_s: float = 0.3,
    tool_tokens: int = 128,
    seed: int = 0,
) -> list[TraceRow]:
    """A trace shaped like the paper's rollouts (see the module docstring)."""
    rng = random.Random(seed)
    budget_per_turn_tokens = max_response_tokens - tool_tokens * (max_turns - 1)
    rows: list[TraceRow] = []
    for p in range(num_prompts):
        prompt_tokens = rng.randint(150, 600)
        for s in range(samples_per_prompt):
            total = rng.lognormvariate(math.log(median_response_tokens), response_sigma)
            total = int(min(max(total, min_response_tokens), budget_per_turn_tokens))
            num_turns = min(max_turns, 1 + int(rng.expovariate(1 / 2.5)))
            rows.append(
                TraceRow(
                    id=f"p{p}-s{s}",
                    prompt_tokens=prompt_tokens,
                    turns=_split_turns(rng, total, num_turns, tool_latency_s, tool_tokens),
                    session=f"p{p}-s{s}",
                )
            )
    return rows


def skewed(
    *,
    num_prompts: int = 512,
    samples_per_prompt: int = 16,
    max_response_tokens: int = 12288,
    short_median_tokens: int = 512,
    long_fraction: float = 0.05,
    long_work_share: float = 0.30,
    max_turns: int = 2,
    tool_latency_s: float = 0.3,
    tool_tokens: int = 128,
    seed: int = 0,
) -> list[TraceRow]:
    """A trace shaped unlike the paper's: short trajectories of 1-``max_turns`` turns, where a
    ``long_fraction`` of them (spread at random) carries ``long_work_share`` of the generated
    tokens. Lengths are log-normal; the long ones are scaled to the share, within the budget
    (so the share is met unless the budget caps them: see the rows' own totals)."""
    if not 0 < long_fraction < 1 or not 0 < long_work_share < 1:
        raise ValueError("long_fraction and long_work_share must be in (0, 1)")
    rng = random.Random(seed)
    n = num_prompts * samples_per_prompt
    budget = max_response_tokens - tool_tokens * (max_turns - 1)
    long_ids = set(rng.sample(range(n), max(1, round(n * long_fraction))))
    short = {
        i: min(budget, max(32, int(rng.lognormvariate(math.log(short_median_tokens), 0.6))))
        for i in range(n)
        if i not in long_ids
    }
    raw = {i: rng.lognormvariate(0.0, 0.5) for i in long_ids}
    target = long_work_share / (1 - long_work_share) * sum(short.values())
    scale = target / sum(raw.values())
    lengths = short | {i: min(budget, max(32, int(w * scale))) for i, w in raw.items()}
    rows: list[TraceRow] = []
    for i in range(n):
        p, k = divmod(i, samples_per_prompt)
        num_turns = rng.randint(1, max_turns)
        rows.append(
            TraceRow(
                id=f"p{p}-s{k}",
                prompt_tokens=rng.randint(150, 600),
                turns=_split_turns(rng, lengths[i], num_turns, tool_latency_s, tool_tokens),
                session=f"p{p}-s{k}",
            )
        )
    return rows


def _split_turns(
    rng: random.Random, total: int, num_turns: int, latency_s: float, tool_tokens: int
) -> tuple[TraceTurn, ...]:
    weights = [rng.expovariate(1.0) + 0.05 for _ in range(num_turns)]
    scale = sum(weights)
    sizes = [max(16, int(total * w / scale)) for w in weights]
    turns = []
    for i, size in enumerate(sizes):
        last = i == num_turns - 1
        latency = None if last else max(0.02, rng.lognormvariate(math.log(latency_s), 0.5))
        turns.append(TraceTurn(size, latency, None if last else tool_tokens))
    return tuple(turns)


def row_from_rollout(record: dict[str, Any], row_id: str) -> TraceRow | None:
    """One trace row from a rollout an RL run saved (``rstar2 train --save-rollouts``): the
    assistant turns are the sampled runs of its loss mask, each followed by the tool response
    the loop appended (unsampled tokens); a turn's tool latency spans its ``tool`` spans (the
    first start to the last end, parallel calls overlapping). None: a trajectory with no
    sampled token (nothing was generated: no turn to replay), for the caller to skip.
    ValueError: the record's spans and loss mask disagree."""
    traj = record.get("trajectory", record)
    mask: list[int] = traj["loss_mask"]
    if not any(mask):
        return None
    runs: list[list[int]] = []  # [sampled, unsampled after it]
    for i, m in enumerate(mask):
        if m and (i == 0 or not mask[i - 1]):
            runs.append([0, 0])
        if not runs:
            raise ValueError("the response starts with unsampled tokens")
        runs[-1][0 if m else 1] += 1
    tool_spans: list[list[tuple[float, float]]] = []
    for kind, start, end in traj.get("spans", []):
        if kind == "generate":
            tool_spans.append([])
        elif kind == "tool" and tool_spans:
            tool_spans[-1].append((start, end))
    if len(tool_spans) < len(runs):
        raise ValueError(f"{len(runs)} sampled runs but {len(tool_spans)} generate spans")
    turns = []
    for (gen, tool), spans in zip(runs, tool_spans, strict=False):
        latency = max(e for _, e in spans) - min(s for s, _ in spans) if spans else None
        if latency is None and tool:
            latency = 0.0
        turns.append(TraceTurn(gen, latency, tool or None))
    return TraceRow(row_id, len(traj["prompt_ids"]), tuple(turns), session=row_id)


def write_trace(rows: list[TraceRow], path: str | Path) -> None:
    with open(path, "w") as fh:
        for row in rows:
            turns = [
                {"gen_tokens": t.gen_tokens, "tool_latency_s": t.tool_latency_s}
                | ({} if t.tool_tokens is None else {"tool_tokens": t.tool_tokens})
                for t in row.turns
            ]
            record = {"id": row.id, "prompt_tokens": row.prompt_tokens, "turns": turns}
            if row.session is not None:
                record["session"] = row.session
            fh.write(json.dumps(record) + "\n")


def load_trace(path: str | Path) -> list[TraceRow]:
    """Read a JSONL trace; :class:`TraceError` names the first bad line."""
    rows: list[TraceRow] = []
    seen: set[str] = set()
    with open(path) as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = _parse_row(json.loads(line))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                raise TraceError(f"{path}:{lineno}: {exc}") from None
            if row.id in seen:
                raise TraceError(f"{path}:{lineno}: duplicate id {row.id!r}")
            seen.add(row.id)
            rows.append(row)
    if not rows:
        raise TraceError(f"{path}: no trajectories")
    return rows


def _parse_row(data: dict[str, object]) -> TraceRow:
    prompt_tokens = int(data["prompt_tokens"])  # type: ignore[call-overload]
    raw_turns = data["turns"]
    if prompt_tokens < 1 or not isinstance(raw_turns, list) or not raw_turns:
        raise ValueError("prompt_tokens must be positive and turns a non-empty list")
    turns = []
    for i, t in enumerate(raw_turns):
        latency = t.get("tool_latency_s")
        gen = int(t["gen_tokens"])
        if gen < 1:
            raise ValueError(f"turn {i}: gen_tokens must be positive")
        if latency is not None and float(latency) < 0:
            raise ValueError(f"turn {i}: tool_latency_s must be >= 0 or null")
        if latency is None and i != len(raw_turns) - 1:
            raise ValueError(f"turn {i}: only the last turn may have no tool call")
        tool_tokens = t.get("tool_tokens")
        turns.append(
            TraceTurn(
                gen,
                None if latency is None else float(latency),
                None if tool_tokens is None else int(tool_tokens),
            )
        )
    session = data.get("session")
    return TraceRow(
        str(data["id"]), prompt_tokens, tuple(turns), None if session is None else str(session)
    )
