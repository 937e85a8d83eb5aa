"""sandbox_pool: isolated, warm, millisecond Python tool execution (embedded, HTTP, Redis).

A call runs as ``python3 -u main.py`` would (real stdin/stdout/stderr descriptors, argv, exit
codes, output kept through crashes, ``os._exit`` and timeouts; see :mod:`sandbox_pool.runner`),
and the code-judge API is served as code-judge serves it (:mod:`sandbox_pool.codejudge`).

What a call can and cannot do (service running as root on Linux, the default deployment):
- It runs in a fresh process forked from a warm zygote, never reused, as an unprivileged uid of
  its own (no supplementary groups, no-new-privileges; no other pool on the host hands out the
  same uids: :mod:`sandbox_pool.uids`), in its own session and process group,
  and as PID 1 of its own PID namespace: when it ends, the kernel kills everything it started
  (fork bombs, daemons, setsid escapes included); it cannot see or signal the server.
- Limits it cannot raise (soft = hard, no privileges): CPU seconds, address space, processes,
  file size, open files; no core dumps. The wall-clock timeout is enforced from outside by
  SIGKILL of the process group.
- Network: a network namespace of its own whose only device, loopback, is down: every connect
  fails, and no two calls running at the same moment share one (so not an abstract Unix socket
  either). The namespaces are reused, one call at a time, after every process of a call ended.
- Files and IPC: /tmp and /dev/shm are a tmpfs no other running call sees, emptied before the
  next call that uses it (:mod:`sandbox_pool.namespaces`); /var/tmp and
  /run/lock are empty and read-only; its cwd is a temp dir in its /tmp; SysV IPC is its own
  (IPC namespace). The rest of the file system is visible read-only by Unix permissions (as for
  any unprivileged user). Directories the uid could not traverse on the way to Python (e.g.
  /root of a pyenv install) are replaced by an empty tmpfs with only the Python directories
  bound back, read-only; so are Python directories under /tmp (a checkout, an editable
  install): packages the host Python can import are importable in a call, nothing else there is
  visible, and no call can change what the next one imports.
- Environment: scrubbed (PATH, HOME, LANG, thread counts only); /proc shows only its own
  processes (hidepid=2), so the server's environment and command lines are invisible.
- Kernel keyrings (state that outlives a uid's processes): ``add_key``, ``request_key`` and
  ``keyctl`` fail with EPERM (a seccomp filter, :mod:`sandbox_pool.seccomp`).
Not isolated: CPU time and memory bandwidth are shared (no cgroups); kernel attack surface is
the host's but for keyrings (no broader seccomp profile). A reused /tmp tells a call how many
inodes the calls before it created (a counter, not content).

Fails closed: where a layer cannot be applied (not root, no namespaces, Python's path on /tmp
itself, a chrooted service whose calls' namespaces would leave the chroot), :class:`SandboxPool`
``start()`` raises ``IsolationUnavailable`` naming it, and ``sandbox-pool serve`` / ``worker``
refuse to start with that one line, unless weak isolation is accepted explicitly
(``allow_weak_isolation`` / ``--unsafe-weak-isolation``): then calls run with limits, a scrubbed
environment and a temp dir each, but may see the host's /tmp and each other.

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
