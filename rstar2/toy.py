"""The toy task behind README command 1: arithmetic word problems that need the Python tool.

Each problem asks for a product of two multi-digit numbers or a sum of three, wrapped in a short
story ("A crate holds 47 jars. How many jars are in 86 crates?"). A tiny model cannot multiply
in its head, so a correct answer takes one tool call whose code copies the operands with the
right operation, then copying the printed result into ``\\boxed{}``.

:func:`make_rows` gives rStar2 prompt rows (train and held-out splits never share a problem),
:func:`sft_conversation` the tool-call conversation that solves one row, in the shape
``rstar2 sft`` reads: the tool response is the exact text the agent loop would return for the
call. Everything is pure and seeded: the same arguments give the same data.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rstar2.agent.tools import DEFAULT_TOOL_NAME, format_result, truncate
from rstar2.data.schema import make_row
from sandbox_pool.protocol import ExecResult

ORIGIN = "toy_arith"
_PRODUCT_STORIES = (
    "A crate holds {a} jars. How many jars are in {b} crates?",
    "A hall has {a} rows with {b} seats in each row. How many seats are there?",
    "A farmer plants {a} trees in each of {b} fields. How many trees does he plant?",
    "Each bus carries {a} people. How many people do {b} buses carry?",
    "A book has {a} pages and a shelf holds {b} such books. How many pages are on the shelf?",
)
_SUM_STORIES = (
    "Ann has {a} stamps, Ben has {b} and Cal has {c}. How many stamps do they have together?",
    "A shop sold {a} pens on Monday, {b} on Tuesday and {c} on Wednesday. How many pens in all?",
    "A town has {a} cars, {b} bikes and {c} vans. How many vehicles is that?",
    "A library got {a} books, then {b} more, then {c} more. How many books did it get?",
)


def make_problem(rng: random.Random) -> tuple[str, str, str]:
    """(problem text, python expression, answer) for one random problem."""
    if rng.random() < 0.5:
        a, b = rng.randint(12, 99), rng.randint(12, 99)
        story = rng.choice(_PRODUCT_STORIES).format(a=a, b=b)
        return story, f"{a}*{b}", str(a * b)
    a, b, c = (rng.randint(101, 999) for _ in range(3))
    story = rng.choice(_SUM_STORIES).format(a=a, b=b, c=c)
    return story, f"{a}+{b}+{c}", str(a + b + c)


def make_rows(num_rows: int, *, split: str, seed: int, exclude: Sequence[str] = ()) -> list[dict]:
    """``num_rows`` distinct problems as rStar2 rows, none of them in ``exclude``."""
    rng = random.Random(f"{ORIGIN}:{split}:{seed}")
    seen = set(exclude)
    rows: list[dict[str, Any]] = []
    while len(rows) < num_rows:
        problem, expr, answer = make_problem(rng)
        if problem in seen:
            continue
        seen.add(problem)
        rows.append(
            make_row(
                problem=problem,
                answer=answer,
                origin=ORIGIN,
                split=split,
                index=len(rows),
                extra={"expression": expr},
            )
        )
    return rows


SYSTEM_PROMPT = (
    "Solve the problem with the Python tool, then give the result as <answer>\\boxed{...}</answer>."
)


def write_toy_data(
    out_dir: Path, *, num_sft: int, num_train: int, num_heldout: int, seed: int = 0
) -> dict[str, Path]:
    """``sft.jsonl`` (conversations), ``train.jsonl`` and ``heldout.jsonl`` (rStar2 rows):
    three disjoint problem sets. Returns the paths by name."""
    out_dir.mkdir(parents=True, exist_ok=True)
    heldout = make_rows(num_heldout, split="test", seed=seed)
    seen = [r["prompt"][0]["content"] for r in heldout]
    pool = make_rows(num_sft + num_train, split="train", seed=seed, exclude=seen)
    rng = random.Random(f"{ORIGIN}:sft:{seed}")
    files = {
        "sft": (out_dir / "sft.jsonl", [sft_conversation(r, rng) for r in pool[:num_sft]]),
        "train": (out_dir / "train.jsonl", pool[num_sft:]),
        "heldout": (out_dir / "heldout.jsonl", heldout),
    }
    for path, records in files.values():
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return {name: path for name, (path, _) in files.items()}


def tool_call_text(code: str, tool_name: str = DEFAULT_TOOL_NAME) -> str:
    call = {"name": tool_name, "arguments": {"code": code, "input": ""}}
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"


def sft_conversation(row: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """The solving conversation of ``row``: one tool call, its response, the boxed answer."""
    expr = str(row["extra_info"]["expression"])
    answer = str(row["reward_model"]["ground_truth"])
    seconds = rng.choice((0.0, 0.0, 0.01, 0.01, 0.02, 0.03))
    response = format_result(
        ExecResult(status="ok", stdout=f"{answer}\n", stderr="", exit_code=0, duration_s=seconds)
    )
    boxed = f"<answer>\\boxed{{{answer}}}</answer>"
    return {
        "messages": [
            {"role": "user", "content": row["prompt"][0]["content"]},
            {
                "role": "assistant",
                "content": f"I will compute {expr}.\n" + tool_call_text(f"print({expr})"),
            },
            {"role": "tool", "content": truncate(response, 256, "middle")},
            {"role": "assistant", "content": f"The result is {answer}.</reason>\n" + boxed},
        ]
    }
