"""The embedded pool, one test per isolation promise (see sandbox_pool's module docstring)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from sandbox_pool import ExecRequest, Limits, PoolBusy, PoolClosed, PoolConfig, SandboxPool
from sandbox_pool.images import image_for

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="uid/namespace isolation needs root")


@pytest.fixture
async def pool():
    cfg = PoolConfig(num_workers=2, limits=Limits(timeout_s=2.0, memory_mb=256))
    async with SandboxPool(cfg) as p:
        yield p


async def _still_serves(p: SandboxPool) -> None:
    start = time.perf_counter()
    result = await p.run("print(6 * 7)")
    assert result.stdout == "42\n", result
    # promptly: under the pool's 2 s call timeout a call stuck behind a dead worker would wait
    assert time.perf_counter() - start < 1.5


async def test_basic_call_and_ipython_style(pool):
    r = await pool.run("import math\nmath.factorial(5)")
    assert (r.status, r.stdout, r.exit_code) == ("ok", "120\n", 0)
    r = await pool.run("print(input()[::-1])", stdin="abc")
    assert r.stdout == "cba\n"


async def test_heavy_image_has_sympy(pool):
    code = "import sympy as sp\nx = sp.symbols('x')\nsp.solve(x**2 - 4, x)"
    assert image_for(code) == "heavy"
    r = await pool.run(code)
    assert r.status == "ok" and r.stdout == "[-2, 2]\n"


async def test_loop_is_killed_at_the_timeout(pool):
    start = time.perf_counter()
    r = await pool.run("while True:\n    pass", timeout_s=0.5)
    assert r.status == "timeout"
    assert time.perf_counter() - start < 2.0
    await _still_serves(pool)


async def test_memory_cap_holds(pool):
    r = await pool.run("x = bytearray(600 * 1024 * 1024)\nprint(len(x))")
    assert r.status == "memory", r
    await _still_serves(pool)


async def test_raising_own_rlimits_does_not_help(pool):
    code = (
        "import resource\n"
        "for lim in (resource.RLIMIT_AS, resource.RLIMIT_CPU, resource.RLIMIT_NPROC,\n"
        "            resource.RLIMIT_CORE, resource.RLIMIT_FSIZE, resource.RLIMIT_NOFILE):\n"
        "    soft, hard = resource.getrlimit(lim)\n"
        "    try:\n"
        "        resource.setrlimit(lim, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))\n"
        "        print('raised', lim)\n"
        "    except (ValueError, OSError):\n"
        "        resource.setrlimit(lim, (hard, hard))\n"
        "print('core', resource.getrlimit(resource.RLIMIT_CORE))\n"
        "x = bytearray(600 * 1024 * 1024)\n"
        "print('allocated')\n"
    )
    r = await pool.run(code)
    assert "raised" not in r.stdout and "allocated" not in r.stdout
    assert "core (0, 0)" in r.stdout  # no core dumps, and no way back to them
    assert r.status == "memory"
    r = await pool.run(
        code.replace("x = bytearray(600 * 1024 * 1024)", "while True: pass"), timeout_s=1.0
    )
    assert r.status == "timeout"
    await _still_serves(pool)


@needs_root
async def test_fork_bomb_is_contained(pool):
    code = (
        "import os\n"
        "n = 0\n"
        "try:\n"
        "    while True:\n"
        "        if os.fork() == 0:\n"
        "            while True: pass\n"
        "        n += 1\n"
        "except OSError:\n"
        "    print('forks refused after', n)\n"
    )
    r = await pool.run(
        code.replace("import os\n", "import os\nprint(os.getuid())\n"), timeout_s=1.0
    )
    assert "forks refused after" in r.stdout
    uid_line, refused_line = r.stdout.splitlines()
    assert int(refused_line.split()[-1]) < 20
    await _still_serves(pool)
    # every process the call started is gone (polled: the kill is asynchronous, and a loaded
    # machine runs it late)
    deadline = time.monotonic() + 15
    while _processes_of_uid(int(uid_line)) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert _processes_of_uid(int(uid_line)) == 0


def _processes_of_uid(uid: int) -> int:
    """Live processes of ``uid``: a zombie (killed, waiting for its parent or for init to reap
    it, which can take a while on a loaded machine) holds nothing and is not counted."""
    count = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                    count += state not in ("Z", "X")
            except (OSError, IndexError):
                pass
    return count


async def test_output_is_capped(pool):
    r = await pool.run("while True:\n    print('x' * 1000)")
    assert r.status == "output_limit"
    assert len(r.stdout) == Limits().max_output_chars
    await _still_serves(pool)


async def test_server_secrets_are_invisible(pool, monkeypatch):
    monkeypatch.setenv("RSTAR2_TEST_SECRET", "hunter2")
    code = (
        "import os, glob\n"
        "seen = 'hunter2' in str(dict(os.environ))\n"
        "for path in glob.glob('/proc/*/environ'):\n"
        "    try:\n"
        "        seen = seen or b'hunter2' in open(path, 'rb').read()\n"
        "    except OSError:\n"
        "        pass\n"
        "print(seen)\n"
    )
    async with SandboxPool(PoolConfig(num_workers=1)) as fresh:  # started with the secret set
        r = await fresh.run(code)
    assert r.stdout == "False\n", r


@needs_root
async def test_network_connect_fails(pool):
    code = (
        "import socket\n"
        "for host in ('127.0.0.1', '10.0.0.1'):\n"
        "    try:\n"
        "        socket.create_connection((host, 80), timeout=0.5)\n"
        "        print('connected', host)\n"
        "    except OSError as e:\n"
        "        print('refused', e.errno)\n"
    )
    r = await pool.run(code)
    assert "connected" not in r.stdout and r.stdout.count("refused") == 2


@needs_root
async def test_writes_stay_in_the_temp_dir_and_vanish(pool, tmp_path):
    host_marker = Path("/tmp") / f"rstar2-sandbox-escape-{os.getpid()}"
    code = (
        "import os\n"
        "open('here.txt', 'w').write('x')\n"
        f"open('{host_marker}', 'w').write('x')\n"
        "open('/dev/shm/shm-marker', 'w').write('x')\n"
        "ok = []\n"
        f"for p in ('/etc/rstar2-test', '/work/rstar2-test', '{tmp_path}/x', '/var/tmp/x',"
        " '/run/lock/x'):\n"
        "    try:\n"
        "        open(p, 'w').write('x'); ok.append(p)\n"
        "    except OSError:\n"
        "        pass\n"
        "print(os.getcwd(), sorted(os.listdir('.')), ok)\n"
    )
    r = await pool.run(code)
    assert r.status == "ok", r
    cwd = r.stdout.split()[0]
    assert "'here.txt'" in r.stdout and r.stdout.rstrip().endswith("[]")
    assert not host_marker.exists()  # /tmp inside is a private tmpfs
    # the next call has a /tmp of its own: nothing of the last one is there
    probe = (
        f"import os\nprint(os.path.exists('{host_marker}'), os.listdir('{cwd}'), "
        "os.path.exists('/dev/shm/shm-marker'))"
    )
    assert (await pool.run(probe)).stdout == "False ['main.py'] False\n"


@needs_root
async def test_a_reused_tmp_holds_nothing_of_the_calls_before(pool):
    """Calls reuse each other's namespaces one at a time (more calls than slots: the same
    tmpfs device comes back), and each finds nothing in /tmp or /dev/shm that a call wrote."""
    code = (
        "import json, os\n"
        "seen = os.listdir('/tmp') + os.listdir('/dev/shm')\n"
        "os.makedirs('/tmp/a/b/c'); open('/tmp/a/b/c/f', 'w').write('x')\n"
        "open('/dev/shm/m', 'w').write('x'); os.symlink('/etc/passwd', '/tmp/link')\n"
        "for i in range(50):\n"
        "    open(f'/tmp/f{i}', 'w').write('x')\n"
        "print(json.dumps([os.stat('/tmp').st_dev, seen]))\n"
    )
    written = {"a", "m", "link", *(f"f{i}" for i in range(50))}

    async def run_and_check() -> int:
        r = await pool.run(code)
        assert r.status == "ok", r
        dev, seen = json.loads(r.stdout)
        assert "sandbox-call" in seen and not written & set(seen), seen
        return int(dev)

    zygote = pool._zygotes["light"]._proc  # resets happen in it: it must never die of one
    devices = [await run_and_check() for _ in range(12)]
    assert len(set(devices)) < len(devices)  # a namespace was reused
    # a /tmp with more entries than a reset walks is dropped, not reused
    many = "for i in range(5000):\n    open(f'/tmp/g{i}', 'w').close()\nprint('ok')"
    assert (await pool.run(many)).stdout == "ok\n"
    deep = "import os\nos.chdir('/tmp')\nfor i in range(3000):\n    os.mkdir('d')\n"
    deep += "    os.chdir('d')\nprint('ok')"
    assert (await pool.run(deep)).stdout == "ok\n"
    for _ in range(6):
        await run_and_check()
    assert pool._zygotes["light"]._proc is zygote and zygote.returncode is None


@needs_root
async def test_two_concurrent_calls_cannot_reach_each_other():
    """A binds an abstract Unix socket, writes /tmp and /dev/shm files and a SysV shared memory
    segment, then stays alive; B, running at the same moment, tries every one of them and
    looks for A's processes. The time stamps prove that B tried while A held them (seconds of
    overlap: on a loaded machine one call may start well after the other)."""
    owner = (
        "import ctypes, os, socket, time\n"
        "s = socket.socket(socket.AF_UNIX); s.bind('\\0rstar2-a'); s.listen()\n"
        "open('/tmp/a-file', 'w').write('secret'); open('/dev/shm/a-shm', 'w').write('s')\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print('shm', libc.shmget(0x5A5A, 4096, 0o1666) >= 0)\n"
        "print('ready', time.time(), flush=True)\n"
        "time.sleep(3.5)\n"
        "print('end', time.time())\n"
    )
    prober = (
        "import ctypes, os, socket, time\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "me = os.getuid(); seen = set(); t0 = time.time()\n"
        "while time.time() - t0 < 3.0:\n"
        "    c = socket.socket(socket.AF_UNIX)\n"
        "    try:\n"
        "        c.connect('\\0rstar2-a'); seen.add('socket')\n"
        "    except OSError:\n"
        "        pass\n"
        "    c.close()\n"
        "    for f in ('/tmp/a-file', '/dev/shm/a-shm'):\n"
        "        if os.path.exists(f): seen.add(f)\n"
        "    if libc.shmget(0x5A5A, 0, 0) >= 0: seen.add('sysv-shm')\n"
        "    for pid in os.listdir('/proc'):\n"
        "        if pid.isdigit():\n"
        "            try:\n"
        "                if os.stat(f'/proc/{pid}').st_uid != me: seen.add('process')\n"
        "            except OSError:\n"
        "                pass\n"
        "    print('try', time.time())\n"
        "    time.sleep(0.05)\n"
        "print('seen', sorted(seen))\n"
    )
    cfg = PoolConfig(num_workers=2, limits=Limits(timeout_s=8.0, memory_mb=256))
    async with SandboxPool(cfg) as pool:
        a_task = asyncio.create_task(pool.run(owner))
        b = await pool.run(prober)
        a = await a_task
    assert a.status == "ok" and "shm True" in a.stdout, a
    ready = float(a.stdout.split("ready ")[1].split()[0])
    end = float(a.stdout.split("end ")[1].split()[0])
    tries = [float(line.split()[1]) for line in b.stdout.splitlines() if line.startswith("try")]
    assert any(ready <= t <= end for t in tries), (a.stdout, b.stdout)
    assert b.stdout.rstrip().endswith("seen []"), b.stdout


@needs_root
async def test_child_cannot_signal_the_server(pool):
    code = (
        f"import os, signal\n"
        f"try:\n"
        f"    os.kill({os.getpid()}, signal.SIGKILL)\n"
        f"    print('sent')\n"
        f"except OSError as e:\n"
        f"    print('denied', e.errno)\n"
        f"print(os.getpid(), os.getuid())\n"
        f"print(os.getgroups(), os.getpgrp() == os.getsid(0) == 1)\n"
        f"print([l for l in open('/proc/self/status') if l.startswith('NoNewPrivs')])\n"
    )
    r = await pool.run(code)
    assert "sent" not in r.stdout
    _, ids, groups, nnp = r.stdout.split("\n")[:4]
    pid, uid = ids.split()
    assert pid == "1" and int(uid) >= 1_500_000
    assert groups == "[] True"  # no supplementary groups; its own session and process group
    assert nnp == "['NoNewPrivs:\\t1\\n']"
    await _still_serves(pool)


async def test_processes_the_snippet_forks_end_without_ending_the_call(pool):
    """As under ``python3 main.py``: a forked child's sys.exit, exception or os._exit is its
    own exit status, and the call ends with its own process's output and exit code."""
    code = (
        "import os, sys\n"
        "def child(how):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        if how == 'exit':\n"
        "            sys.exit(3)\n"
        "        if how == 'raise':\n"
        "            raise ValueError('in the child')\n"
        "        os._exit(4)\n"
        "    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])\n"
        "print([child(how) for how in ('exit', 'raise', '_exit')])\n"
        "import multiprocessing\n"
        "with multiprocessing.get_context('fork').Pool(2) as workers:\n"
        "    print(workers.map(abs, [-1, -2, -3]))\n"
        "sys.exit(5)\n"
    )
    r = await pool.run(code)
    assert (r.status, r.exit_code, r.stdout) == ("error", 5, "[3, 1, 4]\n[1, 2, 3]\n"), r
    assert "ValueError at line 8: in the child" in r.stderr, r


async def test_each_call_gets_a_fresh_process(pool):
    await pool.run("import math\nmath.leaked = 1\nopen('left-behind', 'w').write('x')")
    r = await pool.run("import math, os\nprint(hasattr(math, 'leaked'), os.listdir('.'))")
    assert r.stdout == "False ['main.py']\n", r


@needs_root
@pytest.mark.skipif(
    not sys.base_prefix.startswith("/root/") or os.stat("/root").st_mode & 0o001,
    reason="Python is not under an untraversable /root here",
)
async def test_a_hidden_home_shows_only_the_python_install(pool):
    """/root (mode 700) holds the pyenv Python: a call sees only the path to it, nothing else."""
    hidden = sorted(p.name for p in Path("/root").iterdir())
    code = "import os\nprint(sorted(os.listdir('/root')))"
    r = await pool.run(code)
    visible = eval(r.stdout)
    assert visible and set(visible) < set(hidden), (visible, hidden)
    assert all(sys.base_prefix.startswith(f"/root/{name}") for name in visible)


async def test_concurrency_64_has_no_failures(pool):
    results = await pool.run_batch([ExecRequest(code=f"print({i} * 2)") for i in range(64)])
    assert [r.stdout for r in results] == [f"{i * 2}\n" for i in range(64)]


async def test_busy_and_closed_are_clear_errors():
    p = SandboxPool(PoolConfig(num_workers=1, max_queued=1))
    await p.start()
    slow = [asyncio.create_task(p.run("import time; time.sleep(0.3)")) for _ in range(2)]
    await asyncio.sleep(0.05)
    with pytest.raises(PoolBusy):
        await p.run("print(1)")
    assert all(r.status == "ok" for r in await asyncio.gather(*slow))
    await p.aclose()
    with pytest.raises(PoolClosed):
        await p.run("print(1)")


async def test_graceful_close_finishes_in_flight_calls():
    p = SandboxPool(PoolConfig(num_workers=2))
    await p.start()
    task = asyncio.create_task(p.run("import time; time.sleep(0.3); print('done')"))
    await asyncio.sleep(0.05)
    await p.aclose()
    assert (await task).stdout == "done\n"


async def test_the_stock_of_ready_children_refills_after_a_burst():
    """A refill that ran short of uids (each held by a child still dying) completes once they
    are reaped: the pool gets back to its full stock, not to whatever the last batch made."""
    async with SandboxPool(PoolConfig(num_workers=16)) as pool:
        for _ in range(3):
            results = await asyncio.gather(*(pool.run("print(1)") for _ in range(200)))
            assert all(r.stdout == "1\n" for r in results)
            full = {name: z.config.num_children for name, z in pool._zygotes.items()}
            deadline = time.monotonic() + 60  # generous: children are reaped at idle priority
            while pool.status()["ready"] != full and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert pool.status()["ready"] == full


async def test_ready_children_killed_from_outside_cost_a_call_nothing(pool):
    """A ready child SIGKILLed before it gets a call (an operator, the OOM killer, its zygote
    gone) has run nothing: the call takes another child rather than answer internal_error."""
    await pool.wait_warm()
    zygote = pool._zygotes[image_for("print(1)", "python")]
    dead = [child.pid for child in list(zygote.ready._queue)]
    assert dead
    for pid in dead:
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in dead):
        assert time.monotonic() < deadline, "the killed children did not exit"
        await asyncio.sleep(0.02)
    results = await asyncio.gather(*(pool.run(f"print({i})") for i in range(4)))
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(4)], results
    assert pool.vanished >= 1


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


async def test_kernel_keyrings_are_denied(pool):
    """A uid's keyrings outlive its processes and uids are reused: calls get EPERM for them."""
    import platform

    from sandbox_pool.seccomp import _ARCHES

    if platform.machine() not in _ARCHES:
        pytest.skip(f"no filter for {platform.machine()}")
    add_key, _request_key, keyctl = _ARCHES[platform.machine()][1]
    code = (
        "import ctypes, subprocess\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        f"r = libc.syscall({add_key}, b'user', b'k', b'secret', 6, ctypes.c_long(-4))\n"
        "e = ctypes.get_errno()\n"
        f"r2 = libc.syscall({keyctl}, 0, ctypes.c_long(-4), 0)\n"
        "print(r, e, r2, ctypes.get_errno())\n"
        "print(subprocess.run(['sh', '-c', 'echo ok'], capture_output=True, text=True).stdout)\n"
    )
    r = await pool.run(code)
    assert r.stdout.split() == ["-1", "1", "-1", "1", "ok"], r


@pytest.fixture
async def patient_pool():
    """A pool whose calls may take 30 s: a test that acts on a running call is not raced by
    the call's timeout on a loaded machine."""
    cfg = PoolConfig(num_workers=2, limits=Limits(timeout_s=30.0, memory_mb=256))
    async with SandboxPool(cfg) as p:
        yield p


@needs_root
async def test_a_call_whose_zygote_dies_mid_call_runs_again(patient_pool):
    """A zygote that ends mid-call (killed, or forks failing for long) takes its children with
    it, the running one too, and no report comes: the call runs again on a child of the zygote
    the pool starts next, and answers what the snippet prints, not an error."""
    await patient_pool.wait_warm()
    zygote = patient_pool._zygotes[image_for("print(1)", "python")]
    pid = zygote.ready._queue[0].pid  # the call's first child
    code = "import time\nprint('started', flush=True)\ntime.sleep(1.0)\nprint('done')"
    call = asyncio.create_task(patient_pool.run(code))
    deadline = time.monotonic() + 30
    while "started" not in _stdout_of(pid):
        assert time.monotonic() < deadline and not call.done(), "the snippet did not start"
        await asyncio.sleep(0.01)
    os.kill(zygote._proc.pid, signal.SIGKILL)
    result = await call
    assert (result.status, result.stdout) == ("ok", "started\ndone\n"), result
    assert patient_pool.lost == 1
    await _still_serves(patient_pool)


async def test_a_snippet_killed_from_outside_is_not_called_a_cpu_timeout(patient_pool):
    """A snippet ended by SIGKILL well under its CPU-seconds cap (the OOM killer, an operator:
    here the test) says so; only a kill at the cap reads as a CPU time limit."""
    await patient_pool.wait_warm()
    zygote = patient_pool._zygotes[image_for("print(1)", "python")]
    pid = zygote.ready._queue[0].pid  # the next call's child
    call = asyncio.create_task(
        patient_pool.run("import time\nprint('x', flush=True)\ntime.sleep(20)")
    )
    deadline = time.monotonic() + 30
    while "x" not in _stdout_of(pid):
        assert time.monotonic() < deadline and not call.done(), "the snippet did not start"
        await asyncio.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    r = await call
    assert (r.status, r.exit_code, r.stdout) == ("error", 137, "x\n"), r
    assert "killed by signal SIGKILL" in r.stderr and "CPU time" not in r.stderr


def _stdout_of(pid: int) -> str:
    """What a running child has written to its stdout (a memfd) so far."""
    try:
        return Path(f"/proc/{pid}/fd/1").read_text()
    except OSError:
        return ""


def test_a_sigkill_at_the_cpu_cap_reads_as_a_cpu_timeout():
    from sandbox_pool.pool import _to_result

    at_cap = _to_result({"died": 137, "cpu_s": 2.98}, "", "", 3.0, cpu_cap_s=3)
    assert at_cap.status == "timeout" and "CPU time limit exceeded" in at_cap.stderr
    xcpu = _to_result({"died": 128 + signal.SIGXCPU, "cpu_s": 3.0}, "", "", 3.0, cpu_cap_s=3)
    assert xcpu.status == "timeout"
    under = _to_result({"died": 137, "cpu_s": 0.4}, "", "", 0.5, cpu_cap_s=3)
    assert under.status == "error" and "SIGKILL" in under.stderr


def test_failing_forks_end_the_zygote_only_once_they_last():
    from sandbox_pool.zygote import ForkFailures

    failures = ForkFailures(fatal_after_s=10.0)
    assert not failures.failed(100.0) and not failures.failed(109.9)
    assert failures.failed(110.0)
    failures.succeeded()
    assert not failures.failed(200.0)  # a success in between starts the count again


@needs_root
async def test_a_call_lost_to_a_cancelled_close_starts_no_new_zygote():
    """A close that is cancelled stops the zygotes under the calls still running: a call lost
    so answers internal_error, and no zygote is started again for the closed pool."""
    pool = SandboxPool(PoolConfig(num_workers=2, limits=Limits(timeout_s=30.0, memory_mb=256)))
    await pool.start()
    await pool.wait_warm()
    zygote = pool._zygotes[image_for("print(1)", "python")]
    pid = zygote.ready._queue[0].pid
    call = asyncio.create_task(pool.run("import time\nprint('started', flush=True)\ntime.sleep(5)"))
    deadline = time.monotonic() + 30
    while "started" not in _stdout_of(pid):
        assert time.monotonic() < deadline and not call.done(), "the snippet did not start"
        await asyncio.sleep(0.01)
    closing = asyncio.create_task(pool.aclose())
    await asyncio.sleep(0.1)  # aclose waits on the running call
    closing.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await closing
    result = await asyncio.wait_for(call, 30)
    assert result.status == "internal_error" and "closed" in result.stderr, result
    assert not any(z.alive for z in pool._zygotes.values())
    for z in pool._zygotes.values():  # reaped here, not after this test's loop has closed
        await z.wait_stopped()
