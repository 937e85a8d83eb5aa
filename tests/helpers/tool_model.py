"""A tiny model taught, in seconds, to use the Python tool on three scripted problems.

- "What is six times seven?": one call ``print(6*7)``, then ``\\boxed{42}``;
- "Add two and three, and five and five.": two calls in one turn, then ``\\boxed{5, 10}``;
- "Break the tool.": a call whose JSON is malformed, then ``\\boxed{0}``.
It is trained (teacher forcing, loss on assistant tokens only) until it reproduces the three
conversations greedily, on the real tool responses the sandbox gives (execution times 0.00 s to
0.03 s, so small timing changes do not derail it).
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from rstar2.agent.template import ChatTemplate
from rstar2.agent.tools import tool_schema, truncate
from rstar2.tiny import build_tiny_model


def _call(code: str) -> str:
    return (
        '<tool_call>\n{"name": "python_code_with_standard_io", "arguments": '
        f'{{"code": "{code}", "input": ""}}}}\n</tool_call>'
    )


@dataclass(frozen=True)
class Script:
    problem: str
    turn1: str
    outputs: tuple[str, ...]  # tool responses, with {t} for the execution time
    turn2: str


SCRIPTS = (
    Script(
        "What is six times seven?",
        "I will compute it.\n" + _call("print(6*7)"),
        ("Tool call success\nstdout: 42\n\nexecution time: {t}s",),
        "The tool says 42.</reason>\n<answer>\\boxed{42}</answer>",
    ),
    Script(
        "Add two and three, and five and five.",
        "Two sums.\n" + _call("print(2+3)") + "\n" + _call("print(5+5)"),
        (
            "Tool call success\nstdout: 5\n\nexecution time: {t}s",
            "Tool call success\nstdout: 10\n\nexecution time: {t}s",
        ),
        "Both done.</reason>\n<answer>\\boxed{5, 10}</answer>",
    ),
    Script(
        "Break the tool.",
        'Oops.\n<tool_call>\n{"name": "python_code_with_standard_io", "arguments": {"code": }\n'
        "</tool_call>",
        ("Failed to decode tool call: Expecting value: line 1 column 67 (char 66)",),
        "It failed.</reason>\n<answer>\\boxed{0}</answer>",
    ),
)
TIMES = ("0.00", "0.01", "0.02", "0.03")
ANSWERS = ("42", "5, 10", "0")  # the reference answer of each script's problem


def write_eval_dataset(path: Path) -> Path:
    """The three problems with their answers, as an ``rstar2 eval --dataset`` JSONL file."""
    pairs = zip(SCRIPTS, ANSWERS, strict=True)
    rows = (json.dumps({"problem": s.problem, "answer": a}) for s, a in pairs)
    path.write_text("".join(row + "\n" for row in rows))
    return path


def check_script_report(proc: subprocess.CompletedProcess[str], out: Path) -> None:
    """What ``rstar2 eval --n 2 --temperature 0`` of the tool model on its three problems
    reports, whichever engine answered."""
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    s = report["summary"]
    assert s["problems"] == 3 and s["samples_per_problem"] == 2
    by_answer = {p["answer"]: p for p in report["problems"]}
    assert by_answer["42"]["correct"] == 2 and by_answer["42"]["mean_tool_calls"] == 1.0
    assert by_answer["5, 10"]["mean_tool_calls"] == 2.0
    assert s["tool_error_ratio"] == pytest.approx(0.25)  # the malformed call, 1 of 4 per round
    assert s["avg@2"] == pytest.approx(sum(p["accuracy"] for p in report["problems"]) / 3)
    assert s["avg@2"] >= 2 / 3
    assert "avg@2" in proc.stdout and (out / "report.md").read_text().count("\n| ") >= 6


def corpus() -> list[str]:
    text = [s.problem + s.turn1 + s.turn2 + " ".join(s.outputs) for s in SCRIPTS]
    return text * 20 + ["0123456789 abcdefghijklmnopqrstuvwxyz print input code stdout"] * 20


def build_tool_tokenizer(out_dir: Path) -> Path:
    """The tool model's folder before training: its tokenizer and chat template (the same as
    the trained model's), with untrained weights. For tests that only encode prompts."""
    build_tiny_model(out_dir, corpus() + _template_corpus(), hidden_size=128, num_layers=2)
    return out_dir


def build_tool_model(out_dir: Path, steps: int = 300) -> Path:
    """Build and train the model; returns its HF folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    build_tool_tokenizer(out_dir)
    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    template = ChatTemplate(tokenizer, tools=(tool_schema(),))
    examples = []
    for script in SCRIPTS:
        for t in TIMES:
            responses = [truncate(o.format(t=t), 256, "middle") for o in script.outputs]
            ids, mask = _conversation(template, script, responses)
            examples.append((ids, mask))
    model = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32)
    model.train()
    width = max(len(ids) for ids, _ in examples)
    pad = tokenizer.pad_token_id
    x = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in examples])
    attention = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in examples])
    labels = torch.tensor(
        [
            [i if m else -100 for i, m in zip(ids, mask, strict=True)] + [-100] * (width - len(ids))
            for ids, mask in examples
        ]
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    torch.manual_seed(0)
    for _ in range(steps):
        loss = model(input_ids=x, attention_mask=attention, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if loss.item() < 0.01:
            break
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


def _conversation(
    template: ChatTemplate, script: Script, responses: list[str]
) -> tuple[list[int], list[int]]:
    eos = [template.im_end_id]
    prompt = template.encode_prompt([{"role": "user", "content": script.problem}])
    turn1 = template.encode(script.turn1) + eos
    tool = template.encode(template.tool_turn_text(responses))
    turn2 = template.encode(script.turn2) + eos
    ids = prompt + turn1 + tool + turn2
    mask = [0] * len(prompt) + [1] * len(turn1) + [0] * len(tool) + [1] * len(turn2)
    return ids, mask


def _template_corpus() -> list[str]:
    import json

    from rstar2.agent.template import SYSTEM_PROMPT, TOOLS_FOOTER, TOOLS_HEADER, USER_INSTRUCTION

    return [
        SYSTEM_PROMPT + TOOLS_HEADER + json.dumps(tool_schema()) + TOOLS_FOOTER + USER_INSTRUCTION
    ] * 30
