"""Warm images: which modules a zygote pre-imports, and which image a snippet runs in (pure).

Forking costs grow with the zygote's memory: a stdlib-only zygote forks and tears down a child in
~0.7 ms on a 2-core machine, one holding numpy + sympy in ~5-7 ms. So the pool keeps two:
``light`` (stdlib math) for most snippets and ``heavy`` (numpy, sympy, scipy on top) for snippets
that name those packages. A snippet routed to ``light`` that imports a heavy package anyway
still works; it only pays the import.

Routing sees through wrapped code: a wrapper that carries the snippet as a base64 string (the
public rStar2 client's ``base64.b64decode("...")``) is decoded and searched too, so wrapped
sympy calls land on the warm heavy image. C++ always runs on ``light``.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from typing import Literal

ImageName = Literal["light", "heavy"]

LIGHT_MODULES = (
    "math",
    "cmath",
    "fractions",
    "decimal",
    "itertools",
    "collections",
    "functools",
    "heapq",
    "bisect",
    "random",
    "re",
    "json",
    "statistics",
)
HEAVY_MODULES = (*LIGHT_MODULES, "numpy", "sympy", "scipy")
_HEAVY_NAMES = re.compile(r"\b(?:numpy|sympy|scipy|mpmath|pandas|networkx)\b")
# A quoted run of base64 long enough to hold an import statement.
_BASE64_LITERAL = re.compile(r"[\"']([A-Za-z0-9+/]{16,}={0,2})[\"']")


@dataclass(frozen=True, kw_only=True)
class Image:
    name: ImageName
    preload: tuple[str, ...]


LIGHT = Image(name="light", preload=LIGHT_MODULES)
HEAVY = Image(name="heavy", preload=HEAVY_MODULES)


def image_for(code: str, language: str = "python") -> ImageName:
    """``heavy`` if the snippet (or a base64 string literal in it) names a package only the
    heavy image has warm, else ``light``."""
    if language != "python":
        return "light"
    if _HEAVY_NAMES.search(code):
        return "heavy"
    for match in _BASE64_LITERAL.finditer(code):
        try:
            decoded = base64.b64decode(match.group(1), validate=True)
        except (binascii.Error, ValueError):
            continue
        if _HEAVY_NAMES.search(decoded.decode("utf-8", "replace")):
            return "heavy"
    return "light"
