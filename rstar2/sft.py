"""``rstar2 sft``: the non-reasoning, tool-call-format cold start before RL.

Conversations (JSONL, one ``{"messages": [...]}`` per line) are rendered with the same chat
template the agent loop uses: the system prompt with the tool block, user turns, assistant turns
(their ``<tool_call>`` blocks verbatim) each closed by the end-of-turn token, and consecutive
``tool`` messages as one user turn of ``<tool_response>`` blocks. The loss is the mean
negative log-likelihood of assistant tokens only (their closing end-of-turn token included);
system, user, tool and template tokens are masked. Sequences are packed
(:mod:`rstar2.learner.packing`). The run folder gets ``config.json``, ``metrics.jsonl`` (one
line per step) and ``model/`` (an HF folder with the tokenizer, what RL and engines load).
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rstar2.agent.template import ChatTemplate
from rstar2.config import Config
from rstar2.data.schema import DataError
from rstar2.learner.protocol import TrainSequence


def encode_conversation(
    template: ChatTemplate, messages: Sequence[dict[str, Any]]
) -> tuple[list[int], list[int]]:
    """Token ids and loss mask of one conversation; ValueError names what is wrong with it."""
    roles = [m.get("role") for m in messages]
    if not roles or roles[0] != "user":
        raise ValueError("a conversation starts with a user message")
    if "assistant" not in roles:
        raise ValueError("a conversation needs an assistant message")
    eos = template.im_end_id
    ids = template.encode_prompt([messages[0]])
    mask = [0] * len(ids)
    i = 1
    while i < len(messages):
        role, content = messages[i].get("role"), str(messages[i].get("content") or "")
        if role == "assistant":
            turn = [*template.encode(content), eos]
            ids += turn
            mask += [1] * len(turn)
            i += 1
            continue
        if role == "tool":
            responses = []
            while i < len(messages) and messages[i].get("role") == "tool":
                responses.append(str(messages[i].get("content") or ""))
                i += 1
            turn = template.encode(template.tool_turn_text(responses))
        elif role == "user":
            turn = template.encode(template.user_turn_text(content))
            i += 1
        else:
            raise ValueError(f"unsupported role {role!r}")
        if i >= len(messages):
            break  # a trailing non-assistant turn teaches nothing
        ids += turn
        mask += [0] * len(turn)
    return ids, mask


def load_conversations(path: str | Path) -> list[list[dict[str, Any]]]:
    """Conversations of a JSONL file; DataError names the first bad line."""
    file = Path(path)
    if not file.is_file():
        raise DataError(f"SFT data file {file} does not exist")
    out = []
    with open(file, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                messages = record["messages"]
                if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
                    raise TypeError("messages must be a list of objects")
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise DataError(f"{file}:{lineno}: {exc}") from None
            out.append(messages)
    if not out:
        raise DataError(f"{file}: no conversations")
    return out


def build_sequences(
    template: ChatTemplate, files: Sequence[str], max_seq_tokens: int
) -> tuple[list[TrainSequence], int]:
    """Every conversation as a masked sequence; returns them and how many were too long."""
    seqs: list[TrainSequence] = []
    skipped = 0
    for file in files:
        for n, messages in enumerate(load_conversations(file), 1):
            try:
                ids, mask = encode_conversation(template, messages)
            except ValueError as exc:
                raise DataError(f"{file}: conversation {n}: {exc}") from None
            if len(ids) > max_seq_tokens:
                skipped += 1
                continue
            seqs.append(TrainSequence(ids, mask, [0.0] * len(ids)))
    return seqs, skipped


class SftStopped(Exception):
    """SFT was asked to stop (SIGTERM) before it finished; nothing of it is kept."""


def check_sft_inputs(cfg: Config) -> None:
    """DataError when SFT has no data or no model to start from (before any run folder)."""
    if not cfg.sft.data:
        raise DataError("sft.data is empty: name at least one JSONL file of conversations")
    if not (Path(cfg.model.path) / "config.json").is_file():
        raise DataError(f"model.path {cfg.model.path} is not a model folder (no config.json)")


def run_sft(
    cfg: Config,
    run_dir: Path,
    *,
    quiet: bool = False,
    should_stop: Callable[[], bool] = lambda: False,
    rank: int = 0,
) -> dict[str, Any]:
    """Train ``cfg.model.path`` on ``cfg.sft.data``; writes the run folder (module docstring).
    ``should_stop`` is asked between optimizer steps; when it says yes, :class:`SftStopped` is
    raised and no model is written (SFT keeps no checkpoints: it starts over next time).
    Under torchrun every rank calls this (``rank``: this one's); rank 0 alone writes files."""
    from tqdm import tqdm
    from transformers import AutoTokenizer

    from rstar2.learner.build import build_learner, learner_settings

    check_sft_inputs(cfg)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.tokenizer_path or cfg.model.path)
    prompt_format = cfg.agent.prompt_format(cfg.model.path)
    template = prompt_format.template(tokenizer, cfg.agent.tool_name)
    seqs, skipped = build_sequences(template, cfg.sft.data, cfg.sft.max_seq_tokens)
    if not seqs:
        raise DataError(f"no conversation fits sft.max_seq_tokens={cfg.sft.max_seq_tokens}")
    learner = build_learner(
        learner_settings(
            cfg,
            cfg.model.path,
            optim=cfg.optim.model_copy(
                update={"lr": cfg.sft.lr, "warmup_steps": cfg.sft.warmup_steps}
            ),
        )
    )
    try:
        rng = random.Random(cfg.seed)
        per_step = cfg.sft.batch_num_sequences
        steps_per_epoch = -(-len(seqs) // per_step)
        total_steps = steps_per_epoch * cfg.sft.num_epochs
        start = time.perf_counter()
        metrics: dict[str, float] = {}
        first_nll: float | None = None
        with (
            open(run_dir / "metrics.jsonl" if rank == 0 else os.devnull, "w") as log,
            tqdm(total=total_steps, desc="sft", unit="step", disable=quiet or rank != 0) as bar,
        ):
            for epoch in range(cfg.sft.num_epochs):
                order = list(range(len(seqs)))
                rng.shuffle(order)
                for s in range(steps_per_epoch):
                    if should_stop():
                        raise SftStopped(f"SFT stopped after {bar.n} of {total_steps} steps")
                    batch = [seqs[i] for i in order[s * per_step : (s + 1) * per_step]]
                    metrics = learner.sft_step(batch)
                    first_nll = metrics["nll"] if first_nll is None else first_nll
                    record = {"epoch": epoch, **metrics, "time_s": time.perf_counter() - start}
                    log.write(json.dumps(record) + "\n")
                    log.flush()
                    bar.update(1)
                    bar.set_postfix(nll=f"{metrics['nll']:.3f}")
        model_dir = run_dir / "model"
        learner.export_hf(model_dir)
    finally:
        learner.close()
    if rank == 0:
        tokenizer.save_pretrained(model_dir)
        prompt_format.save(model_dir)
    return {
        "conversations": len(seqs),
        "skipped_too_long": skipped,
        "steps": total_steps,
        "first_nll": first_nll,
        "last_nll": metrics.get("nll"),
        "model_dir": str(model_dir),
        "time_s": round(time.perf_counter() - start, 2),
    }
