"""The torch learner on a tiny model: packing, the update, checkpoints, weight buckets, FSDP2."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rstar2.algo.loss import LossSettings
from rstar2.config import OptimConfig, TorchLearnerConfig
from rstar2.learner.packing import pack, plan
from rstar2.learner.protocol import TrainSequence
from rstar2.learner.torch_backend import TorchLearner, TorchLearnerSettings, _unit_of
from tests.helpers.learner_data import random_batch, tiny_model

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("learner-model"))


def _learner(
    model_dir: Path, *, micro_batch_tokens: int = 4096, loss: LossSettings | None = None, **optim
) -> TorchLearner:
    # model_construct: these tests go below the config's micro-batch floor on purpose
    section = TorchLearnerConfig.model_construct(micro_batch_tokens_per_gpu=micro_batch_tokens)
    settings = TorchLearnerSettings(
        model_path=str(model_dir),
        optim=OptimConfig(**({"lr": 1e-2, "warmup_steps": 0} | optim)),
        learner=section,
        loss=loss or LossSettings(),
        device="cpu",
    )
    return TorchLearner(settings)


def _weights(learner: TorchLearner) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in learner.model.state_dict().items()}


def test_plan_respects_the_token_budget_and_keeps_order() -> None:
    assert plan([5, 5, 5, 20, 1], 10) == [[0, 1], [2], [3], [4]]
    mb = pack(random_batch(3, seed=0), [0, 2])
    n0, n2 = mb.lengths
    assert mb.position_ids[0, :n0].tolist() == list(range(n0))
    assert mb.position_ids[0, n0:].tolist() == list(range(n2))
    assert not mb.valid[0, n0 - 1] and not mb.valid[0, -1] and int(mb.valid.sum()) == n0 + n2 - 2


def test_packed_logprobs_equal_unpacked_ones(model_dir: Path) -> None:
    batch = random_batch(6, seed=0)
    learner = _learner(model_dir, micro_batch_tokens=10_000)
    packed = learner.compute_logprobs(batch)
    alone = _learner(model_dir, micro_batch_tokens=1).compute_logprobs(batch)
    with torch.no_grad():
        for seq, got, single in zip(batch, packed, alone, strict=True):
            logits = learner.model(input_ids=torch.tensor([list(seq.token_ids)])).logits[0]
            lp = logits.log_softmax(-1)
            ref = [0.0] + [lp[i - 1, t].item() for i, t in enumerate(seq.token_ids) if i > 0]
            assert max(abs(a - b) for a, b in zip(got, ref, strict=True)) < 1e-5
            assert max(abs(a - b) for a, b in zip(got, single, strict=True)) < 1e-5


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_the_update_does_not_depend_on_the_micro_batch_split(model_dir: Path, mode: str) -> None:
    batch = random_batch(8, seed=2)
    loss = LossSettings(loss_agg_mode=mode)  # type: ignore[arg-type]
    whole = _learner(model_dir, micro_batch_tokens=10_000, loss=loss)
    split = _learner(model_dir, micro_batch_tokens=60, loss=loss)
    m1, m2 = whole.train_step(batch), split.train_step(batch)
    assert m1["pg_loss"] == pytest.approx(m2["pg_loss"], abs=1e-6)
    assert m1["grad_norm"] == pytest.approx(m2["grad_norm"], rel=1e-5)
    w1, w2 = _weights(whole), _weights(split)
    # Adam's first step is about lr * sign(grad): only gradients within float noise of 0 can
    # move differently, by far less than one step (lr = 1e-2)
    assert max((w1[k] - w2[k]).abs().max().item() for k in w1) < 1e-4
    assert whole.step == 1 and m1["tokens"] == sum(len(s.token_ids) for s in batch)


def test_a_step_raises_the_likelihood_of_positively_rewarded_tokens(model_dir: Path) -> None:
    learner = _learner(model_dir, lr=3e-3)
    batch = random_batch(4, seed=3)
    before = learner.compute_logprobs(batch)
    pos = [TrainSequence(s.token_ids, s.loss_mask, before[i], 1.0) for i, s in enumerate(batch)]
    for _ in range(3):
        learner.train_step(pos)
    after = learner.compute_logprobs(batch)

    def mean_masked(lps: list[list[float]]) -> float:
        vals = [
            v
            for s, lp in zip(batch, lps, strict=True)
            for v, m in zip(lp, s.loss_mask, strict=True)
            if m
        ]
        return sum(vals) / len(vals)

    assert mean_masked(after) > mean_masked(before) + 0.05


def test_warmup_and_clip(model_dir: Path) -> None:
    learner = _learner(model_dir, lr=1e-3, warmup_steps=4, grad_clip_norm=1e-3)
    lrs = [learner.train_step(random_batch(2, seed=s))["lr"] for s in range(5)]
    assert lrs == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3])
    clipped = _learner(model_dir, grad_clip_norm=1e-3)
    metrics = clipped.train_step(random_batch(2, seed=9))
    assert metrics["grad_norm"] > 1e-2  # reported before clipping
    # Adam's first moment after one step is (1 - beta1) * the gradient it was given
    states = clipped.optimizer.state.values()
    given = torch.sqrt(sum((st["exp_avg"] ** 2).sum() for st in states)) / (1 - 0.9)
    assert float(given) == pytest.approx(1e-3, rel=1e-4)


def test_save_load_then_next_step_is_bit_identical(model_dir: Path, tmp_path: Path) -> None:
    batches = [random_batch(4, seed=s) for s in (10, 11, 12)]
    straight = _learner(model_dir, warmup_steps=2)
    for b in batches:
        last = straight.train_step(b)
    first = _learner(model_dir, warmup_steps=2)
    first.train_step(batches[0])
    first.save(tmp_path / "ckpt")
    resumed = _learner(model_dir, warmup_steps=2)
    resumed.load(tmp_path / "ckpt")
    assert resumed.step == 1
    for b in batches[1:]:
        again = resumed.train_step(b)
    assert again == last
    w1, w2 = _weights(straight), _weights(resumed)
    assert all(torch.equal(w1[k], w2[k]) for k in w1)


def test_load_rejects_a_folder_that_is_not_a_checkpoint(model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not a learner checkpoint"):
        _learner(model_dir).load(tmp_path)


def test_named_weights_come_in_bounded_buckets_under_hf_names(model_dir: Path) -> None:
    learner = _learner(model_dir)
    expected = learner.model.state_dict()
    limit = 40_000
    seen: dict[str, torch.Tensor] = {}
    buckets = list(learner.named_weights(limit))
    assert len(buckets) > 2
    for bucket in buckets:
        sizes = [t.numel() * t.element_size() for _, t in bucket]
        units = {_unit_of(name) for name, _ in bucket}
        assert sum(sizes) <= limit or len(units) == 1  # only a unit larger than the bound
        seen.update(bucket)
    layer_of = {name: i for i, b in enumerate(buckets) for name, _ in b}
    for name in layer_of:  # a decoder layer is never split across buckets (engines fuse q/k/v)
        if name.startswith("model.layers.0."):
            assert layer_of[name] == layer_of["model.layers.0.self_attn.q_proj.weight"]
    assert list(seen) == list(expected)
    assert all(torch.equal(seen[k], expected[k]) for k in expected)
    assert "lm_head.weight" in seen and "model.embed_tokens.weight" in seen


def test_fsdp2_on_two_gloo_ranks_matches_one_process(model_dir: Path, tmp_path: Path) -> None:
    """2 ranks, each on half the batch, equal one process on all of it; a sharded checkpoint
    resumes bit-identically."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone",
        "-m", "tests.helpers.fsdp_worker", str(model_dir), str(tmp_path),
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, text=True, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        _, stderr = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # torchrun stops its ranks (own sessions) on SIGTERM
        try:
            proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        raise
    assert proc.returncode == 0, stderr[-3000:]
    run = torch.load(tmp_path / "run.pt", weights_only=False)
    resumed = torch.load(tmp_path / "resumed.pt", weights_only=False)
    assert run["metrics"] == resumed["metrics"]
    assert all(torch.equal(run["weights"][k], resumed["weights"][k]) for k in run["weights"])
    # colocated IPC: both ranks hold every tensor, bucket by bucket in step (one list per bucket)
    spread = [torch.load(tmp_path / f"spread{r}.pt", weights_only=False) for r in (0, 1)]
    assert spread[0]["buckets"] == spread[1]["buckets"] > 2
    assert spread[0]["held_here"] and spread[1]["held_here"]  # FSDP2: no broadcast needed
    # the NCCL source: rank 0 yields every tensor, rank 1 none (and its check expects none)
    assert spread[0]["nccl_names"] == list(spread[0]["weights"]) and spread[1]["nccl_names"] == []
    for got in spread:
        assert list(got["weights"]) == list(resumed["weights"])
        assert all(torch.equal(got["weights"][k], v) for k, v in resumed["weights"].items())

    single = _learner(model_dir, micro_batch_tokens=64)
    batch = random_batch(8, seed=1)
    single.train_step(batch)
    m = single.train_step(batch)
    assert m["pg_loss"] == pytest.approx(run["metrics"]["pg_loss"], abs=1e-5)
    assert m["grad_norm"] == pytest.approx(run["metrics"]["grad_norm"], rel=1e-4)
    ref = _weights(single)
    # two Adam steps of lr 1e-2: float noise in near-zero gradients moves far less than a step
    assert max((ref[k] - run["weights"][k]).abs().max().item() for k in ref) < 1e-4
