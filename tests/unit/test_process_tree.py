"""perf.process_tree: a run's process tree and its memory per kind of process, on real
processes."""

from __future__ import annotations

import subprocess
import sys

import psutil

from perf.process_tree import KIND_ORDER, process_kind, pss_by_kind

CHILD = "import time; print('ready', flush=True); time.sleep(60)"


def test_processes_are_told_apart_by_name_and_command_line() -> None:
    assert process_kind("VLLM::Worker", "") == "vllm_worker"
    assert process_kind("VLLM::EngineCore", "") == "engine_core"
    assert process_kind("python", "python -m sandbox_pool.zygote --workers 8") == "sandbox"
    assert process_kind("python", "python -m rstar2.reward.host_entry 80 8") == "reward_host"
    assert process_kind("raylet", "raylet --node") == "other"


def test_memory_is_split_by_the_kind_of_process() -> None:
    # the root counts as the trainer, its child (whose command line names the sandbox) as the
    # sandbox; the child says when its interpreter is up, so the sample sees a whole one
    root = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time; "
         f"subprocess.Popen([sys.executable, '-c', {CHILD!r}, 'sandbox_pool.zygote']); "
         "time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert root.stdout is not None and root.stdout.readline() == "ready\n"
        split = pss_by_kind(root.pid)
        assert list(split) == list(KIND_ORDER)
        assert split["trainer"] > 1 and split["sandbox"] > 1  # MiB: each a Python interpreter
        assert all(split[k] == 0 for k in ("vllm_worker", "engine_core", "reward_host"))
    finally:
        for child in psutil.Process(root.pid).children(recursive=True):
            child.kill()
        root.kill()
        root.wait()
    assert pss_by_kind(root.pid) == dict.fromkeys(KIND_ORDER, 0.0)  # gone: nothing, no error
