"""The Python tool: its schema, the hermes tool-call parser, and tool-response text (pure).

Parsing: every ``<tool_call>…</tool_call>`` in a turn is a call; a body that is not JSON with a
``name`` and an ``arguments`` object, or names another tool, is a :class:`ParseError` whose text
becomes that call's tool response ("Failed to decode tool call: …"), never dropped. Calls past
``max_parallel_calls`` are answered with an error too.

Responses read like the public port's: ``Tool call success`` or ``Tool call failure`` and
``reason: …``, then ``stdout: …``, ``stderr: …`` and (optionally) ``execution time: X.XXs``,
truncated to ``max_chars`` on the configured side.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from sandbox_pool.protocol import ExecResult

DEFAULT_TOOL_NAME = "python_code_with_standard_io"
TOOL_ALIASES = ("execute_python_code_with_standard_io",)
_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def tool_schema(name: str = DEFAULT_TOOL_NAME) -> dict[str, Any]:
    """The function schema shown to the model in the system prompt."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": (
                "Execute Python code with standard input and capture standard output. This "
                "function takes a Python code string and an input string, provides the input "
                "string through standard input (stdin) to the code, and captures and returns "
                "any output produced through standard output (stdout). If the executed code "
                "raises an exception, the error message will be captured and returned instead."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "code": {
                        "type": "string",
                        "description": "A string containing Python code to be executed. The "
                        "code can read from standard input using the input() function.",
                    },
                    "input": {
                        "type": "string",
                        "description": "A string that will be provided as standard input to "
                        "the code when it calls input().",
                    },
                },
                "required": ["code", "input"],
            },
        },
    }


@dataclass(frozen=True)
class ToolCall:
    code: str
    stdin: str


@dataclass(frozen=True)
class ParseError:
    message: str


def parse_tool_calls(
    text: str, *, tool_name: str = DEFAULT_TOOL_NAME, max_parallel_calls: int = 4
) -> list[ToolCall | ParseError]:
    """Every tool call in an assistant turn, in order (see the module docstring)."""
    names = {tool_name, *TOOL_ALIASES}
    parsed: list[ToolCall | ParseError] = []
    for i, body in enumerate(_CALL.findall(text)):
        if i >= max_parallel_calls:
            parsed.append(
                ParseError(f"Too many tool calls in one turn: at most {max_parallel_calls}")
            )
            continue
        parsed.append(_parse_one(body, names))
    return parsed


def _parse_one(body: str, names: set[str]) -> ToolCall | ParseError:
    try:
        call = json.loads(body)
        name, arguments = call["name"], call["arguments"]
        if isinstance(arguments, str):  # some models emit the arguments JSON as a string
            arguments = json.loads(arguments)
        if not isinstance(arguments, dict):
            raise ValueError("'arguments' must be an object")
        if name not in names:
            raise ValueError(f"unknown tool {name!r}")
        code = arguments["code"]
        stdin = arguments.get("input", "") or ""
        if not isinstance(code, str) or not isinstance(stdin, str):
            raise ValueError("'code' and 'input' must be strings")
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        reason = f"missing {exc}" if isinstance(exc, KeyError) else str(exc)
        return ParseError(f"Failed to decode tool call: {reason}")
    return ToolCall(code=code, stdin=stdin)


_REASONS = {"timeout": "worker_timeout", "internal_error": "internal_error"}


def format_result(result: ExecResult, *, show_execution_time: bool = True) -> str:
    """The port's tool-response text for one execution.

    Without the execution-time line the text depends on the code alone: a wall-clock figure
    can read 0.00 s in one run and 0.01 s in another, and the model sees it.
    """
    ok = result.status == "ok" and result.exit_code == 0
    parts = ["Tool call success" if ok else "Tool call failure"]
    if not ok:
        parts.append(f"reason: {_REASONS.get(result.status, result.status)}")
    if result.stdout:
        parts.append(f"stdout: {result.stdout}")
    if result.stderr:
        parts.append(f"stderr: {result.stderr}")
    if show_execution_time:
        parts.append(f"execution time: {result.duration_s:.2f}s")
    return "\n".join(parts)


def truncate(text: str, max_chars: int, side: Literal["left", "middle", "right"]) -> str:
    """The port's truncation: keep the left part, the right part, or both ends."""
    if len(text) <= max_chars:
        return text
    if side == "left":
        return text[:max_chars] + "...(truncated)"
    if side == "right":
        return "(truncated)..." + text[-max_chars:]
    half = max_chars // 2
    return text[:half] + "...(truncated)..." + text[-half:]
