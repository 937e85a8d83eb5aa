"""Durable folders: fsync a tree, seal it with a manifest, and check a seal later.

A sealed folder holds ``manifest.json``: every other file's path and size, written and fsynced
after them. :func:`check` finds a folder torn by a crash, a full disk or a partial copy (a
file missing, or of another size); it does not hash contents (a 14B checkpoint is ~170 GB).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path
from typing import ClassVar

from rstar2.errors import UserError

MANIFEST = "manifest.json"


class CheckpointError(UserError, RuntimeError):
    """A checkpoint could not be written, or none on disk can be read; the message says why."""

    kind: ClassVar[str] = "checkpoint error"
    exit_code: ClassVar[int] = 1


_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def fsync_tree(root: Path) -> None:
    """Flush every file and folder under ``root`` (``root`` included) to the disk."""
    for folder, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(folder))


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def seal(root: Path) -> None:
    """Fsync ``root``'s files, then write and fsync their manifest."""
    fsync_tree(root)
    sizes = {
        str(p.relative_to(root)): p.stat().st_size
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }
    path = root / MANIFEST
    with open(path, "w") as fh:
        json.dump({"files": sizes}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    fsync_dir(root)


def check(root: Path, sealed: bool = True) -> str | None:
    """Why ``root`` is torn, or None when it is whole. ``sealed``: it was written to be sealed
    (a missing manifest is then a tear; False only for folders from before manifests)."""
    path = root / MANIFEST
    if not path.is_file():
        return f"{MANIFEST} is missing" if sealed else None
    try:
        sizes = json.loads(path.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"unreadable {MANIFEST} ({exc})"
    for rel, size in sizes.items():
        file = root / rel
        if not file.is_file():
            return f"{rel} is missing"
        actual = file.stat().st_size
        if actual != size:
            return f"{rel} has {actual} bytes, {size} were written"
    return None


def tree_bytes(root: Path) -> int:
    """The bytes of every file under ``root`` (0 when it is missing)."""
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) if root.is_dir() else 0


def is_disk_full(exc: BaseException, partial: Path, expected_bytes: int) -> bool:
    """Whether a write into ``partial`` that raised ``exc`` ran out of disk or quota: an
    ENOSPC/EDQUOT anywhere in the error's chain (or in a torch.distributed.checkpoint failure's
    per-rank errors), or less room left than the rest of ``expected_bytes`` needs (torch's zip
    writer reports a full disk as a bare RuntimeError)."""
    stack: list[BaseException] = [exc]
    while stack:
        seen = stack.pop()
        if isinstance(seen, OSError) and seen.errno in _DISK_FULL:
            return True
        stack += [e for e in (seen.__cause__, seen.__context__) if e is not None]
        failures = getattr(seen, "failures", None)
        if isinstance(failures, dict):
            stack += [e for e in failures.values() if isinstance(e, BaseException)]
    try:
        free = shutil.disk_usage(partial.parent).free
    except OSError:
        return False
    return free < max(1 << 20, expected_bytes - tree_bytes(partial))
