"""Our stand-in for code-judge's tests/conftest.py: the same `test_client` fixture, a client of a
running `sandbox-pool serve` (embedded, or Redis mode with CJ_MODE=redis)."""

import os
import socket
import subprocess
import time

import pytest
import requests

REPO = os.environ["RSTAR2_REPO"]
SP = os.path.join(REPO, ".venv/bin/sandbox-pool")


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Client:
    def __init__(self, base):
        self.base = base.rstrip("/")

    def _url(self, path):
        return f"{self.base}/{path.lstrip('/')}"

    def get(self, path, **kw):
        return requests.get(self._url(path), timeout=120, **kw)

    def post(self, path, **kw):
        return requests.post(self._url(path), timeout=120, **kw)


@pytest.fixture(scope="session")
def test_client():
    env = dict(os.environ, MAX_WORKERS="4")
    procs = []
    port = _free_port()
    cmd = [SP, "serve", "--port", str(port)]
    if os.environ.get("CJ_MODE") == "redis":
        rport = _free_port()
        procs.append(
            subprocess.Popen(
                ["redis-server", "--port", str(rport), "--save", "", "--appendonly", "no"],
                stdout=subprocess.DEVNULL,
            )
        )
        time.sleep(0.5)
        env["REDIS_URI"] = f"redis://127.0.0.1:{rport}/7"
        cmd += ["--workers", "0"]
        procs.append(subprocess.Popen([SP, "worker"], env=env))
    server = subprocess.Popen(cmd, env=env)
    procs.append(server)
    client = Client(f"http://127.0.0.1:{port}")
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            if client.get("/status").json()["num_workers"] == 4:
                break
        except Exception:
            pass
        time.sleep(0.2)
    try:
        yield client
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
