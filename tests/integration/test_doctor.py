"""`rstar2 doctor` against real services: a Redis, a sandbox-pool server, the smoke."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from tests.faults import free_port
from tests.integration.test_sandbox_redis import redis_url  # noqa: F401 (a fixture)


def _doctor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rstar2.cli", "doctor", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.timeout(600)
def test_doctor_passes_with_live_services_and_fails_on_a_dead_one(redis_url):  # noqa: F811
    port = free_port()
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


@pytest.mark.timeout(300)
def test_doctor_lists_a_ray_clusters_resources(tmp_path):
    from launcher.local import _free_port_block
    from launcher.plan import node_ray_ports

    ports, lock = _free_port_block()
    ray_tmp = tempfile.mkdtemp(prefix="rstar2-doctor-ray-")  # short: Ray's socket paths
    log = tmp_path / "ray.log"
    token = tmp_path / "token"
    token.write_text("doctor-test-token")
    env = dict(os.environ, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token))
    command = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block", "--head",
               "--node-ip-address=127.0.0.1", f"--temp-dir={ray_tmp}",
               f"--port={ports['ray_gcs']}", f"--ray-client-server-port={ports['ray_client']}",
               "--include-dashboard=false", "--num-cpus=1", "--num-gpus=0",
               '--resources={"learner": 1}', *node_ray_ports(ports["base"], 0)]  # fmt: skip
    head = subprocess.Popen(
        command,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    address = f"127.0.0.1:{ports['ray_gcs']}"
    try:
        deadline = time.monotonic() + 120
        while True:  # the head's GCS port answers
            assert head.poll() is None, f"ray start --head exited:\n{log.read_text()[-3000:]}"
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", ports["ray_gcs"])) == 0:
                    break
            assert time.monotonic() < deadline, "no Ray head in 120 s"
            time.sleep(0.5)
        done = subprocess.run(
            [sys.executable, "-m", "rstar2.cli", "doctor", "--ray", address],
            capture_output=True,
            text=True,
            timeout=180,
            env=env,
        )
        line = next(x for x in done.stdout.splitlines() if "ray cluster" in x)
        assert done.returncode == 0, done.stdout + done.stderr
        assert line.startswith("ok") and "1 node(s)" in line and "learner 1" in line, line
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGTERM)
        head.wait(timeout=60)
        lock.close()
        shutil.rmtree(ray_tmp, ignore_errors=True)
    gone = _doctor("--ray", address)
    assert gone.returncode == 1 and "FAIL  ray cluster" in gone.stdout
