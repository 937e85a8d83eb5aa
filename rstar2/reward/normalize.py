"""A normalising string/number equivalence check for math answers (pure, no sympy).

It is the fast first judge before math-verify and a safety net for spellings math-verify misses.
It only says ``True`` for spellings that are equal by construction: integers with leading zeros or
thousands separators, fractions in any spelling (``\\frac{1}{2}``, ``\\dfrac12``, ``1/2``,
``0.5``), degrees, percent signs, trailing ``\\text{...}`` units, ``x = ...`` prefixes, ``\\left``/
``\\right``, spacing macros, ``π``/``\\pi``, ``\\sqrt2``/``\\sqrt{2}``, and comma-separated answers
compared as unordered multisets. Everything else is left to math-verify.

Guarantees: never raises on ``str`` input; linear time in the input (numbers longer than
``_MAX_NUMBER_CHARS`` are not converted, so no giant integer or exponent is ever built).
"""

from __future__ import annotations

import re
from fractions import Fraction

_MAX_NUMBER_CHARS = 64

_DROP_MACROS = re.compile(
    r"\\(?:left|right|displaystyle|textstyle|!|,|;|:| )|\\(?:big|Big|bigg|Bigg)(?![A-Za-z])"
)
_FRAC_ALIASES = re.compile(r"\\[dt]frac")
_BINOM_ALIASES = re.compile(r"\\[dt]binom")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|°|\\degree|\^\{\\text\{o\}\}")
_PERCENT = re.compile(r"\\?%")
_TEXT_MACRO = re.compile(r"\\(?:text|textbf|textit|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
_TRAILING_UNIT = re.compile(
    r"(?<=[0-9}])\s*\\(?:text|mbox|mathrm)\s*\{\s*[A-Za-z][A-Za-z .^0-9]*\}$"
)
_VAR_PREFIX = re.compile(r"^[A-Za-z](?:_\{?[A-Za-z0-9]+\}?)?\s*=\s*(?=\S)")
_SHORT_FRAC = re.compile(r"\\frac\s*(\d)\s*(\d)")
_SHORT_FRAC_NUM = re.compile(r"\\frac\s*(\d)\s*\{")
_SHORT_SQRT = re.compile(r"\\sqrt\s*(\d+|[A-Za-z])")
_THOUSANDS = re.compile(r"(?<![\d.])(\d{1,3})((?:(?:,|\{,\}|\\,)\d{3})+)(?![\d])")
_MATH_DELIMS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
_INT = re.compile(r"^[+-]?\d+$")
_DECIMAL = re.compile(r"^[+-]?(?:\d+\.\d*|\.\d+)$")
_FRAC = re.compile(r"^([+-]?)\\frac\{([+-]?[\d.]+)\}\{([+-]?[\d.]+)\}$")
_SLASH = re.compile(r"^([+-]?[\d.]+)/([+-]?[\d.]+)$")


def normalize(answer: str) -> str:
    """Canonical spelling of ``answer`` (whitespace removed); equal outputs mean equal answers."""
    s = answer.strip()
    s = _strip_delimiters(s)
    s = (
        s.replace("π", "\\pi")
        .replace("∞", "\\infty")
        .replace("−", "-")
        .replace("\\infin", "\\infty")
    )
    s = _DROP_MACROS.sub("", s)
    s = _FRAC_ALIASES.sub(r"\\frac", s)
    s = _BINOM_ALIASES.sub(r"\\binom", s)
    s = _DEGREES.sub("", s)
    s = _PERCENT.sub("", s)
    s = _TRAILING_UNIT.sub("", s.strip())
    s = _TEXT_MACRO.sub(r"\1", s)
    s = _VAR_PREFIX.sub("", s.strip())
    s = _SHORT_FRAC.sub(r"\\frac{\1}{\2}", s)
    s = _SHORT_FRAC_NUM.sub(r"\\frac{\1}{", s)
    s = _SHORT_SQRT.sub(r"\\sqrt{\1}", s)
    s = _THOUSANDS.sub(lambda m: m.group(1) + re.sub(r"\D", "", m.group(2)), s)
    s = "".join(s.split())
    return s.rstrip(".")


def equivalent(pred: str, truth: str) -> bool:
    """True when ``pred`` and ``truth`` are the same answer by the rules in the module docstring."""
    a, b = normalize(pred), normalize(truth)
    if not a or not b:
        return False
    if a == b or _same_number(a, b):
        return True
    pa, pb = split_top_level(a), split_top_level(b)
    if len(pa) > 1 and len(pa) == len(pb):
        return _same_multiset(pa, pb)
    return False


def to_fraction(s: str) -> Fraction | None:
    """Exact value of an integer, decimal or simple fraction spelling, else None."""
    if len(s) > _MAX_NUMBER_CHARS:
        return None
    try:
        if _INT.match(s) or _DECIMAL.match(s):
            return Fraction(s)
        m = _FRAC.match(s)
        if m:
            value = Fraction(m.group(2)) / Fraction(m.group(3))
            return -value if m.group(1) == "-" else value
        m = _SLASH.match(s)
        if m:
            return Fraction(m.group(1)) / Fraction(m.group(2))
    except (ValueError, ZeroDivisionError):
        return None
    return None


def split_top_level(s: str) -> list[str]:
    """Split on commas that are not inside (), [], {} (an interval or tuple stays whole)."""
    s = _strip_set_braces(s)
    parts: list[str] = []
    depth, start = 0, 0
    for i, ch in enumerate(s):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(s[start:i])
            start = i + 1
    parts.append(s[start:])
    return [p for p in parts if p]


def _strip_set_braces(s: str) -> str:
    if s.startswith("\\{") and s.endswith("\\}"):
        return s[2:-2]
    return s


def _strip_delimiters(s: str) -> str:
    for open_, close in _MATH_DELIMS:
        if s.startswith(open_) and s.endswith(close) and len(s) >= len(open_) + len(close):
            return s[len(open_) : len(s) - len(close)].strip()
    return s


def _same_number(a: str, b: str) -> bool:
    fa = to_fraction(a)
    return fa is not None and fa == to_fraction(b)


def _same_multiset(pa: list[str], pb: list[str]) -> bool:
    remaining = list(pb)
    for item in pa:
        for j, other in enumerate(remaining):
            if item == other or _same_number(item, other):
                del remaining[j]
                break
        else:
            return False
    return True
