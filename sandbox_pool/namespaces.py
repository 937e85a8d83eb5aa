"""Reusable per-call namespaces: a network namespace and a mount namespace with a private /tmp.

Creating both for every call (and tearing them down after it) was measured at ~0.55 ms of CPU
per call on a 2-core VM, a sixth of a trivial call's total; entering existing ones costs
~0.02 ms. So the zygote keeps a stock of :class:`CallNamespaces`, hands each to one child at a
time, and resets it once every process of that call has ended (the child is PID 1 of its own
PID namespace: when the zygote has reaped it, nothing of the call runs any more):
- network: nothing to reset. Loopback is down and unprivileged processes cannot change the
  namespace (no CAP_NET_ADMIN there); sockets die with their processes.
- mount: the call ran as an unprivileged uid, so it could not mount or unmount anything; what it
  left is files in its /tmp (also its /dev/shm), which :meth:`CallNamespaces.reset` deletes,
  leaving the bound-back Python directories untouched. A /tmp holding more than
  ``max_entries`` entries is not walked: the namespace is dropped and a fresh one made.
Calls never share a namespace at the same time, and a call never sees another call's files.
What a reused tmpfs does let a call learn is how many inodes the calls before it created
(tmpfs numbers inodes in sequence) and when /tmp was last emptied: a counter, not content.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Callable
from dataclasses import dataclass

from sandbox_pool import isolation

CLONE_NEWNET = isolation.CLONE_NEWNET
CLONE_NEWNS = isolation.CLONE_NEWNS
_libc = isolation._libc


class _TooMany(Exception):
    """More entries than a reset walks."""


@dataclass
class CallNamespaces:
    """One call slot's namespaces, held open by descriptors of the zygote."""

    net_fd: int
    mnt_fd: int
    tmp_fd: int  # the slot's /tmp (a directory fd), through which the zygote resets it
    tmp_dev: int  # st_dev of that tmpfs: a directory on another device is a bound-back mount

    @classmethod
    def create(cls, keeps: tuple[str, ...], tmp_size_mb: int) -> CallNamespaces:
        """New namespaces; the caller (single-threaded, root) stays in its own.

        The mount namespace is a copy of the caller's with a fresh tmpfs of ``tmp_size_mb`` on
        /tmp (``keeps`` bound back into it) and bound over /dev/shm
        (:func:`isolation.private_tmp`). Raises OSError when a namespace cannot be made.
        """
        tmp: list[int] = []

        def set_up_tmp() -> None:
            isolation.private_tmp(keeps, tmp_size_mb)
            tmp.append(os.open("/tmp", os.O_RDONLY | os.O_DIRECTORY))

        net_fd = _unshared(CLONE_NEWNET, "net", lambda: None)
        try:
            mnt_fd = _unshared(CLONE_NEWNS, "mnt", set_up_tmp)
        except BaseException:
            os.close(net_fd)
            raise
        return cls(net_fd=net_fd, mnt_fd=mnt_fd, tmp_fd=tmp[0], tmp_dev=os.fstat(tmp[0]).st_dev)

    def enter(self) -> None:
        """In a fresh child (still root, single-threaded): join both namespaces. The mount
        namespace's root becomes the child's root and cwd."""
        for fd, kind, name in (
            (self.net_fd, CLONE_NEWNET, "network"),
            (self.mnt_fd, CLONE_NEWNS, "mount"),
        ):
            if _libc.setns(fd, kind) != 0:
                raise OSError(ctypes.get_errno(), f"setns into the call's {name} namespace failed")

    def reset(self, max_entries: int = 4096) -> bool:
        """Delete everything the last call left in /tmp; False if the slot must be dropped
        instead (more than ``max_entries`` entries, or an entry that could not be removed)."""
        try:
            _wipe(self.tmp_fd, self.tmp_dev, [max_entries])
        except Exception:  # _TooMany, OSError, RecursionError (a tree deeper than the stack)
            return False
        return True

    def close(self) -> None:
        for fd in (self.net_fd, self.mnt_fd, self.tmp_fd):
            with contextlib.suppress(OSError):
                os.close(fd)


def _unshared(kind: int, name: str, set_up: Callable[[], None]) -> int:
    """unshare(kind), run ``set_up`` inside, return a descriptor on the new namespace, and go
    back to the caller's own."""
    home = os.open(f"/proc/self/ns/{name}", os.O_RDONLY)
    try:
        if _libc.unshare(kind) != 0:
            raise OSError(ctypes.get_errno(), f"unshare of a {name} namespace failed")
        try:
            set_up()
            return os.open(f"/proc/self/ns/{name}", os.O_RDONLY)
        finally:
            if _libc.setns(home, kind) != 0:  # cannot happen as root; never serve from inside
                os._exit(70)
    finally:
        os.close(home)


def _wipe(dir_fd: int, dev: int, budget: list[int]) -> None:
    """Remove every entry under ``dir_fd`` that lives on device ``dev``, but never descend into
    a directory on another device (a bound-back Python directory) or remove the directories
    leading to one. ``budget[0]`` entries at most, else _TooMany; OSError when one stays."""
    entries = []
    with os.scandir(dir_fd) as it:
        for entry in it:  # counted as read: a huge directory is never listed whole
            budget[0] -= 1
            if budget[0] < 0:
                raise _TooMany
            entries.append(entry)
    for entry in entries:
        st = entry.stat(follow_symlinks=False)
        if st.st_dev != dev:
            continue  # a mount point: bound back, not the call's
        if entry.is_dir(follow_symlinks=False):
            sub = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
            try:
                _wipe(sub, dev, budget)
            finally:
                os.close(sub)
            try:
                os.rmdir(entry.name, dir_fd=dir_fd)
            except OSError:
                if not _holds_mount(dir_fd, entry.name, dev):
                    raise
        else:
            os.unlink(entry.name, dir_fd=dir_fd)


def _holds_mount(dir_fd: int, name: str, dev: int) -> bool:
    """Whether directory ``name`` (emptied but for mounts) leads to a mount point."""
    sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
    try:
        with os.scandir(sub) as it:
            for entry in it:
                st = entry.stat(follow_symlinks=False)
                if st.st_dev != dev or (
                    entry.is_dir(follow_symlinks=False) and _holds_mount(sub, entry.name, dev)
                ):
                    return True
        return False
    finally:
        os.close(sub)
