"""The megatron backend against the torch backend on the same HF weights and batch (CPU, gloo,
fp32, a tiny Qwen3 with q/k norms and grouped-query attention), at TP=2, PP=2 and TP=2 x PP=2,
for every loss aggregation: log-probs, the loss and its metrics, the gradients, and the weights
after one AdamW step. megatron-core runs on CPU through tests/helpers/megatron_cpu.py; every
two-rank run of the module shares one pair of rank processes (the ``two_ranks`` fixture)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from perf.shapes import QWEN3_14B
from rstar2.algo.loss import LossSettings
from rstar2.config import ConfigError, TorchLearnerConfig
from rstar2.learner.torch_backend import TorchLearner, TorchLearnerSettings
from rstar2.tiny import build_tiny_model
from tests.conftest import REPO
from tests.faults import free_port
from tests.helpers.learner_data import full_weights, random_batch

pytest.importorskip("megatron.core")

from tests.helpers.megatron_params import AGGREGATIONS, MICRO_BATCH_TOKENS, PARITY_OPTIM

pytestmark = pytest.mark.timeout(600)
# (TP, PP, ranks, model, sequence parallel): Qwen3 untied, Qwen3 with embeddings tied across
# pipeline stages, Qwen2 (q/k/v biases); dp2: two data-parallel replicas, the distributed optimizer
LAYOUTS = {
    "tp2": (2, 1, 2, "qwen3", False),
    "pp2": (1, 2, 2, "qwen3", False),
    "tp2pp2-tied": (2, 2, 4, "qwen3-tied", False),
    "tp2-qwen2": (2, 1, 2, "qwen2", False),
    "tp2-sp": (2, 1, 2, "qwen3", True),
    "dp2": (1, 1, 2, "qwen3", False),
}


def _model(folder: Path, kind: str) -> Path:
    corpus = ["the quick brown fox jumps over the lazy dog"] * 20
    return build_tiny_model(
        folder,
        corpus,
        arch="qwen2" if kind == "qwen2" else "qwen3",
        hidden_size=64,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        vocab_size=300,
        tie_word_embeddings=kind.endswith("tied"),
    )


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("megatron-models")
    return {kind: _model(root / kind, kind) for kind in ("qwen3", "qwen3-tied", "qwen2")}


def _torch_learner(model: Path, agg: str) -> TorchLearner:
    return TorchLearner(
        TorchLearnerSettings(
            model_path=str(model),
            optim=PARITY_OPTIM,
            learner=TorchLearnerConfig(
                micro_batch_tokens_per_gpu=MICRO_BATCH_TOKENS, activation_checkpointing=False
            ),
            loss=LossSettings(loss_agg_mode=agg),  # type: ignore[arg-type]
            device="cpu",
        )
    )


def _reference(model: Path, agg: str) -> dict[str, object]:
    learner = _torch_learner(model, agg)
    batch = random_batch(6, seed=0)
    before = learner.compute_logprobs(batch)
    grads: dict[str, torch.Tensor] = {}
    step = learner._apply_update

    def capture_then_step() -> dict[str, float]:
        grads.update({n: p.grad.clone() for n, p in learner.model.named_parameters()})
        return step()

    learner._apply_update = capture_then_step  # type: ignore[method-assign]
    metrics = learner.train_step(batch)
    after = learner.compute_logprobs(batch)
    weights = full_weights(learner)
    return {
        "before": before,
        "after": after,
        "metrics": metrics,
        "grads": grads,
        "weights": weights,
    }


def _torchrun(ranks: int, *args: object) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={ranks}"]
    cmd += [f"--master-port={free_port()}", "-m", "tests.helpers.megatron_worker"]
    proc = subprocess.run(
        [*cmd, *map(str, args)], cwd=REPO, capture_output=True, text=True, timeout=500
    )
    assert proc.returncode == 0, proc.stderr[-4000:]


@pytest.fixture(scope="module")
def two_ranks(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Every two-rank run of this module, by name, from one pair of rank processes (each start
    imports torch and megatron-core: one start instead of eight). A run that failed is
    ``{"error": traceback}``; its test fails with it, the others still check theirs."""
    root = tmp_path_factory.mktemp("megatron-two-ranks")
    spec: dict[str, list[str]] = {
        f"parity-{layout}": ["parity", str(models[kind]), str(tp), str(pp), *(["sp"] if sp else [])]
        for layout, (tp, pp, ranks, kind, sp) in LAYOUTS.items()
        if ranks == 2
    }
    spec["checkpoint"] = ["checkpoint", str(models["qwen3-tied"]), str(root / "ckpt")]
    spec["checkpoint-dp"] = ["checkpoint-dp", str(models["qwen3"]), str(root / "ckpt-dp")]
    spec["spread"] = ["spread", str(models["qwen3-tied"])]
    _torchrun(2, "jobs", root / "results.pt", json.dumps(spec))
    return torch.load(root / "results.pt", weights_only=False)


def _result(runs: dict, name: str) -> dict:
    got = runs[name]
    assert "error" not in got, got.get("error")
    return got


def _gap(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for s, t in zip(a, b, strict=True) for x, y in zip(s, t, strict=True))


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_megatron_equals_the_torch_backend(
    layout: str, models, two_ranks: dict, tmp_path: Path
) -> None:
    tp, pp, ranks, kind, sp = LAYOUTS[layout]
    if ranks == 2:
        runs = _result(two_ranks, f"parity-{layout}")
    else:
        out = tmp_path / "megatron.pt"
        _torchrun(ranks, "parity", models[kind], out, tp, pp, *(["sp"] if sp else []))
        runs = torch.load(out, weights_only=False)
    _check_sft(runs["sft"], models[kind])
    for agg in AGGREGATIONS:
        got, ref = runs[agg], _reference(models[kind], agg)
        assert _gap(got["before"], ref["before"]) < 1e-5, agg
        for key in ("pg_loss", "clip_frac_low", "clip_frac_high", "clip_frac_dual", "grad_norm"):
            assert got["metrics"][key] == pytest.approx(ref["metrics"][key], rel=1e-5, abs=1e-7)
        assert got["metrics"]["tokens"] == ref["metrics"]["tokens"]
        assert sorted(got["grads"]) == sorted(ref["grads"]) == sorted(ref["weights"])
        # with data-parallel replicas the distributed optimizer reduce-scatters the gradients:
        # a rank's buffer is reduced only on its shard, so per-tensor gradients are compared
        # where there is one replica (the grad norm above covers the reduced whole)
        replicas = ranks // (tp * pp)
        for name, g in ref["grads"].items() if replicas == 1 else ():
            scale = g.abs().max().item()
            assert (got["grads"][name] - g).abs().max().item() <= 1e-5 * scale + 1e-9, name
        # one AdamW step moves a weight by ~lr * g / (|g| + eps): where |g| is near eps, float
        # rounding of g is amplified up to lr; everywhere else the weights agree to 1e-5
        lr = PARITY_OPTIM.lr
        far = total = 0
        for name, w in ref["weights"].items():
            diff = (got["weights"][name] - w).abs()
            assert diff.max().item() <= 2 * lr, name
            far += int((diff > 1e-5 * w.abs().max()).sum())
            total += w.numel()
        assert far <= 1e-3 * total, f"{far} of {total} weights differ after the step ({agg})"
        assert _gap(got["after"], ref["after"]) < 1e-4, agg
        grad_gap = max(
            (((got["grads"][n] - g).abs().max() / g.abs().max()).item() if replicas == 1 else 0.0)
            for n, g in ref["grads"].items()
        )
        print(  # the figures of the closing note
            f"{layout} {agg}: logprobs {_gap(got['before'], ref['before']):.1e}, grads rel "
            f"{grad_gap:.1e}, weights beyond 1e-5 rel {far}/{total}, after-step logprobs "
            f"{_gap(got['after'], ref['after']):.1e}"
        )


def _check_sft(got: dict[str, object], model: Path) -> None:
    learner = _torch_learner(model, "token-mean")
    ref = learner.sft_step(random_batch(6, seed=0))
    weights = full_weights(learner)
    metrics = got["metrics"]
    assert isinstance(metrics, dict)
    for key in ("nll", "grad_norm", "loss_tokens"):
        assert metrics[key] == pytest.approx(ref[key], rel=1e-5), key
    got_weights = got["weights"]
    assert isinstance(got_weights, dict) and sorted(got_weights) == sorted(weights)
    far = total = 0
    for name, w in weights.items():  # as after the RL step: a few entries near Adam's eps
        diff = (got_weights[name] - w).abs()
        assert diff.max().item() <= 2 * PARITY_OPTIM.lr, name
        far += int((diff > 1e-5 * w.abs().max()).sum())
        total += w.numel()
    assert far <= 1e-3 * total, f"{far} of {total} weights differ after the SFT step"


def test_a_checkpoint_resumes_bit_exactly_and_loads_at_another_layout(two_ranks: dict) -> None:
    got = _result(two_ranks, "checkpoint")
    going_on, resumed, resharded = got["going_on"], got["resumed"], got["resharded"]
    assert resumed["step"] == 1
    assert resumed["metrics"] == going_on["metrics"]  # bit for bit: every float equal
    assert sorted(resumed["weights"]) == sorted(going_on["weights"])
    for name, w in going_on["weights"].items():
        assert torch.equal(resumed["weights"][name], w), name
    # at PP=2 the same weights give the same log-probs, and the optimizer state came along:
    # the next step's metrics match the TP=2 run's
    assert _gap(resharded["logprobs"], got["saved"]) < 1e-5
    for key in ("pg_loss", "grad_norm", "lr", "step", "tokens"):
        assert resharded["metrics"][key] == pytest.approx(going_on["metrics"][key], rel=1e-5)
    # the update used the restored Adam moments (fresh ones move every weight by ~lr instead)
    assert _gap(resharded["after"], going_on["after"]) < 1e-4
    print(
        f"TP2 -> PP2 log-probs {_gap(resharded['logprobs'], got['saved']):.1e}, after the next "
        f"step {_gap(resharded['after'], going_on['after']):.1e}"
    )


def test_a_data_parallel_checkpoint_resumes_bit_exactly(two_ranks: dict) -> None:
    got = _result(two_ranks, "checkpoint-dp")
    assert got["resumed"]["metrics"] == got["going_on"]["metrics"]
    for name, w in got["going_on"]["weights"].items():
        assert torch.equal(got["resumed"]["weights"][name], w), name
    assert "loads only at the same TP and PP with several replicas" in got["refused"]


@pytest.fixture(scope="module")
def qwen3_14b_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import Qwen3Config

    folder = tmp_path_factory.mktemp("qwen3-14b")
    Qwen3Config(**QWEN3_14B).save_pretrained(folder)
    return folder


def test_the_14b_recipe_layout_is_planned_on_a_cpu(qwen3_14b_config: Path) -> None:
    """`rstar2 layout` on the 14B recipe: megatron-core builds the whole model on the meta
    device at TP=4 (about a second, no memory) and the counts are Qwen3-14B's; a layout that
    cannot work is a config error naming its key, before any GPU is booked."""
    from tests.conftest import run_cli

    recipe = str(REPO / "configs" / "rstar2_14b_mi300x.yaml")
    res = run_cli("layout", "--config", recipe, f"model.path={qwen3_14b_config}")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "64 ranks, TP=4 x PP=1 x DP=16; 14.77B parameters" in res.stdout  # Qwen3-14B: 14.8B
    assert "per rank by stage: 3.69B" in res.stdout
    # the memory plan's own count of a rank's weights agrees: 3.69B x 2 bytes = 6.9 GiB
    assert "learner: peak " in res.stdout and "= weights 6.9, grads 13.8," in res.stdout
    res = run_cli(
        "layout",
        "--config",
        recipe,
        f"model.path={qwen3_14b_config}",
        "learner.pipeline_parallel_size=16",
    )  # fmt: skip  (64 ranks: TP 4 x PP 16)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "learner.pipeline_parallel_size: the model's 40 layers do not divide by PP=16" in (
        res.stderr
    )


def test_a_plan_counts_every_parameter_once_per_stage(qwen3_14b_config: Path) -> None:
    from transformers import AutoConfig

    from rstar2.config import MegatronLearnerConfig
    from rstar2.learner.megatron.plan import plan_learner

    hf = AutoConfig.from_pretrained(qwen3_14b_config)
    section = MegatronLearnerConfig(
        backend="megatron", tensor_parallel_size=1, pipeline_parallel_size=2
    )
    plan = plan_learner(section, hf, world_size=4)
    assert plan.layout.data_parallel == 2
    assert sum(plan.params_per_rank) == plan.total_params  # TP=1, untied: nothing shared
    embedding = 151936 * 5120
    assert plan.params_per_rank[0] - embedding == plan.params_per_rank[1] - embedding - 5120
    with pytest.raises(ConfigError, match=r"learner\.tensor_parallel_size"):
        plan_learner(section.model_copy(update={"tensor_parallel_size": 3}), hf, world_size=3)


def test_every_rank_holds_each_bucket_in_step_for_colocated_ipc(two_ranks: dict) -> None:
    """At PP=2 and at TP=2 both ranks get the same buckets and, broadcast from rank 0 bucket by
    bucket, every full tensor (what each rank's vLLM IPC sender maps to its engine worker)."""
    for layout, got in _result(two_ranks, "spread").items():
        first, second = got["ranks"]
        assert first["buckets"] == second["buckets"] > 2, layout
        assert first["held_here"] and not second["held_here"], layout  # rank 1: broadcast
        for rank in (first, second):
            assert list(rank["weights"]) == list(got["full"]), layout
            for name, w in got["full"].items():
                assert torch.equal(rank["weights"][name], w), (layout, name)
