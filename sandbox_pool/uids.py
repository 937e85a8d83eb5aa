"""Blocks of unprivileged uids, one per live sandbox pool on a host.

A pool drops each call to a uid of its own range. Two pools on one host (two runs, a server
beside an embedded pool, test workers) handing out the same uids would share the kernel's
per-uid process count, so a fork bomb in one would stop the other's calls from forking, and a
call could signal the other pool's processes. :func:`claim_uid_block` gives each pool a
disjoint block: block ``k`` starts at ``uid_base + k * UID_BLOCK``; a pool holds an ``flock``
on the block's lock file, in a directory only root can write, for as long as it runs (the
kernel lets go of it when the process ends, however it ends), and takes no block whose uids
still have live processes (a pool that just closed, or died, may leave some exiting).
"""

from __future__ import annotations

import fcntl
import logging
import os
import stat
from pathlib import Path

log = logging.getLogger(__name__)

UID_BLOCK = 200_000  # a pool's light image takes uid_base.., its heavy one uid_base + 100,000..
UID_BLOCKS = 64
LOCK_DIR = Path("/run/rstar2-sandbox-uids")


class UidBlocksExhausted(RuntimeError):
    """Every uid block of this host is held by a running pool (or still has processes)."""


def claim_uid_block(
    uid_base: int, *, blocks: int = UID_BLOCKS, lock_dir: Path = LOCK_DIR
) -> tuple[int, int | None]:
    """The first block at or after ``uid_base`` that no live pool holds and no live process
    runs as: its first uid and the open lock file descriptor that holds it (``os.close`` it
    to let the block go). Guarantees: while the descriptor is open, no other caller on this
    host (sharing ``lock_dir``) gets the same block. Where ``lock_dir`` cannot be used (no
    such writable, root-only directory): ``uid_base`` and None, unguarded, with a warning."""
    try:
        _own_directory(lock_dir)
    except OSError as exc:
        log.warning("sandbox uid blocks are not coordinated between pools here: %s", exc)
        return uid_base, None
    busy = _uids_with_processes(at_least=uid_base)
    for k in range(blocks):
        first = uid_base + k * UID_BLOCK
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(lock_dir / f"{first}.lock", flags, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        if any(first <= uid < first + UID_BLOCK for uid in busy):
            os.close(fd)
            continue
        return first, fd
    raise UidBlocksExhausted(
        f"all {blocks} sandbox uid blocks from uid {uid_base} are held by running pools on "
        f"this host or still have processes (lock files {lock_dir}/*.lock)"
    )


def _own_directory(path: Path) -> None:
    """``path`` exists as a directory of ours that nobody else can write (made if missing)."""
    path.mkdir(mode=0o700, exist_ok=True)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise PermissionError(f"{path} is not a directory only this user can write")


def _uids_with_processes(at_least: int) -> set[int]:
    """The uids from ``at_least`` up of this host's live processes (zombies hold nothing)."""
    uids = set()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                uid = entry.stat().st_uid
                if uid < at_least:
                    continue
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    state = f.read().rsplit(b")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state not in (b"Z", b"X"):
                uids.add(uid)
    return uids
