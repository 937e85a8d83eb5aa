"""Each sandbox pool on a host drops its calls to uids of its own block (sandbox_pool.uids):
the kernel's per-uid process limit one pool's fork bomb exhausts is not another pool's."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from sandbox_pool import Limits, PoolConfig, SandboxPool
from sandbox_pool.uids import UID_BLOCK, UidBlocksExhausted, claim_uid_block

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="per-call uids need root")


def test_live_claims_get_disjoint_blocks_and_a_closed_one_is_free_again(tmp_path: Path) -> None:
    first, a = claim_uid_block(1_000, blocks=3, lock_dir=tmp_path)
    second, b = claim_uid_block(1_000, blocks=3, lock_dir=tmp_path)
    third, c = claim_uid_block(1_000, blocks=3, lock_dir=tmp_path)
    assert (first, second, third) == (1_000, 1_000 + UID_BLOCK, 1_000 + 2 * UID_BLOCK)
    with pytest.raises(UidBlocksExhausted, match="all 3 sandbox uid blocks from uid 1000"):
        claim_uid_block(1_000, blocks=3, lock_dir=tmp_path)
    assert b is not None
    os.close(b)
    again, d = claim_uid_block(1_000, blocks=3, lock_dir=tmp_path)
    assert again == second
    for fd in (a, c, d):
        assert fd is not None
        os.close(fd)


def test_a_lock_directory_others_can_write_is_not_used(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # anyone could plant or hold its lock files: uncoordinated, as before
    assert claim_uid_block(1_000, lock_dir=shared) == (1_000, None)


@needs_root
def test_a_block_whose_uids_still_run_processes_is_skipped(tmp_path: Path) -> None:
    """A pool that just closed (or died) may leave processes exiting: their uids' process
    counts are not yet free, so the next pool takes another block."""
    lingering = subprocess.Popen(["sleep", "60"], user=1_005)
    try:
        first, fd = claim_uid_block(1_000, lock_dir=tmp_path)
        assert first == 1_000 + UID_BLOCK
        assert fd is not None
        os.close(fd)
    finally:
        lingering.kill()
        lingering.wait()
    first, fd = claim_uid_block(1_000, lock_dir=tmp_path)
    assert first == 1_000 and fd is not None
    os.close(fd)


def _processes_by_uid(uids: range) -> Counter[int]:
    """Live (not zombie) processes on this host per uid in ``uids``."""
    counts: Counter[int] = Counter()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            uid = entry.stat().st_uid
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if uid in uids and state not in ("Z", "X"):
            counts[uid] += 1
    return counts


@needs_root
async def test_a_fork_bomb_in_one_pool_leaves_another_pools_calls_able_to_fork() -> None:
    """Pool A's call forks until the kernel refuses (its uid at the pool's process limit) and
    holds its children; pool B, started after it on the same uid base, runs a call that
    forks while they live."""
    limits = Limits(timeout_s=60.0, max_processes=8)
    bomb = (
        "import os, time\n"
        "while True:\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(120)\n"
        "            os._exit(0)\n"
        "    except OSError:\n"
        "        break\n"
        "time.sleep(120)\n"
    )
    forks = (
        "import os\n"
        "pids = [os.fork() or os._exit(0) for _ in range(4)]\n"
        "print('forked', sum(os.waitpid(p, 0)[1] == 0 for p in pids))\n"
    )
    async with (
        SandboxPool(PoolConfig(num_workers=1, limits=limits)) as a,
        SandboxPool(PoolConfig(num_workers=1, limits=limits)) as b,
    ):
        a_uids = _uid_range(a)
        b_uids = _uid_range(b)
        assert a_uids.stop <= b_uids.start or b_uids.stop <= a_uids.start, (a_uids, b_uids)
        held = asyncio.create_task(a.run(bomb))
        deadline = time.monotonic() + 60  # generous: a loaded machine forks slowly
        while not (full := [u for u, n in _processes_by_uid(a_uids).items() if n >= 8]):
            assert time.monotonic() < deadline and not held.done(), "the bomb never filled"
            await asyncio.sleep(0.05)
        r = await b.run(forks)
        assert r.status == "ok" and r.stdout == "forked 4\n", r
        assert _processes_by_uid(a_uids)[full[0]] >= 8  # A's call still held its quota
        for pid in _pids_of_uid(full[0]):  # end A's call now rather than at its deadline
            with contextlib.suppress(ProcessLookupError):  # gone with its namespace's PID 1
                os.kill(pid, signal.SIGKILL)
        await held


def _uid_range(pool: SandboxPool) -> range:
    """The uids the pool's zygotes hand out (both images)."""
    base = pool._zygotes["light"].config.uid_base
    assert base is not None
    return range(base, base + UID_BLOCK)


def _pids_of_uid(uid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


@needs_root
async def test_a_pool_that_fails_to_start_stops_its_zygotes_and_lets_its_block_go() -> None:
    base = 20_000_000  # past the default pools' blocks: free again only if this pool let it go
    pool = SandboxPool(PoolConfig(num_workers=1, uid_base=base, startup_timeout_s=1e-4))
    with pytest.raises(TimeoutError):
        await pool.start()
    assert all(z._proc is None or z._proc.returncode is not None for z in pool._zygotes.values())
    deadline = time.monotonic() + 30  # a child that had taken one of its uids may still exit
    while True:
        try:
            first, fd = claim_uid_block(base, blocks=1)
            break
        except UidBlocksExhausted:
            assert time.monotonic() < deadline, "the failed pool still holds its uid block"
            await asyncio.sleep(0.1)
    assert first == base and fd is not None
    os.close(fd)
