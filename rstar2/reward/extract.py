"""Final-answer extraction from a model response (pure, no I/O).

Rule (rStar2): the last complete ``\\boxed{...}`` (or ``\\fbox{...}``) inside the last closed
``<answer>...</answer>`` pair; if there is no such box, the last complete box anywhere.

Guarantees: never raises; time is linear in the text length whatever the input (only the last
``MAX_CANDIDATES`` boxes are examined, each scanned for at most ``MAX_ANSWER_CHARS`` characters),
so a megabyte of adversarial braces is answered in milliseconds.
"""

from __future__ import annotations

MAX_ANSWER_CHARS = 2000
MAX_CANDIDATES = 32
_BOX_COMMANDS = ("\\boxed", "\\fbox")
_ANSWER_OPEN = "<answer>"
_ANSWER_CLOSE = "</answer>"


def extract_answer(text: str) -> str | None:
    """The final answer of ``text`` (box contents, stripped), or None when there is none."""
    if not isinstance(text, str) or not text:
        return None
    block = last_answer_block(text)
    if block is not None:
        inner = last_boxed(block)
        if inner is not None:
            return inner
    return last_boxed(text)


def last_answer_block(text: str) -> str | None:
    """Contents of the last closed ``<answer>...</answer>`` pair, or None."""
    end = text.rfind(_ANSWER_CLOSE)
    if end < 0:
        return None
    start = text.rfind(_ANSWER_OPEN, 0, end)
    if start < 0:
        return None
    return text[start + len(_ANSWER_OPEN) : end]


def last_boxed(text: str) -> str | None:
    """Contents of the last complete ``\\boxed{...}`` / ``\\fbox{...}`` / ``\\boxed x`` in text."""
    limit = len(text)
    for _ in range(MAX_CANDIDATES):
        pos, command = _last_command(text, limit)
        if pos < 0:
            return None
        content = _argument(text, pos + len(command))
        if content is not None:
            return content.strip()
        limit = pos
    return None


def _last_command(text: str, limit: int) -> tuple[int, str]:
    best, best_cmd = -1, ""
    for command in _BOX_COMMANDS:
        pos = text.rfind(command, 0, limit)
        if pos > best:
            best, best_cmd = pos, command
    return best, best_cmd


def _argument(text: str, start: int) -> str | None:
    """The braced (or bare-token) argument starting at ``start``, or None if incomplete."""
    i = start
    end = min(len(text), start + MAX_ANSWER_CHARS)
    while i < end and text[i] in " \t":
        i += 1
    if i >= end:
        return None
    if text[i] != "{":
        # `\boxed 5`: a bare token up to whitespace or `$`; `\boxedfoo` is another command.
        if i == start or (not text[i].isalnum() and text[i] not in "-."):
            return None
        j = i
        while j < end and not text[j].isspace() and text[j] not in "$":
            j += 1
        return text[i:j]
    depth = 0
    j = i
    while j < end:
        ch = text[j]
        if ch == "\\":
            j += 2  # an escaped brace `\{` / `\}` never opens or closes the argument
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
        j += 1
    return None
