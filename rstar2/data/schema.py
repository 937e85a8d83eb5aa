"""The rStar2 row schema (what the public rStar2-Agent preprocessing scripts write).

A row::

    {"data_source": "rstar_<origin>", "agent_name": "rstar2_agent",
     "prompt": [{"role": "user", "content": <problem>}], "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": <answer>},
     "extra_info": {"split", "index", "answer", "question", "need_tools_kwargs",
                    "interaction_kwargs": {"query", "ground_truth"}, ...}}

The prompt holds the bare problem: the rStar2 instruction and system prompt are added by the chat
template at rollout time. Extra columns in a row are kept untouched.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from rstar2.errors import UserError

AGENT_NAME = "rstar2_agent"
REQUIRED_KEYS = ("data_source", "prompt", "reward_model")


class DataError(UserError, ValueError):
    """A user error in a dataset: bad file, missing field, unknown name. The message says where."""

    kind: ClassVar[str] = "data error"


def make_row(
    *,
    problem: str,
    answer: str,
    origin: str,
    split: str,
    index: int,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """An rStar2 row for one problem; ``extra`` entries are added to ``extra_info``."""
    extra_info: dict[str, Any] = {
        "split": split,
        "index": index,
        "answer": answer,
        "question": problem,
        "need_tools_kwargs": False,
        "interaction_kwargs": {"query": problem, "ground_truth": answer},
    }
    if extra:
        extra_info.update(extra)
    return {
        "data_source": f"rstar_{origin}",
        "agent_name": AGENT_NAME,
        "prompt": [{"role": "user", "content": problem}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": extra_info,
    }


def is_rstar2_row(record: Mapping[str, Any]) -> bool:
    """True if ``record`` already has the rStar2 shape (it is then used unchanged)."""
    return all(k in record for k in REQUIRED_KEYS) and isinstance(record["reward_model"], Mapping)


def validate_row(row: Mapping[str, Any], where: str) -> None:
    """Raise DataError (naming ``where`` and the field) unless ``row`` is a usable rStar2 row."""
    for key in REQUIRED_KEYS:
        if key not in row:
            raise DataError(f"{where}: missing field '{key}'")
    prompt = row["prompt"]
    if not isinstance(prompt, list | tuple) or not prompt:
        raise DataError(f"{where}: 'prompt' must be a non-empty list of chat messages")
    for message in prompt:
        if not isinstance(message, Mapping) or "role" not in message or "content" not in message:
            raise DataError(f"{where}: each prompt message needs 'role' and 'content'")
        if not isinstance(message["content"], str):
            kind = type(message["content"]).__name__
            raise DataError(f"{where}: prompt content is {kind}, not a string")
    truth = row["reward_model"].get("ground_truth")
    if truth is None or str(truth).strip() == "":
        raise DataError(f"{where}: empty 'reward_model.ground_truth'")
    if isinstance(truth, bool) or not isinstance(truth, str | int | float):
        raise DataError(f"{where}: 'reward_model.ground_truth' is {type(truth).__name__}")


def problem_text(row: Mapping[str, Any]) -> str:
    """The user content of a row's prompt (all user messages joined)."""
    return "\n".join(str(m["content"]) for m in row["prompt"] if m.get("role") == "user")


def ground_truth(row: Mapping[str, Any]) -> str:
    return str(row["reward_model"]["ground_truth"])
