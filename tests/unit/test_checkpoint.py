"""Checkpoints under faults, with the real torch learner on a tiny model: torn folders, a full
disk (a real tmpfs), a SIGKILL during the write, and what pruning may delete."""

from __future__ import annotations

import logging
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from rstar2.config import OptimConfig, TorchLearnerConfig
from rstar2.learner.torch_backend import TorchLearner, TorchLearnerSettings
from rstar2.trainer import durable
from rstar2.trainer import state as st
from rstar2.trainer.checkpoint import Checkpointer, CheckpointError
from tests.faults import small_tmpfs
from tests.helpers.learner_data import random_batch, tiny_model

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("ckpt-model"))


def _learner(model_dir: Path) -> TorchLearner:
    section = TorchLearnerConfig.model_construct(micro_batch_tokens_per_gpu=4096)
    return TorchLearner(
        TorchLearnerSettings(
            model_path=str(model_dir),
            optim=OptimConfig(lr=1e-2, warmup_steps=0),
            learner=section,
            device="cpu",
        )
    )


def _weights(learner: TorchLearner) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in learner.model.state_dict().items()}


def _save_steps(learner: TorchLearner, ckpt: Checkpointer, steps: list[int]) -> dict[int, dict]:
    saved = {}
    for step in steps:
        learner.train_step(random_batch(4, seed=step))
        ckpt.save(learner, st.TrainerState(step=step), random.Random(step))
        saved[step] = _weights(learner)
    return saved


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_torn_newest_checkpoint_is_skipped_for_the_previous_one(model_dir, tmp_path, caplog):
    learner = _learner(model_dir)
    ckpt = Checkpointer(tmp_path, keep_last=3)
    saved = _save_steps(learner, ckpt, [1, 2])
    newest = st.checkpoint_dir(tmp_path, 2)
    victim = max((p for p in (newest / "learner").iterdir()), key=lambda p: p.stat().st_size)
    with open(victim, "r+b") as fh:  # what a crash before the data reached the disk leaves
        fh.truncate(victim.stat().st_size // 2)

    fresh = _learner(model_dir)
    resumed = Checkpointer(tmp_path, keep_last=3)
    with caplog.at_level(logging.WARNING):
        state = resumed.restore(fresh)
        assert not resumed.has(2) and resumed.has(1)  # asked again: no second warning
    assert state is not None and state.step == 1
    assert _same(_weights(fresh), saved[1])
    assert "step_000002 is torn" in caplog.text and victim.name in caplog.text
    assert caplog.text.count("step_000002 is torn") == 1


def test_when_every_checkpoint_is_torn_the_resume_refuses_to_start_over(model_dir, tmp_path):
    learner = _learner(model_dir)
    ckpt = Checkpointer(tmp_path, keep_last=3)
    _save_steps(learner, ckpt, [1])
    (st.checkpoint_dir(tmp_path, 1) / st.STATE_FILE).write_text("{}\n")  # size changed
    with pytest.raises(CheckpointError, match=r"every checkpoint .* is torn"):
        ckpt.restore(_learner(model_dir))


def test_resaving_a_step_swaps_it_and_an_old_copy_stands_in_while_the_new_is_missing(
    model_dir, tmp_path
):
    learner = _learner(model_dir)
    ckpt = Checkpointer(tmp_path, keep_last=2)
    saved = _save_steps(learner, ckpt, [1, 1])
    root = tmp_path / st.CHECKPOINTS
    assert sorted(p.name for p in root.iterdir()) == ["step_000001"]
    # a crash between the two renames of a re-save leaves only the swapped-out copy
    st.checkpoint_dir(tmp_path, 1).rename(root / "step_000001.old")
    fresh = _learner(model_dir)
    state = ckpt.restore(fresh)
    assert state is not None and state.step == 1
    assert _same(_weights(fresh), saved[1])
    st.prune(tmp_path, 1, ckpt.whole())
    assert (root / "step_000001.old").is_dir()  # the only whole copy is never deleted


def test_pruning_keeps_the_newest_whole_checkpoint_behind_a_torn_one(tmp_path):
    for step in (2, 4, 6):
        folder = st.checkpoint_dir(tmp_path, step)
        folder.mkdir(parents=True)
        st.write_state(folder, st.TrainerState(step=step))
        durable.seal(folder)
    (st.checkpoint_dir(tmp_path, 6) / st.STATE_FILE).write_text("{}")  # torn
    whole = Checkpointer(tmp_path, keep_last=1).whole()
    assert [p.name for p in whole] == ["step_000002", "step_000004"]
    st.prune(tmp_path, keep_last=1, whole=whole)
    left = sorted(p.name for p in (tmp_path / st.CHECKPOINTS).iterdir())
    assert left == ["step_000004", "step_000006"]  # the torn newer one is left for a look


@pytest.fixture
def small_disk(tmp_path):
    with small_tmpfs(tmp_path / "disk", size_mib=3) as mount:
        yield mount


def test_a_full_disk_keeps_the_previous_checkpoint_and_says_so(model_dir, small_disk):
    learner = _learner(model_dir)
    ckpt = Checkpointer(small_disk, keep_last=3)
    saved = _save_steps(learner, ckpt, [1])
    size = sum(p.stat().st_size for p in st.checkpoint_dir(small_disk, 1).rglob("*"))
    assert size < 3 << 20 < 2 * size, "resize the tmpfs: one checkpoint must fit, two not"
    full = "disk full while writing checkpoint step_000002"
    with pytest.raises(CheckpointError, match=full) as e:
        _save_steps(learner, ckpt, [2])
    assert "step_000001 is intact" in str(e.value) and "\n" not in str(e.value)
    assert sorted(p.name for p in (small_disk / st.CHECKPOINTS).iterdir()) == ["step_000001"]
    fresh = _learner(model_dir)
    state = ckpt.restore(fresh)
    assert state is not None and state.step == 1
    assert _same(_weights(fresh), saved[1])


_WRITER = """
import random, sys, torch
from pathlib import Path
from rstar2.trainer import state as st
from rstar2.trainer.checkpoint import Checkpointer
from tests.unit.test_checkpoint import _learner, _save_steps

run, model = Path(sys.argv[1]), Path(sys.argv[2])
learner = _learner(model)
ckpt = Checkpointer(run, keep_last=3)
_save_steps(learner, ckpt, [1])
print("saved", flush=True)
big = torch.zeros(64 << 20, dtype=torch.uint8)  # a slow extra, so the kill lands mid-write
def slow(folder):
    for i in range(64):
        torch.save(big, folder / f"extra-{i}.pt")
ckpt.save(learner, st.TrainerState(step=2), random.Random(2), extra=slow)
print("finished", flush=True)
"""


def test_a_sigkill_during_a_checkpoint_write_resumes_from_the_previous_one(model_dir, tmp_path):
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_WRITER), str(run), str(model_dir)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "saved"
        partial = st.checkpoint_dir(run, 2).with_name("step_000002.tmp")
        deadline = time.monotonic() + 300
        while not (partial / "extra-1.pt").exists():  # the write is under way
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    fresh = _learner(model_dir)
    state = Checkpointer(run, keep_last=3).restore(fresh)
    assert state is not None and state.step == 1
    reference = _learner(model_dir)
    _save_steps(reference, Checkpointer(tmp_path / "ref", keep_last=3), [1])
    assert _same(_weights(fresh), _weights(reference))


def test_a_sealed_checkpoint_without_its_manifest_is_torn(model_dir, tmp_path):
    learner = _learner(model_dir)
    ckpt = Checkpointer(tmp_path, keep_last=3)
    _save_steps(learner, ckpt, [1, 2])
    (st.checkpoint_dir(tmp_path, 2) / durable.MANIFEST).unlink()  # e.g. a partial copy
    assert [p.name for p in ckpt.whole()] == ["step_000001"]
    assert not ckpt.has(2) and ckpt.has(1)


def test_a_resave_after_a_crash_between_renames_keeps_the_swapped_out_copy(model_dir, tmp_path):
    learner = _learner(model_dir)
    ckpt = Checkpointer(tmp_path, keep_last=1)
    _save_steps(learner, ckpt, [1])
    root = tmp_path / st.CHECKPOINTS
    st.checkpoint_dir(tmp_path, 1).rename(root / "step_000001.old")
    assert ckpt.has(1)
    ckpt.save(learner, st.TrainerState(step=1), random.Random(1))
    assert [p.name for p in root.iterdir()] == ["step_000001"]
    assert [p.name for p in ckpt.whole()] == ["step_000001"]
