"""The recipe around the RL loop: the starting policy (a tiny model built on first use, then the
SFT cold start) and what a finished run leaves (the HF model folder, curves, ``summary.json``).

``rstar2 train`` calls :func:`initial_policy` before the trainer starts and :func:`finish`
after its last step; the trainer itself only runs stages and steps.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rstar2.agent.template import PromptFormat
from rstar2.config import Config
from rstar2.data.schema import DataError
from rstar2.learner.protocol import Learner
from rstar2.trainer.checkpoint import METRICS, read_jsonl

Say = Callable[[str], None]


def max_model_len(cfg: Config) -> int:
    """The longest context a run's engines must hold (prompt + longest response + slack)."""
    longest = max([s.max_response_tokens for s in cfg.stages] + [cfg.eval.max_response_tokens])
    return cfg.data.max_prompt_tokens + longest + 64


def initial_policy(
    cfg: Config,
    run_dir: Path,
    say: Say,
    *,
    quiet: bool = False,
    should_stop: Callable[[], bool] = lambda: False,
) -> str:
    """The folder RL starts from: ``model.path`` (built first when ``model.tiny`` is set and the
    folder is empty), or the SFT model in ``run_dir/sft`` when ``sft.data`` is set (trained
    once; a resumed run reuses it). SFT asks ``should_stop`` between steps
    (:class:`~rstar2.sft.SftStopped`)."""
    base = Path(cfg.model.path)
    build_tiny_if_missing(cfg, say)
    if not (base / "config.json").is_file():
        raise DataError(f"model.path {base} is not a model folder (no config.json)")
    if not cfg.sft.data:
        return str(base)
    sft_dir = run_dir / "sft"
    summary = sft_dir / "summary.json"
    if not summary.is_file():
        from rstar2.sft import run_sft

        say(f"sft: {len(cfg.sft.data)} file(s) -> {sft_dir}")
        sft_dir.mkdir(parents=True, exist_ok=True)
        result = run_sft(cfg, sft_dir, quiet=quiet, should_stop=should_stop)
        summary.write_text(json.dumps(result, indent=2) + "\n")
        say(
            f"sft: {result['steps']} steps, nll {result['first_nll']:.3f} -> "
            f"{result['last_nll']:.3f} ({result['time_s']:.0f} s)"
        )
    return str(sft_dir / "model")


def build_tiny_if_missing(cfg: Config, say: Say) -> None:
    """Build ``model.tiny`` at ``model.path`` when it is set and that folder holds no model."""
    base = Path(cfg.model.path)
    if cfg.model.tiny is not None and not (base / "config.json").is_file():
        say(f"building a tiny model in {base}")
        build_tiny(cfg, base)


def build_tiny(cfg: Config, folder: Path) -> None:
    """A random-init Qwen3-shaped model whose tokenizer is trained on the run's own text."""
    from rstar2.agent.template import USER_INSTRUCTION
    from rstar2.data.sources import load_rows
    from rstar2.sft import load_conversations
    from rstar2.tiny import build_tiny_model

    tiny = cfg.model.tiny
    assert tiny is not None
    fmt = cfg.agent.prompt_format(str(folder))
    corpus = [fmt.system_prompt + " " + USER_INSTRUCTION] * 200
    for file in cfg.sft.data:
        for messages in load_conversations(file):
            corpus.append(" ".join(str(m.get("content") or "") for m in messages))
    for spec in cfg.data.train_datasets:
        rows = load_rows(spec, strict=cfg.data.strict).rows
        corpus += [str(r["prompt"][-1]["content"]) for r in rows]
    corpus += [" ".join(str(i) for i in range(1000))] * 10
    build_tiny_model(
        folder,
        corpus,
        hidden_size=tiny.hidden_size,
        num_layers=tiny.num_layers,
        num_heads=tiny.num_heads,
        num_kv_heads=tiny.num_kv_heads,
        vocab_size=tiny.vocab_size,
        digit_group=tiny.digit_group,
        tie_word_embeddings=tiny.tie_word_embeddings,
        max_position_embeddings=max(2048, max_model_len(cfg)),
        seed=cfg.seed,
    )
    fmt.save(folder)


def finish(
    run_dir: Path, learner: Learner, tokenizer_path: str, prompt_format: PromptFormat, steps: int
) -> dict[str, Any]:
    """``model/`` (the policy as an HF folder with its tokenizer and prompt format),
    ``curves.png`` and ``summary.json`` (returned)."""
    from transformers import AutoTokenizer

    from rstar2.trainer.curves import plot_curves

    model_dir = run_dir / "model"
    learner.export_hf(model_dir)
    AutoTokenizer.from_pretrained(tokenizer_path).save_pretrained(model_dir)
    prompt_format.save(model_dir)
    curves = plot_curves(run_dir / METRICS, run_dir / "curves.png")
    rows = read_jsonl(run_dir / METRICS)
    evals = [r for r in rows if r.get("eval")]
    trained = [r for r in rows if "reward_mean" in r]
    summary: dict[str, Any] = {
        "steps": steps,
        "model_dir": str(model_dir),
        "curves": str(curves) if curves else None,
        "eval_before": evals[0] if evals else None,
        "eval_after": evals[-1] if evals else None,
        "reward_first": trained[0]["reward_mean"] if trained else None,
        "reward_last": trained[-1]["reward_mean"] if trained else None,
    }
    if len(evals) >= 2:
        summary["eval_gain_points"] = {
            k: round(100 * (evals[-1][k] - evals[0][k]), 2)
            for k in evals[0]
            if k.endswith("/accuracy") and k in evals[-1]
        }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
