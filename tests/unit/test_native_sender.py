"""rstar2.sync.native_sender's weight source over a real (CPU) torch learner, read through the
installed vLLM's WeightSource: the engines' dtype on the wire, and a pass that drifts from the
metadata both ends split the packed stream by is refused before anything mismatched goes out."""

from __future__ import annotations

import pytest
import torch

from rstar2.config import OptimConfig, TorchLearnerConfig
from rstar2.learner.torch_backend import TorchLearner, TorchLearnerSettings
from rstar2.rollout import vllm_compat
from rstar2.sync.native_sender import learner_weights, weight_metadata
from tests.helpers.learner_data import tiny_model

BUCKET = 1 << 16


@pytest.fixture(scope="module")
def learner(tmp_path_factory: pytest.TempPathFactory) -> TorchLearner:
    settings = TorchLearnerSettings(
        model_path=str(tiny_model(tmp_path_factory.mktemp("m") / "m")),
        optim=OptimConfig(),
        learner=TorchLearnerConfig(activation_checkpointing=False),
        device="cpu",
    )
    return TorchLearner(settings)


def test_the_wire_carries_the_engines_dtype_not_the_learners(learner: TorchLearner) -> None:
    meta = weight_metadata(learner, BUCKET, "bfloat16")
    assert {d for _, d, _, _ in meta} == {"bfloat16"}
    source = learner_weights(
        learner, meta, BUCKET, everywhere=False, device="cpu", dtype="bfloat16"
    )
    sent = dict(iter(source))
    assert [m[0] for m in meta] == list(sent)
    assert {t.dtype for t in sent.values()} == {torch.bfloat16}
    own = {n: t for bucket in learner.named_weights(BUCKET) for n, t in bucket}
    assert all(t.dtype == torch.float32 for t in own.values())  # the learner keeps fp32
    for name, tensor in sent.items():
        assert torch.equal(tensor, own[name].to(torch.bfloat16))
    declared = source.metadata if vllm_compat.cached_source_metadata() else source.metadata()
    (param,) = [m for m in declared if m.name == meta[0][0]]
    assert param.dtype == torch.bfloat16 and list(param.shape) == meta[0][2]


def test_a_pass_that_drifts_from_the_metadata_is_refused(learner: TorchLearner) -> None:
    meta = weight_metadata(learner, BUCKET, "bfloat16")
    fp32 = learner_weights(learner, meta, BUCKET, everywhere=False, device="cpu", dtype=None)
    with pytest.raises(RuntimeError, match="drifted from their metadata at tensor 0"):
        next(iter(fp32))
    short = learner_weights(learner, meta[:-1], BUCKET, False, "cpu", "bfloat16")
    with pytest.raises(RuntimeError, match="past its weight metadata"):
        for _ in short:
            pass
