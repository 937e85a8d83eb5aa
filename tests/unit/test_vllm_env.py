"""The environment vLLM engines are spawned with (rstar2.rollout.vllm_env), on real processes.

The engine-core and worker processes rename themselves (setproctitle), which overwrites what
/proc/<pid>/environ shows of them, so the inheritance is checked on a plain child here; what the
bound saves on a real engine is measured by ``python -m perf.engine_memory``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rstar2.rollout.vllm_env import CPU_ONEDNN_CACHE_ENTRIES, ONEDNN_CACHE_ENV, spawn_environment


def _child_sees() -> str:
    code = f"import os; print(os.environ.get({ONEDNN_CACHE_ENV!r}, 'unset'))"
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.fixture
def no_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ONEDNN_CACHE_ENV, raising=False)


def test_on_cpu_a_process_spawned_inside_gets_the_bound_and_ours_is_left_as_it_was(no_bound):
    with spawn_environment(on_cpu=True):
        assert _child_sees() == str(CPU_ONEDNN_CACHE_ENTRIES)
    assert ONEDNN_CACHE_ENV not in os.environ
    assert _child_sees() == "unset"


def test_a_bound_the_user_set_is_kept(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(ONEDNN_CACHE_ENV, "512")
    with spawn_environment(on_cpu=True):
        assert _child_sees() == "512"
    assert os.environ[ONEDNN_CACHE_ENV] == "512"


def test_off_cpu_nothing_is_set(no_bound):
    with spawn_environment(on_cpu=False):
        assert _child_sees() == "unset"


def test_what_the_spawner_writes_inside_is_undone_and_the_rest_kept(
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setenv("RSTAR2_TEST_KEPT", "before")
    monkeypatch.delenv("RSTAR2_TEST_ADDED", raising=False)
    with spawn_environment(on_cpu=False):  # as vLLM's CPU platform sets LD_PRELOAD
        os.environ["RSTAR2_TEST_ADDED"] = "x"
        os.environ["RSTAR2_TEST_KEPT"] = "changed"
    assert "RSTAR2_TEST_ADDED" not in os.environ
    assert os.environ["RSTAR2_TEST_KEPT"] == "before"
