"""rstar2 sft: conversation rendering and masks, data errors, and a short run on a tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rstar2.agent.template import ChatTemplate
from rstar2.agent.tools import tool_schema, truncate
from rstar2.data.schema import DataError
from rstar2.sft import encode_conversation, load_conversations
from rstar2.tiny import build_tiny_model
from tests.conftest import REPO, run_cli
from tests.helpers.tool_model import SCRIPTS, _conversation, _template_corpus, corpus


@pytest.fixture(scope="module")
def base_model(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sft-base")
    build_tiny_model(out, corpus() + _template_corpus(), hidden_size=128, num_layers=2)
    return out


@pytest.fixture(scope="module")
def template(base_model: Path) -> ChatTemplate:
    from transformers import AutoTokenizer

    return ChatTemplate(AutoTokenizer.from_pretrained(base_model), tools=(tool_schema(),))


def _messages(script, t: str = "0.00") -> list[dict[str, str]]:
    tool = [
        {"role": "tool", "content": truncate(o.format(t=t), 256, "middle")} for o in script.outputs
    ]
    return [
        {"role": "user", "content": script.problem},
        {"role": "assistant", "content": script.turn1},
        *tool,
        {"role": "assistant", "content": script.turn2},
    ]


def test_rendering_matches_the_agent_loop_and_masks_only_assistant_tokens(template) -> None:
    for script in SCRIPTS:
        responses = [truncate(o.format(t="0.00"), 256, "middle") for o in script.outputs]
        assert encode_conversation(template, _messages(script)) == _conversation(
            template, script, responses
        )
    ids, mask = encode_conversation(template, _messages(SCRIPTS[0]))
    sampled = template.tokenizer.decode([i for i, m in zip(ids, mask, strict=True) if m])
    assert sampled.startswith("I will compute it.") and "<tool_response>" not in sampled
    assert sampled.count("<|im_end|>") == 2


def test_bad_conversations_are_named(tmp_path: Path, template) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": []}\n{oops\n')
    with pytest.raises(DataError, match=r"bad\.jsonl:2"):
        load_conversations(bad)
    with pytest.raises(ValueError, match="starts with a user message"):
        encode_conversation(template, [{"role": "assistant", "content": "hi"}])
    with pytest.raises(ValueError, match="unsupported role 'robot'"):
        encode_conversation(
            template,
            [
                {"role": "user", "content": "q"},
                {"role": "robot", "content": "x"},
                {"role": "assistant", "content": "a"},
            ],
        )


def test_sft_run_learns_the_conversations(base_model: Path, tmp_path: Path) -> None:
    data = tmp_path / "conversations.jsonl"
    lines = [
        json.dumps({"messages": _messages(s, t)})
        for s in SCRIPTS
        for t in ("0.00", "0.01", "0.02", "0.03")
    ]
    data.write_text("\n".join(lines) + "\n")
    config = {
        "name": "sft-test",
        "runs_dir": str(tmp_path / "runs"),
        "model": {"path": str(base_model), "dtype": "float32"},
        "sft": {"data": [str(data)], "num_epochs": 20, "batch_num_sequences": 12, "lr": 5e-3,
                "warmup_steps": 0},
        "learner": {"micro_batch_tokens_per_gpu": 1024},
        "cluster": {"accelerator": "cpu", "gpus_per_node": 0},
    }  # fmt: skip
    cfg_path = tmp_path / "sft.yaml"
    cfg_path.write_text(yaml.safe_dump(config))
    run_dir = tmp_path / "run"
    proc = run_cli(
        "sft", "--config", str(cfg_path), "--run-dir", str(run_dir), "--quiet", timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 20 and metrics[-1]["step"] == 20
    assert metrics[-1]["nll"] < 0.2 * metrics[0]["nll"]
    assert json.loads((run_dir / "config.json").read_text())["sft"]["num_epochs"] == 20

    # the exported HF folder holds the trained weights: its NLL on the assistant tokens is the
    # learner's last one (one more step of descent, so a little lower)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(run_dir / "model")
    model = AutoModelForCausalLM.from_pretrained(run_dir / "model")
    template = ChatTemplate(tok, tools=(tool_schema(),))
    total = count = 0.0
    with torch.no_grad():
        for line in lines:
            ids, mask = encode_conversation(template, json.loads(line)["messages"])
            logp = model(input_ids=torch.tensor([ids])).logits[0, :-1].log_softmax(-1)
            chosen = logp.gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
            weights = torch.tensor(mask[1:], dtype=torch.float32)
            total += float(-(chosen * weights).sum())
            count += float(weights.sum())
    assert total / count < metrics[-1]["nll"] * 1.05


def test_sft_config_errors_exit_2(tmp_path: Path) -> None:
    proc = run_cli("sft", "sft.num_epochs=0")
    assert proc.returncode == 2 and "sft.num_epochs" in proc.stderr
    run_dir = ["--run-dir", str(tmp_path / "run")]  # not the checkout's runs/
    proc = run_cli("sft", *run_dir, f"model.path={tmp_path}", f"sft.data=[{tmp_path / 'x.jsonl'}]")
    assert proc.returncode == 2 and "not a model folder" in proc.stderr


def test_sft_builds_the_configs_tiny_model_first_as_train_does(tmp_path: Path) -> None:
    """`rstar2 sft` of a config with `model.tiny` and an empty `model.path` builds the tiny
    model there first (as `rstar2 train` does), then trains it; with no SFT data nothing is
    built."""
    data = tmp_path / "data"
    res = run_cli("data", "toy", "--out", str(data), *["--num-sft", "48", "--num-train", "8"])
    assert res.returncode == 0, res.stderr[-2000:]
    base = tmp_path / "base"
    common = [
        "--config",
        str(REPO / "configs" / "toy" / "cpu.yaml"),
        f"runs_dir={tmp_path / 'runs'}",
        f"model.path={base}",
        f"data.train_datasets=[{data / 'train.jsonl'}]",
    ]
    res = run_cli("sft", *common, "sft.data=[]", "--run-dir", str(tmp_path / "none"))
    assert res.returncode == 2 and "sft.data is empty" in res.stderr
    assert not base.exists()
    run_dir = tmp_path / "run"
    res = run_cli("sft", *common, f"sft.data=[{data / 'sft.jsonl'}]", "--run-dir", str(run_dir))
    assert res.returncode == 0, res.stderr[-2000:]
    assert (base / "config.json").is_file() and (run_dir / "model" / "config.json").is_file()
    assert f"building a tiny model in {base}" in res.stdout
