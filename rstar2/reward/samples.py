"""Synthetic rStar2-style responses for demos and benchmarks (pure).

:func:`respell` writes a ground truth in an equivalent but different spelling, the way models do
(``\\dfrac``, leading zeros, thousands separators, ``x = ...``); :func:`wrong` writes a different
answer. :func:`response` wraps an answer the way the rStar2 prompt asks for.
"""

from __future__ import annotations

import re

_INT = re.compile(r"^-?\d+$")
_FRAC = re.compile(r"^\\frac\{(-?\d+)\}\{(\d+)\}$")


def respell(truth: str) -> str:
    """An equivalent spelling of ``truth`` that differs from it as a string when possible."""
    t = truth.strip()
    if _INT.match(t):
        n = int(t)
        return f"{n:,}" if abs(n) >= 1000 else f"x = {t}"
    m = _FRAC.match(t)
    if m:
        return f"\\dfrac{{{m.group(1)}}}{{{m.group(2)}}}"
    if "\\frac" in t:
        return t.replace("\\frac", "\\dfrac")
    if " " in t:
        return t.replace(" ", "")
    return f"${t}$"


def wrong(truth: str) -> str:
    """An answer that is not equal to ``truth``."""
    t = truth.strip()
    if _INT.match(t):
        return str(int(t) + 1)
    return f"{t}+1"


def response(answer: str, *, with_tool_call: bool = False) -> str:
    """A response in the rStar2 format whose final answer is ``answer``."""
    tool = (
        '<tool_call>\n{"name": "python_code_with_standard_io", "arguments": '
        '{"code": "print(1+1)", "input": ""}}\n</tool_call>\n'
        if with_tool_call
        else ""
    )
    return (
        "<reason>Let me work through the problem step by step and check it with code.\n"
        f"{tool}The computation confirms the value.</reason>\n"
        f"<answer>The final answer is \\boxed{{{answer}}}.</answer>"
    )
