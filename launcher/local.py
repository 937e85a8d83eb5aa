"""``rstar2 launch local``: the role layout of a Slurm job, on this machine, for development.

In order, as the job script does on a cluster: the sandbox as services (a Redis with the run's
password, ``sandbox-pool serve --redis`` in front of it and one ``sandbox-pool worker``, the
layout of several sandbox nodes; waited for by its health check), a Ray head advertising the
``learner`` and ``rollout`` role resources (ports from one block of ``launcher.plan``, its
session under ``/tmp/rstar2-ray-local-<pid>``), then ``rstar2 train`` in that Ray cluster
(``--resume`` when the run folder already holds a run). The services' logs go to
``RUNS_DIR/NAME/local/``; the driver's console is this one. A service that ends before the
driver stops the driver (TERM: it checkpoints) and fails the launch, naming it; Ctrl-C or TERM
stop the driver the same way; the services are stopped and the Ray session folder removed in
every case.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from launcher.plan import PORT_BLOCKS, PORT_STRIDE, node_ray_ports, port_block
from launcher.preflight import taken_ports
from launcher.wait_for import wait_http, wait_ray
from rstar2.config import Config
from rstar2.trainer.ray_resources import engine_demand
from rstar2.trainer.wiring import check_placement_supported

HOST = "127.0.0.1"
SANDBOX_NODES = ("local-sandbox-0", "local-sandbox-1")


@dataclass
class Service:
    name: str
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)  # on top of the launch's environment
    log: str = ""  # file name under the logs folder


@dataclass(frozen=True)
class LocalPlan:
    run_dir: Path
    log_dir: Path
    ray_tmp: str
    ports: dict[str, int]
    services: tuple[Service, ...]
    driver: list[str]


def plan_local(cfg: Config, config_path: str | None, overrides: list[str]) -> LocalPlan:
    """What ``launch local`` starts for ``cfg`` (ConfigError before anything starts)."""
    ray_cfg = cfg.model_copy(update={"cluster": cfg.cluster.model_copy(update={"ray": True})})
    check_placement_supported(ray_cfg)
    run_dir = (Path(cfg.runs_dir) / cfg.name).resolve()
    log_dir = run_dir / "local"
    ports = _free_port_block()
    py = sys.executable
    sandbox = [
        py, "-m", "launcher.sandbox_node", "--first", SANDBOX_NODES[0], "--first-ip", HOST,
        "--nodes", str(len(SANDBOX_NODES)), "--redis-port", str(ports["redis"]),
        "--http-port", str(ports["sandbox_http"]), "--data-dir", str(log_dir / "sandbox"),
    ]  # fmt: skip
    engine = engine_demand(cfg)
    resources = {
        "learner": cfg.learner.num_ranks,
        "rollout": engine.count * max(1, int(engine.gpus)),
    }
    gpus = 0 if cfg.cluster.accelerator == "cpu" else cfg.cluster.gpus_per_node
    ray_tmp = f"/tmp/rstar2-ray-local-{os.getpid()}"

    ray = [py, "-m", "ray.scripts.scripts", "start", "--block", "--head",
           f"--node-ip-address={HOST}", f"--temp-dir={ray_tmp}", f"--port={ports['ray_gcs']}",
           f"--ray-client-server-port={ports['ray_client']}", "--include-dashboard=false",
           f"--num-gpus={gpus}", f"--resources={json.dumps(resources)}",
           *node_ray_ports(ports["base"], 0)]  # fmt: skip
    services = (
        *(
            Service(f"the sandbox ({node})", sandbox, {"SLURMD_NODENAME": node}, f"{node}.log")
            for node in SANDBOX_NODES
        ),
        Service("the Ray head", ray, {"RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}, "ray.log"),
    )
    url = f"sandbox.url=http://{HOST}:{ports['sandbox_http']}"
    if (run_dir / "config.json").is_file():
        driver = [py, "-m", "rstar2.cli", "train", "--resume", str(run_dir), url]
    else:
        given = ["--config", config_path] if config_path else []
        driver = [py, "-m", "rstar2.cli", "train", *given, *overrides, "cluster.ray=true",
                  "sandbox.mode=http", url, "--run-dir", str(run_dir)]  # fmt: skip
    return LocalPlan(run_dir, log_dir, ray_tmp, ports, services, driver)


def _free_port_block() -> dict[str, int]:
    """The first of the job port blocks whose ports are all free here."""
    for block in range(PORT_BLOCKS):
        ports = port_block(block)
        if not taken_ports(HOST, ports["base"], PORT_STRIDE):
            return ports
    raise RuntimeError("every port block of launcher.plan is taken on this machine")


def run_local(plan: LocalPlan, *, start_timeout_s: float, out: IO[str] = sys.stdout) -> int:
    """Start ``plan``'s services, run its driver, stop everything; the driver's exit status
    (1 when a service failed first)."""
    plan.log_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, SANDBOX_POOL_TOKEN=secrets.token_hex(32))
    env["RAY_ADDRESS"] = f"{HOST}:{plan.ports['ray_gcs']}"
    running: list[tuple[Service, subprocess.Popen[bytes]]] = []
    stop_asked = False

    def ask_stop(signum: int, frame: object) -> None:
        nonlocal stop_asked
        stop_asked = True

    previous = {s: signal.signal(s, ask_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for service in plan.services:
            print(f"launch local: {service.name}: logs in {plan.log_dir / service.log}", file=out)
            with open(plan.log_dir / service.log, "ab") as log:
                proc = subprocess.Popen(
                    service.command, env={**env, **service.env}, stdout=log, stderr=log,
                    start_new_session=True,  # Ctrl-C reaches the driver, not the services
                )  # fmt: skip
            running.append((service, proc))
        health = f"http://{HOST}:{plan.ports['sandbox_http']}/healthz"
        if wait_http(health, start_timeout_s):
            return 1
        expected = {"learner": ["local"], "rollout": ["local"]}
        if wait_ray(env["RAY_ADDRESS"], expected, {"local": ""}, start_timeout_s):
            return 1
        print(f"launch local: {shlex.join(plan.driver)}", file=out, flush=True)
        driver = subprocess.Popen(plan.driver, env=env)
        while driver.poll() is None:
            dead = next((s for s, p in running if p.poll() is not None), None)
            if dead is not None or stop_asked:
                if dead is not None:
                    print(f"launch local: {dead.name} ended before the driver", file=out)
                driver.send_signal(signal.SIGTERM)  # it checkpoints, then exits
                try:
                    driver.wait(timeout=600)
                except subprocess.TimeoutExpired:
                    driver.kill()
                return 1 if dead is not None else driver.wait()
            time.sleep(0.5)
        return driver.returncode
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _stop(running)
        shutil.rmtree(plan.ray_tmp, ignore_errors=True)


def _stop(running: list[tuple[Service, subprocess.Popen[bytes]]]) -> None:
    for _, proc in reversed(running):
        if proc.poll() is None:
            proc.terminate()
    end = time.monotonic() + 30
    for _, proc in running:
        try:
            proc.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
