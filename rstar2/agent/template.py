"""The rStar2 chat format, rendered at the token level (pure apart from the tokenizer).

ChatML with the rStar2 system prompt, the hermes tools block, the rStar2 user instruction, and a
generation prompt ending in ``<reason>``. The special tokens are read from the tokenizer, so a
Qwen3 tokenizer and the tiny test tokenizer render the same way.

Token-exactness: the prompt is tokenised once; after that every piece appended to a trajectory
(the sampled ids as the engine produced them, then each tool turn) is tokenised on its own and
concatenated, so earlier turns are never re-tokenised. A tool turn is, as in the public port:
``<|im_start|>user\\n<tool_response>\\n…\\n</tool_response>…<|im_end|>\\n<|im_start|>assistant\\n<reason>``
directly after the assistant's ``<|im_end|>``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

SYSTEM_PROMPT = (
    "A conversation between User and Assistant. The User asks a question, and the Assistant "
    "solves it. The Assistant first thinks about the reasoning process in the mind and then "
    "provides the User with the answer. The reasoning process is enclosed within <reason> "
    "</reason> and answer is enclosed within <answer> </answer> tags, respectively, i.e., "
    "<reason> reasoning process here </reason> <answer> answer here </answer>."
)
USER_INSTRUCTION = (
    "You must put your answer inside <answer> </answer> tags, i.e., <answer> answer here "
    "</answer>. And your final answer will be extracted automatically by the \\boxed{} tag.\n"
    "This is the problem:\n"
)
TOOLS_HEADER = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)
GENERATION_PROMPT_SUFFIX = "<reason>"
PROMPT_FILE = "rstar2_prompt.json"


@dataclass(frozen=True)
class PromptFormat:
    """What a model was trained to see: its system prompt, and whether the tool schema follows.

    Saved as ``rstar2_prompt.json`` in a model folder (only when it differs from rStar2's), so
    eval, chat and later training render the prompts the model learned on.
    """

    system_prompt: str = SYSTEM_PROMPT
    show_tool_schema: bool = True

    def save(self, folder: str | Path) -> None:
        path = Path(folder) / PROMPT_FILE
        if self == PromptFormat():
            path.unlink(missing_ok=True)
            return
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, folder: str | Path) -> PromptFormat:
        """The folder's saved format, else rStar2's."""
        path = Path(folder) / PROMPT_FILE
        if not path.is_file():
            return cls()
        data = json.loads(path.read_text())
        return cls(
            system_prompt=str(data.get("system_prompt", SYSTEM_PROMPT)),
            show_tool_schema=bool(data.get("show_tool_schema", True)),
        )

    def override(
        self, *, system_prompt: str | None = None, show_tool_schema: bool | None = None
    ) -> PromptFormat:
        """This format with the given fields replaced (None keeps a field)."""
        return PromptFormat(
            system_prompt=self.system_prompt if system_prompt is None else system_prompt,
            show_tool_schema=self.show_tool_schema
            if show_tool_schema is None
            else show_tool_schema,
        )

    def template(
        self, tokenizer: Any, tool_name: str = "python_code_with_standard_io"
    ) -> ChatTemplate:
        from rstar2.agent.tools import tool_schema

        tools = (tool_schema(tool_name),) if self.show_tool_schema else ()
        return ChatTemplate(tokenizer, tools=tools, system_prompt=self.system_prompt)


@dataclass(frozen=True)
class ChatTemplate:
    """Renders rStar2 prompts and tool turns for one tokenizer (a HF tokenizer, or anything with
    ``encode(text, add_special_tokens=False)`` and ``decode(ids, skip_special_tokens=False)``)."""

    tokenizer: Any
    tools: tuple[dict[str, Any], ...]
    im_start: str = "<|im_start|>"
    im_end: str = "<|im_end|>"
    system_prompt: str = SYSTEM_PROMPT

    def __post_init__(self) -> None:
        for token in (self.im_start, self.im_end):
            ids = self.tokenizer.encode(token, add_special_tokens=False)
            if len(ids) != 1:
                raise ValueError(f"the tokenizer has no single special token {token!r}")

    @property
    def im_end_id(self) -> int:
        return int(self.tokenizer.encode(self.im_end, add_special_tokens=False)[0])

    def system_text(self) -> str:
        tools = "".join("\n" + json.dumps(t, ensure_ascii=False) for t in self.tools)
        block = self.system_prompt + (TOOLS_HEADER + tools + TOOLS_FOOTER if self.tools else "")
        return f"{self.im_start}system\n{block}{self.im_end}\n"

    def prompt_text(self, messages: Sequence[dict[str, Any]]) -> str:
        """The whole prompt for chat ``messages`` (user / assistant turns), ready to generate."""
        text = self.system_text()
        for message in messages:
            role, content = message["role"], str(message.get("content") or "")
            if role == "user":
                text += f"{self.im_start}user\n{USER_INSTRUCTION}{content}{self.im_end}\n"
            elif role == "assistant":
                text += f"{self.im_start}assistant\n{content}{self.im_end}\n"
            elif role != "system":
                raise ValueError(f"unsupported role {role!r} in a prompt")
        return text + self.generation_prompt()

    def generation_prompt(self) -> str:
        return f"{self.im_start}assistant\n{GENERATION_PROMPT_SUFFIX}"

    def tool_turn_text(self, responses: Sequence[str]) -> str:
        """A user turn holding one ``<tool_response>`` block per call, then the next prompt."""
        blocks = "".join(f"\n<tool_response>\n{r}\n</tool_response>" for r in responses)
        return f"{self.im_start}user{blocks}{self.im_end}\n" + self.generation_prompt()

    def user_turn_text(self, content: str) -> str:
        """A follow-up user message in an ongoing conversation, then the next prompt."""
        return f"{self.im_start}user\n{content}{self.im_end}\n" + self.generation_prompt()

    def encode_prompt(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        return self.encode(self.prompt_text(messages))

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))
