"""`rstar2 doctor` against real services: a Redis, a sandbox-pool server, the smoke."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from tests.integration.test_sandbox_redis import redis_url  # noqa: F401 (a fixture)


def _doctor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rstar2.cli", "doctor", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.timeout(600)
def test_doctor_passes_with_live_services_and_fails_on_a_dead_one(redis_url):  # noqa: F811
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "sandbox_pool.cli", "serve", "--port", str(port), "--workers", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None and "serving on" in server.stdout.readline()
        sandbox = f"http://127.0.0.1:{port}"
        done = _doctor("--redis", redis_url, "--sandbox", sandbox, "--smoke")
        lines = done.stdout.splitlines()
        assert done.returncode == 0, done.stdout + done.stderr
        status = {line[6:29].strip(): line.split()[0] for line in lines}
        for name in ("torch", "vllm", "redis", "sandbox", "smoke: sandbox call"):
            assert status[name] == "ok", lines
        assert status["smoke: learner step"] == "ok", lines
        assert "print(1+1) -> '2\\n'" in done.stdout
    finally:
        server.terminate()
        server.wait(timeout=30)
    dead = _doctor("--sandbox", f"http://127.0.0.1:{port}", "--accelerator", "cuda")
    assert dead.returncode == 1
    assert "FAIL  sandbox" in dead.stdout and "FAIL  accelerator" in dead.stdout
    assert dead.stdout.splitlines()[-1].startswith("rstar2 doctor: 2 required check(s) failed")
    assert "Traceback" not in dead.stdout + dead.stderr
