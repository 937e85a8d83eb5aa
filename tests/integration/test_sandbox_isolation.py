"""Isolation fails closed, and Python stays importable without exposing /tmp (root only: these are
the layers that need it). Calls between themselves: tests/unit/test_sandbox_pool.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import types
from pathlib import Path

import aiohttp
import pytest

from sandbox_pool import PoolConfig, SandboxPool
from sandbox_pool.isolation import editable_paths

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="isolation layers need root")
REPO = Path(__file__).resolve().parents[2]


def _serve(port: int, *extra: str, cwd: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "sandbox_pool.cli", "serve", "--port", str(port), *extra],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


async def test_a_server_started_in_tmp_cannot_show_the_hosts_tmp():
    marker = Path("/tmp") / f"rstar2-host-secret-{os.getpid()}"
    marker.write_text("host secret")
    port = _free_port()
    proc = _serve(port, "--workers", "1", cwd="/tmp", env=_env())
    try:
        assert "serving on" in proc.stdout.readline(), proc.stderr.read()
        code = f"import os\nprint(os.path.exists({str(marker)!r}), sorted(os.listdir('/tmp'))[:3])"
        url = f"http://127.0.0.1:{port}/v1/execute"
        async with aiohttp.ClientSession() as s, s.post(url, json={"code": code}) as r:
            body = await r.json()
        assert body["status"] == "ok", body
        assert body["stdout"].startswith("False"), body
        assert marker.name not in body["stdout"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        marker.unlink()


def test_python_path_on_tmp_itself_refuses_to_start_unless_told():
    env = _env(PYTHONPATH=f"{REPO}:/tmp")
    proc = _serve(_free_port(), "--workers", "1", cwd=str(REPO), env=env)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, (out, err)
    line = err.strip().splitlines()[-1]
    assert line.startswith("sandbox-pool: refusing to start: sandbox isolation unavailable")
    assert "includes /tmp itself" in line and "--unsafe-weak-isolation" in line
    weak = _serve(_free_port(), "--workers", "1", "--unsafe-weak-isolation", cwd=str(REPO), env=env)
    try:
        assert "serving on" in weak.stdout.readline()
    finally:
        weak.terminate()
        weak.wait(timeout=30)


async def test_python_dirs_under_tmp_are_importable_and_nothing_beside_them(
    tmp_path_factory, monkeypatch
):
    root = Path("/tmp") / f"rstar2-pp-{os.getpid()}"
    (root / "lib").mkdir(parents=True)
    (root / "lib").chmod(0o777)  # writable by anyone on the host: still read-only in a call
    (root / "lib" / "tool_helper.py").write_text("VALUE = 42\n")
    (root / "secret.txt").write_text("not for calls")
    monkeypatch.setenv("PYTHONPATH", f"{REPO}:{root / 'lib'}")
    shm_view = "/dev/shm" + str(root)[len("/tmp") :]  # /dev/shm is the same tmpfs, keeps too
    try:
        async with SandboxPool(PoolConfig(num_workers=1)) as pool:
            code = (
                "import os, tool_helper\n"
                "def refused(path):\n"
                "    try:\n"
                "        open(path, 'w').close()\n"
                "    except OSError as e:\n"
                "        return e.errno\n"
                f"assert refused({str(root / 'lib' / 'x.py')!r}) == 30  # EROFS\n"
                f"assert refused({shm_view + '/x'!r}) == 13  # EACCES: root's dir\n"
                f"assert os.path.exists({shm_view + '/lib/tool_helper.py'!r})\n"
                f"print(tool_helper.VALUE, os.path.exists({str(root / 'secret.txt')!r}))"
            )
            # more calls than namespace slots: each reset of a /tmp leaves the bound-back
            # directory alone (inside and on the host)
            results = [await pool.run(code) for _ in range(12)]
        assert [r.stdout for r in results] == ["42 False\n"] * 12, results
        assert (root / "lib" / "tool_helper.py").read_text() == "VALUE = 42\n"
    finally:
        for p in (root / "lib" / "tool_helper.py", root / "secret.txt"):
            p.unlink()
        (root / "lib").rmdir()
        root.rmdir()


async def test_a_missing_layer_refuses_the_pool_unless_weak_isolation_is_accepted():
    from sandbox_pool.zygote_client import IsolationUnavailable

    with pytest.raises(IsolationUnavailable, match="per-call uids"):
        async with SandboxPool(PoolConfig(num_workers=1, uid_base=None)):
            pass
    async with SandboxPool(
        PoolConfig(num_workers=1, uid_base=None, allow_weak_isolation=True)
    ) as p:
        assert (await p.run("import os\nprint(os.getuid())")).stdout == "0\n"


def test_editable_installs_are_found_through_their_finder(monkeypatch, tmp_path):
    pkg = tmp_path / "src" / "demo_pkg"
    pkg.mkdir(parents=True)
    single = tmp_path / "flat.py"
    single.write_text("")
    finder = types.ModuleType("__editable___demo_0_1_finder")
    finder.MAPPING = {"demo_pkg": str(pkg), "flat": str(single)}  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, finder.__name__, finder)
    assert {str(pkg), str(tmp_path)} <= editable_paths()
