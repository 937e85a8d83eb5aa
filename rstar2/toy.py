"""The toy task behind README command 1: arithmetic word problems that need the Python tool.

Each problem asks for a product of two 2-digit numbers, a sum of three 3-digit numbers, wrapped in
a short story ("A crate holds 47 jars. How many jars are in 86 crates?"), or both the product and
the sum of two 2-digit numbers. A tiny model cannot multiply in its head, so a correct answer
takes a tool call per result whose code copies the operands with the right operation (the
product-and-sum problems make two calls in one turn), then copying the printed results into
``\\boxed{}``. The SFT tool responses end with an execution time drawn from 0.00-0.03 s, as
the sandbox reports: without that line the tiny model learned to copy the printed result far
worse (SFT NLL 0.19 instead of 0.04 after one epoch, ~0% held-out accuracy).

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
_PAIR_STORIES = (
    "What are the product and the sum of {a} and {b}?",
    "Find {a} times {b}, and {a} plus {b}.",
    "A box has {a} rows of {b} eggs. How many eggs is that, and what is {a} plus {b}?",
)
_SUM_STORIES = (
    "Ann has {a} stamps, Ben has {b} and Cal has {c}. How many stamps do they have together?",
    "A shop sold {a} pens on Monday, {b} on Tuesday and {c} on Wednesday. How many pens in all?",
    "A town has {a} cars, {b} bikes and {c} vans. How many vehicles is that?",
    "A library got {a} books, then {b} more, then {c} more. How many books did it get?",
)


def make_problem(rng: random.Random) -> tuple[str, tuple[str, ...], str]:
    """(problem text, one python expression per result, answer) for one random problem: 40%
    products, 30% sums, 30% product and sum (answer ``"P, S"``)."""
    kind = rng.random()
    if kind < 0.4:
        a, b = rng.randint(12, 99), rng.randint(12, 99)
        story = rng.choice(_PRODUCT_STORIES).format(a=a, b=b)
        return story, (f"{a}*{b}",), str(a * b)
    if kind < 0.7:
        a, b, c = (rng.randint(101, 999) for _ in range(3))
        story = rng.choice(_SUM_STORIES).format(a=a, b=b, c=c)
        return story, (f"{a}+{b}+{c}",), str(a + b + c)
    a, b = rng.randint(12, 99), rng.randint(12, 99)
    story = rng.choice(_PAIR_STORIES).format(a=a, b=b)
    return story, (f"{a}*{b}", f"{a}+{b}"), f"{a * b}, {a + b}"


def make_rows(num_rows: int, *, split: str, seed: int, exclude: Sequence[str] = ()) -> list[dict]:
    """``num_rows`` distinct problems as rStar2 rows, none of them in ``exclude``."""
    rng = random.Random(f"{ORIGIN}:{split}:{seed}")
    seen = set(exclude)
    rows: list[dict[str, Any]] = []
    while len(rows) < num_rows:
        problem, exprs, answer = make_problem(rng)
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
                extra={"expressions": list(exprs)},
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
    """The solving conversation of ``row``: one tool call per expression (all in one turn), their
    responses as the agent loop renders them, the boxed answer."""
    exprs = [str(e) for e in row["extra_info"]["expressions"]]
    answer = str(row["reward_model"]["ground_truth"])
    values = answer.split(", ")
    calls = "\n".join(tool_call_text(f"print({e})") for e in exprs)
    tools = [
        {"role": "tool", "content": truncate(_response(value, rng), 256, "middle")}
        for value in values
    ]
    boxed = f"<answer>\\boxed{{{answer}}}</answer>"
    return {
        "messages": [
            {"role": "user", "content": row["prompt"][0]["content"]},
            {"role": "assistant", "content": f"I will compute {' and '.join(exprs)}.\n" + calls},
            *tools,
            {"role": "assistant", "content": f"The result is {answer}.</reason>\n" + boxed},
        ]
    }


def _response(value: str, rng: random.Random) -> str:
    seconds = rng.choice((0.0, 0.0, 0.01, 0.01, 0.02, 0.03))
    ok = ExecResult(status="ok", stdout=f"{value}\n", stderr="", exit_code=0, duration_s=seconds)
    return format_result(ok)
