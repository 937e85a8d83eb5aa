"""`rstar2 doctor` against real services: a Redis, a sandbox-pool server, a Ray cluster, the
smoke; two doctor runs in all (each imports every component: a CLI start costs seconds)."""

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
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults import free_port
from tests.integration.test_sandbox_redis import redis_url  # noqa: F401 (a fixture)


def _doctor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rstar2.cli", "doctor", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


@contextlib.contextmanager
def _sandbox_server() -> Iterator[str]:
    """``sandbox-pool serve`` with one worker, until the block ends; yields its URL."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "sandbox_pool.cli", "serve", "--port", str(port), "--workers", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None and "serving on" in server.stdout.readline()
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=30)


@contextlib.contextmanager
def _ray_head(tmp_path: Path, env: dict[str, str]) -> Iterator[str]:
    """A one-node Ray head (token auth, one CPU, a ``learner`` resource), until the block
    ends; yields its GCS address once the port answers."""
    from launcher.local import _free_port_block
    from launcher.plan import node_ray_ports

    ports, lock = _free_port_block()
    ray_tmp = tempfile.mkdtemp(prefix="rstar2-doctor-ray-")  # short: Ray's socket paths
    log = tmp_path / "ray.log"
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
    try:
        deadline = time.monotonic() + 120
        while True:  # the head's GCS port answers
            assert head.poll() is None, f"ray start --head exited:\n{log.read_text()[-3000:]}"
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", ports["ray_gcs"])) == 0:
                    break
            assert time.monotonic() < deadline, "no Ray head in 120 s"
            time.sleep(0.5)
        yield f"127.0.0.1:{ports['ray_gcs']}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGTERM)
        head.wait(timeout=60)
        lock.close()
        shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.mark.timeout(600)
def test_doctor_passes_with_live_services_and_fails_on_dead_ones(redis_url, tmp_path):  # noqa: F811
    """One run against a live Redis, sandbox server and Ray cluster (token auth) with the
    smoke: every check ok, the cluster's nodes and resources listed. Then, with the sandbox
    and the cluster stopped and a GPU asked for on this CPU machine: each named as failed,
    exit 1, one summary line, no traceback."""
    token = tmp_path / "token"
    token.write_text("doctor-test-token")
    env = dict(os.environ, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token))
    with _sandbox_server() as sandbox, _ray_head(tmp_path, env) as address:
        done = _doctor("--redis", redis_url, "--sandbox", sandbox, "--smoke", "--ray", address,
                       env=env)  # fmt: skip
        lines = done.stdout.splitlines()
        assert done.returncode == 0, done.stdout + done.stderr
        status = {line[6:29].strip(): line.split()[0] for line in lines}
        for name in ("torch", "vllm", "redis", "sandbox", "smoke: sandbox call"):
            assert status[name] == "ok", lines
        assert status["smoke: learner step"] == "ok", lines
        assert "print(1+1) -> '2\\n'" in done.stdout
        ray = next(x for x in lines if "ray cluster" in x)
        assert ray.startswith("ok") and "1 node(s)" in ray and "learner 1" in ray, ray
    dead = _doctor("--sandbox", sandbox, "--accelerator", "cuda", "--ray", address, env=env)
    assert dead.returncode == 1
    for name in ("sandbox", "accelerator", "ray cluster"):
        assert f"FAIL  {name}" in dead.stdout, dead.stdout
    assert dead.stdout.splitlines()[-1].startswith("rstar2 doctor: 3 required check(s) failed")
    assert "Traceback" not in dead.stdout + dead.stderr
