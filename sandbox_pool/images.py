"""Warm images: which modules a zygote pre-imports, and which image a snippet runs in (pure).

Forking costs grow with the zygote's memory: a stdlib-only zygote forks and tears down a child in
~0.7 ms on a 2-core machine, one holding numpy + sympy in ~5-7 ms. So the pool keeps two:
``light`` (stdlib math) for most snippets and ``heavy`` (numpy, sympy, scipy on top) for snippets
that name those packages. A snippet routed to ``light`` that imports a heavy package anyway
still works; it only pays the import.
"""

from __future__ import annotations

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


@dataclass(frozen=True, kw_only=True)
class Image:
    name: ImageName
    preload: tuple[str, ...]


LIGHT = Image(name="light", preload=LIGHT_MODULES)
HEAVY = Image(name="heavy", preload=HEAVY_MODULES)


def image_for(code: str) -> ImageName:
    """``heavy`` if the snippet names a package only the heavy image has warm, else ``light``."""
    return "heavy" if _HEAVY_NAMES.search(code) else "light"
