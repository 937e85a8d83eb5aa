"""sandbox_pool: isolated, warm, millisecond Python tool execution (embedded, HTTP, Redis).

What a call can and cannot do (service running as root on Linux, the default deployment):
- It runs in a fresh process forked from a warm zygote, never reused, as an unprivileged uid of
  its own (no supplementary groups, no-new-privileges), in its own session and process group,
  and as PID 1 of its own PID namespace: when it ends, the kernel kills everything it started
  (fork bombs, daemons, setsid escapes included); it cannot see or signal the server.
- Limits it cannot raise (soft = hard, no privileges): CPU seconds, address space, processes,
  file size, open files; no core dumps. The wall-clock timeout is enforced from outside by
  SIGKILL of the process group.
- Network: an empty network namespace (loopback down): every connect fails. Children running at
  the same moment share that namespace, so in principle two calls could talk over an abstract
  Unix socket; they cannot reach anything else.
- Files: the host's /tmp, /var/tmp, /dev/shm and /run/lock are replaced by a private tmpfs; the
  call's cwd is its own temp dir; everything it writes there is deleted after the call. The rest
  of the file system is visible read-only by Unix permissions (as for any unprivileged user);
  directories the uid could not traverse on the way to Python (e.g. /root of a pyenv install)
  are replaced by an empty tmpfs with only the Python installation bound back.
- Environment: scrubbed (PATH, HOME, LANG, thread counts only); /proc shows only its own
  processes (hidepid=2), so the server's environment and command lines are invisible.
Not isolated: CPU time and memory bandwidth are shared (no cgroups); kernel attack surface is
the host's (no seccomp filter). Without root (or where namespaces are unavailable) the service
still runs, with resource limits, a scrubbed environment and its own temp dir per call, but
without the uid, PID, mount and network separation; the zygote logs what it could not apply.

The names below are imported lazily, so that the zygote (``python -m sandbox_pool.zygote``)
stays small: its memory is what every fork copies.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "ClientConfig": "sandbox_pool.client",
    "SandboxClient": "sandbox_pool.client",
    "PoolBusy": "sandbox_pool.pool",
    "PoolClosed": "sandbox_pool.pool",
    "PoolConfig": "sandbox_pool.pool",
    "SandboxPool": "sandbox_pool.pool",
    "ExecRequest": "sandbox_pool.protocol",
    "ExecResult": "sandbox_pool.protocol",
    "Limits": "sandbox_pool.protocol",
}

if TYPE_CHECKING:
    from sandbox_pool.client import ClientConfig as ClientConfig
    from sandbox_pool.client import SandboxClient as SandboxClient
    from sandbox_pool.pool import PoolBusy as PoolBusy
    from sandbox_pool.pool import PoolClosed as PoolClosed
    from sandbox_pool.pool import PoolConfig as PoolConfig
    from sandbox_pool.pool import SandboxPool as SandboxPool
    from sandbox_pool.protocol import ExecRequest as ExecRequest
    from sandbox_pool.protocol import ExecResult as ExecResult
    from sandbox_pool.protocol import Limits as Limits


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'sandbox_pool' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)


__all__ = sorted(_EXPORTS)
