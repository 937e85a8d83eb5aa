"""Blocks of unprivileged uids, one per live sandbox pool on a host.

A pool drops each call to a uid of its own range. Two pools on one host (two runs, a server
beside an embedded pool, test workers) handing out the same uids would share the kernel's
per-uid process count, so a fork bomb in one would stop the other's calls from forking, and a
call could signal the other pool's processes. :func:`claim_uid_block` gives each pool a
disjoint block: block ``k`` starts at ``uid_base + k * UID_BLOCK``, and a pool holds an
``flock`` on the block's lock file for as long as it runs (the kernel lets go of it when the
process ends, however it ends).
"""

from __future__ import annotations

import fcntl
from pathlib import Path
from typing import IO

UID_BLOCK = 200_000  # a pool's light image takes uid_base.., its heavy one uid_base + 100,000..
UID_BLOCKS = 64
LOCK_DIR = Path("/tmp")


class UidBlocksExhausted(RuntimeError):
    """Every uid block of this host is held by a running pool."""


def claim_uid_block(
    uid_base: int, *, blocks: int = UID_BLOCKS, lock_dir: Path = LOCK_DIR
) -> tuple[int, IO[str] | None]:
    """The first block at or after ``uid_base`` that no live pool holds: its first uid and
    the open lock file that holds it (close it to let the block go). Guarantees: while the
    file is open, no other caller on this host (sharing ``lock_dir``) gets the same block.
    Where no lock file can be created in ``lock_dir``: ``uid_base`` and None, unguarded."""
    for k in range(blocks):
        first = uid_base + k * UID_BLOCK
        try:
            lock = open(lock_dir / f"rstar2-sandbox-uids-{first}.lock", "w")  # noqa: SIM115
        except OSError:  # nowhere to keep locks (a read-only /tmp): the one block, as before
            return uid_base, None
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            continue
        return first, lock
    raise UidBlocksExhausted(
        f"all {blocks} sandbox uid blocks from uid {uid_base} are held by running pools "
        f"on this host (lock files {lock_dir}/rstar2-sandbox-uids-*.lock)"
    )
