"""``rstar2 launch local``: the role layout of a Slurm job, on this machine, for development.

In order, as the job script does on a cluster: the sandbox as services (a Redis with the run's
password, ``sandbox-pool serve --redis`` in front of it and one ``sandbox-pool worker``, the
layout of several sandbox nodes; waited for by its health check), a Ray head advertising the
``learner`` and ``rollout`` role resources (ports from one block of ``launcher.plan``, its
session under ``/tmp/rstar2-ray-local-<random>/r``, a folder only this user can enter), then
``rstar2 train`` in that Ray cluster (``--resume`` when the run folder already holds a run).
The services' logs go to ``RUNS_DIR/NAME/local/``; the driver's console is this one. A
service that ends before the driver stops the driver (TERM: it checkpoints) and fails the
launch, naming it; Ctrl-C or TERM stop the driver the same way; the services are stopped and
the Ray session folder removed in every case.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
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
from launcher.slurm import LaunchError
from launcher.wait_for import wait_http, wait_ray
from rstar2.config import Config
from rstar2.config_rules import check_placement
from rstar2.trainer.ray_resources import engine_demand

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
    port_lock: IO[str]  # held while the plan runs: the port block is this launch's
    resumes: bool  # the run folder holds a run: the driver resumes it with its own config


def plan_local(cfg: Config, config_path: str | None, overrides: list[str]) -> LocalPlan:
    """What ``launch local`` starts for ``cfg`` (ConfigError before anything starts)."""
    ray_cfg = cfg.model_copy(update={"cluster": cfg.cluster.model_copy(update={"ray": True})})
    check_placement(ray_cfg)
    run_dir = (Path(cfg.runs_dir) / cfg.name).resolve()
    log_dir = run_dir / "local"
    ports, lock = _free_port_block()
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
    # Ray makes its --temp-dir world-writable: it goes in a folder only this user can enter
    # (created by run_local), the path kept short for Ray's socket paths
    ray_tmp = f"/tmp/rstar2-ray-local-{secrets.token_hex(6)}/r"

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
    resumes = (run_dir / "config.json").is_file()
    if resumes:
        driver = [py, "-m", "rstar2.cli", "train", "--resume", str(run_dir), url]
    else:
        given = ["--config", config_path] if config_path else []
        driver = [py, "-m", "rstar2.cli", "train", *given, *overrides, "cluster.ray=true",
                  "sandbox.mode=http", url, "--run-dir", str(run_dir)]  # fmt: skip
    return LocalPlan(run_dir, log_dir, ray_tmp, ports, services, driver, lock, resumes)


def _free_port_block(lock_dir: Path = Path("/tmp")) -> tuple[dict[str, int], IO[str]]:
    """A job port block whose ports are all free here, and the lock that keeps it this
    launch's (another ``launch local`` skips a locked block; held until the process ends).
    A lock path that is a link, or a file this user cannot open, is another's: skipped."""
    first = random.randrange(PORT_BLOCKS)
    for i in range(PORT_BLOCKS):
        block = (first + i) % PORT_BLOCKS
        try:  # never follows a link nor truncates: the name in /tmp is predictable
            flags = os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
            lock = os.fdopen(os.open(lock_dir / f"rstar2-port-block-{block}.lock", flags, 0o644))
        except OSError:
            continue  # not a file this user may lock: not this launch's block
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            continue
        ports = port_block(block)
        if not taken_ports("0.0.0.0", ports["base"], PORT_STRIDE):  # Ray binds the host's IP
            return ports, lock
        lock.close()
    raise LaunchError(
        f"every one of the {PORT_BLOCKS} port blocks of launcher.plan is taken on this machine "
        "(by other launches, or ports in use): stop one, or launch elsewhere"
    )


def run_local(plan: LocalPlan, *, start_timeout_s: float, out: IO[str] = sys.stdout) -> int:
    """Start ``plan``'s services, run its driver, stop everything; the driver's exit status
    (1 when a service failed first or a stop came during start-up)."""
    plan.log_dir.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(32)
    # Ray's token authentication with this launch's own token, as the Slurm job does (not
    # whatever ~/.ray/auth_token holds): only the launch's processes join its cluster
    token_path = plan.log_dir / "token"
    token_path.unlink(missing_ok=True)
    fd = os.open(token_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token)
    env = dict(os.environ, SANDBOX_POOL_TOKEN=token, RAY_AUTH_MODE="token")
    env["RAY_AUTH_TOKEN_PATH"] = str(token_path)
    env["RAY_ADDRESS"] = f"{HOST}:{plan.ports['ray_gcs']}"
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH"):  # this process's wait joins it too
        os.environ[name] = env[name]
    running: list[tuple[Service, subprocess.Popen[bytes]]] = []
    stop_asked = False

    def ask_stop(signum: int, frame: object) -> None:
        nonlocal stop_asked
        stop_asked = True

    def why_stop() -> str | None:
        dead = next((s for s, p in running if p.poll() is not None), None)
        if dead is not None:
            return f"{dead.name} ended (see {plan.log_dir / dead.log})"
        return "a stop was asked" if stop_asked else None

    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, ask_stop) for s in signals}
    ray_home = Path(plan.ray_tmp).parent
    made_home = False
    try:
        ray_home.mkdir(mode=0o700)  # this launch's own: fails on anything already there
        made_home = True
        for service in plan.services:
            print(f"launch local: {service.name}: logs in {plan.log_dir / service.log}", file=out)
            with open(plan.log_dir / service.log, "ab") as log:
                proc = subprocess.Popen(
                    service.command, env={**env, **service.env}, stdout=log, stderr=log,
                    start_new_session=True,  # signals reach this launcher only
                )  # fmt: skip
            running.append((service, proc))
        health = f"http://{HOST}:{plan.ports['sandbox_http']}/healthz"
        if wait_http(health, start_timeout_s, why_stop):
            return 1
        expected = {"learner": ["local"], "rollout": ["local"]}
        if wait_ray(env["RAY_ADDRESS"], expected, {"local": ""}, start_timeout_s, why_stop):
            return 1
        if (reason := why_stop()) is not None:
            print(f"launch local: not starting the driver: {reason}", file=out)
            return 1
        print(f"launch local: {shlex.join(plan.driver)}", file=out, flush=True)
        # its own process group: Ctrl-C reaches this launcher, which sends TERM (a checkpoint)
        driver = subprocess.Popen(plan.driver, env=env, process_group=0)
        while driver.poll() is None:
            reason = why_stop()
            if reason is not None:
                print(f"launch local: {reason}: stopping the driver with a checkpoint", file=out)
                driver.send_signal(signal.SIGTERM)
                try:
                    driver.wait(timeout=600)
                except subprocess.TimeoutExpired:
                    driver.kill()
                return 1 if not stop_asked else driver.wait()
            time.sleep(0.5)
        return driver.returncode
    finally:
        _stop(running)
        token_path.unlink(missing_ok=True)
        if made_home:
            _keep_ray_logs(plan)
            shutil.rmtree(ray_home, ignore_errors=True)
        for s, handler in previous.items():  # last: a second Ctrl-C cannot cut the stop short
            signal.signal(s, handler)


def _stop(running: list[tuple[Service, subprocess.Popen[bytes]]]) -> None:
    """TERM to every service's process group, then KILL to whatever of it is left."""
    for _, proc in reversed(running):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    end = time.monotonic() + 30
    for _, proc in running:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.1, end - time.monotonic()))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # children left in the group
        proc.wait()


def _keep_ray_logs(plan: LocalPlan) -> None:
    """The Ray session's logs (the actors' output) into ``local/ray-session/`` before the
    session folder goes; the run's ``logs/ray`` link follows them."""
    logs = Path(plan.ray_tmp) / "session_latest" / "logs"
    if not logs.is_dir():
        return
    kept = plan.log_dir / "ray-session"
    shutil.rmtree(kept, ignore_errors=True)
    shutil.move(str(logs.resolve()), kept)
    link = plan.run_dir / "logs" / "ray"
    if link.is_symlink():
        link.unlink()
        link.symlink_to(kept, target_is_directory=True)
