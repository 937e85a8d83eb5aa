"""Template, tool-call parsing and tool-response text (no engine)."""

from __future__ import annotations

import json

import pytest

from rstar2.agent.template import SYSTEM_PROMPT, USER_INSTRUCTION, ChatTemplate
from rstar2.agent.tools import (
    ParseError,
    ToolCall,
    format_result,
    parse_tool_calls,
    tool_schema,
    truncate,
)
from sandbox_pool.protocol import ExecResult


class CharTokenizer:
    """A stand-in with the two ChatML specials as single ids (the real one is in the vLLM tests)."""

    specials = ("<|im_start|>", "<|im_end|>")

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids, i = [], 0
        while i < len(text):
            for k, sp in enumerate(self.specials):
                if text.startswith(sp, i):
                    ids.append(1_000_000 + k)
                    i += len(sp)
                    break
            else:
                ids.append(ord(text[i]))
                i += 1
        return ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join(self.specials[i - 1_000_000] if i >= 1_000_000 else chr(i) for i in ids)

    def convert_tokens_to_ids(self, token: str) -> int:
        return self.encode(token)[0]


def test_prompt_matches_the_rstar2_format():
    tpl = ChatTemplate(CharTokenizer(), tools=(tool_schema(),))
    text = tpl.prompt_text([{"role": "user", "content": "What is 1+1?"}])
    assert text.startswith("<|im_start|>system\n" + SYSTEM_PROMPT + "\n\n# Tools\n")
    assert json.dumps(tool_schema()) in text
    user_turn = f"<|im_start|>user\n{USER_INSTRUCTION}What is 1+1?<|im_end|>\n"
    assert text.endswith(user_turn + "<|im_start|>assistant\n<reason>")
    assert "\\boxed{} tag" in USER_INSTRUCTION


def test_tool_turn_is_the_ports_user_turn():
    tpl = ChatTemplate(CharTokenizer(), tools=())
    assert tpl.tool_turn_text(["a", "b"]) == (
        "<|im_start|>user\n<tool_response>\na\n</tool_response>\n<tool_response>\nb\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n<reason>"
    )


def test_template_needs_single_token_specials():
    class Plain(CharTokenizer):
        specials = ()

    with pytest.raises(ValueError, match="special token"):
        ChatTemplate(Plain(), tools=())


def call(args: str, name: str = "python_code_with_standard_io") -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'


def test_parser_finds_every_call_and_answers_malformed_ones():
    text = (
        "x "
        + call('{"code": "print(1)", "input": "7"}')
        + " y "
        + call('{"code": }')
        + call('{"code": "1"}', name="other_tool")
        + call('"{\\"code\\": \\"2\\"}"')
    )
    parsed = parse_tool_calls(text)
    assert parsed[0] == ToolCall(code="print(1)", stdin="7")
    assert isinstance(parsed[1], ParseError) and parsed[1].message.startswith(
        "Failed to decode tool call:"
    )
    assert isinstance(parsed[2], ParseError) and "unknown tool" in parsed[2].message
    assert parsed[3] == ToolCall(code="2", stdin="")  # arguments given as a JSON string
    assert parse_tool_calls("no calls here") == []


def test_parser_caps_parallel_calls():
    text = "".join(call(f'{{"code": "{i}", "input": ""}}') for i in range(3))
    parsed = parse_tool_calls(text, max_parallel_calls=2)
    assert [type(p).__name__ for p in parsed] == ["ToolCall", "ToolCall", "ParseError"]


def test_tool_response_text_and_truncation():
    ok = ExecResult(status="ok", stdout="42\n", exit_code=0, duration_s=0.0123)
    assert format_result(ok) == "Tool call success\nstdout: 42\n\nexecution time: 0.01s"
    bad = ExecResult(status="timeout", stderr="TimeoutError", duration_s=4.0)
    assert format_result(bad) == (
        "Tool call failure\nreason: worker_timeout\nstderr: TimeoutError\nexecution time: 4.00s"
    )
    slow = ExecResult(status="ok", stdout="42\n", exit_code=0, duration_s=0.5)
    assert format_result(ok, show_execution_time=False) == "Tool call success\nstdout: 42\n"
    assert format_result(slow, show_execution_time=False) == format_result(
        ok, show_execution_time=False
    )
    text = "a" * 10 + "b" * 10
    assert truncate(text, 8, "middle") == "aaaa...(truncated)...bbbb"
    assert truncate(text, 8, "left") == "aaaaaaaa...(truncated)"
    assert truncate(text, 8, "right") == "(truncated)...bbbbbbbb"
    assert truncate("short", 8, "middle") == "short"
