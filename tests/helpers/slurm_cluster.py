"""A real, throw-away 3-node Slurm cluster on this one machine, for launcher tests.

Installation is the CI script's job, not this module's. On Debian 12 (Slurm 22.05) CI runs::

    apt-get update && apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge

Tests that need the cluster skip when a binary is missing (see `missing_slurm_binaries`).
Everything runs as root (SlurmUser=root, slurmd needs it).

What `slurm_cluster(root)` starts, all of it configured and written under ``root`` (nothing is
written to /etc or /run):

- a private ``munged`` with a fresh key and its own socket (``AuthInfo=socket=...``), so it
  never touches or depends on a system munged, and two clusters at once do not share one;
- ``slurmctld`` and one ``slurmd -N <node>`` per node, all in the foreground (``-D``), with
  their PIDs kept;
- nodes ``gpu1`` and ``gpu2`` (``Gres=gpu:4``, backed by character devices made with mknod
  under ``root``) and ``cpu1`` (no gres), each with its own loopback ``NodeAddr`` (127.0.0.2,
  .3, .4, which Ray needs later) and its own free TCP port; ``CPUs=2`` each (not checked
  against the hardware: ``SlurmdParameters=config_overrides``);
- partitions ``gpu`` (gpu1, gpu2; the default) and ``cpu`` (cpu1), ``OverSubscribe=FORCE:4``
  so that jobs share the few real cores.

Clients (sbatch, srun, sinfo, squeue, scontrol, scancel) find the cluster through
``SlurmCluster.env`` (``SLURM_CONF`` set, inherited ``SLURM_*`` job variables removed); jobs
inherit ``SLURM_CONF``, so ``srun`` inside a batch script works as is.

Known behaviour of this setup (Slurm 22.05, ``task/none``, ``proctrack/linuxproc``): devices
are not confined; in a heterogeneous job the GPU component's ``CUDA_VISIBLE_DEVICES`` can leak
into the other components; processes that daemonise escape their step (start Ray with
``--block``); ``scontrol show hostnames`` sorts the names, so never assign roles by position.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

# The binaries the harness runs; the daemons live in /usr/sbin, which is not always on PATH.
SLURM_BINARIES: tuple[str, ...] = (
    "munged",
    "slurmctld",
    "slurmd",
    "sinfo",
    "squeue",
    "scontrol",
    "scancel",
    "srun",
    "sbatch",
)
APT_INSTALL = (
    "apt-get update && apt-get install -y --no-install-recommends "
    "slurmctld slurmd slurm-client munge"
)
_SBIN_DIRS = ("/usr/sbin", "/sbin", "/usr/local/sbin")

GPU_NODES: tuple[str, ...] = ("gpu1", "gpu2")
CPU_NODES: tuple[str, ...] = ("cpu1",)
GPUS_PER_NODE = 4
# not 127.0.0.1: Ray rewrites that address (and only that one) to the host's own IP, so a Ray
# head there would be unreachable under the address its workers are told
NODE_ADDRS: dict[str, str] = {"gpu1": "127.0.0.2", "gpu2": "127.0.0.3", "cpu1": "127.0.0.4"}

# sun_path is 108 bytes; munged and slurmstepd put sockets under root.
_MAX_SOCKET_PATH = 107
_LONGEST_STEP_SOCKET = "spool/gpu1/gpu1_4294967295.4294967295"
_log = logging.getLogger(__name__)
_OWNED_SUBDIRS = ("etc", "state", "spool", "run", "dev", "munge", "log")


class SlurmClusterError(RuntimeError):
    """The cluster did not come up (or a daemon died); the message carries the log tails."""


def _find_binary(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for d in _SBIN_DIRS:
        p = Path(d) / name
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
    return None


def missing_slurm_binaries() -> list[str]:
    """The names in `SLURM_BINARIES` that are not installed (PATH and the sbin folders)."""
    return [b for b in SLURM_BINARIES if _find_binary(b) is None]


def slurm_available() -> bool:
    """True when every binary the harness runs is installed and we are root (slurmd needs it)."""
    return not missing_slurm_binaries() and os.geteuid() == 0


def skip_reason() -> str:
    """Why `slurm_available()` is False, phrased for ``pytest.mark.skipif``; '' when it is True."""
    missing = missing_slurm_binaries()
    if missing:
        return f"Slurm not installed (missing {', '.join(missing)}); CI runs: {APT_INSTALL}"
    if os.geteuid() != 0:
        return "the Slurm test cluster runs slurmd with SlurmUser=root and needs root"
    return ""


@dataclass(frozen=True)
class SlurmCluster:
    """A running cluster, valid inside the ``with slurm_cluster(...)`` block.

    ``env`` is a complete environment for subprocess calls of the Slurm clients; ``pids`` maps
    each daemon the harness started ("munged", "slurmctld", "slurmd-<node>") to its PID.
    """

    root: Path
    conf: Path
    gres_conf: Path
    env: dict[str, str]
    nodes: tuple[str, ...]
    gpu_nodes: tuple[str, ...]
    cpu_nodes: tuple[str, ...]
    partitions: dict[str, tuple[str, ...]]
    default_partition: str
    node_addrs: dict[str, str]
    node_ports: dict[str, int]
    controller_port: int
    gpus_per_node: int
    cpus_per_node: int
    log_dir: Path
    pids: dict[str, int] = field(default_factory=dict)

    def run(
        self,
        args: Sequence[str],
        *,
        timeout: float = 60.0,
        check: bool = True,
        cwd: Path | None = None,
        extra_env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run a client command with the cluster's env; text output captured.

        On a timeout or (with ``check``) a non-zero exit it raises `SlurmClusterError` whose
        message has the command's output, ``squeue``/``sinfo`` and the daemon log tails, so a
        hang fails with a diagnosis instead of a bare timeout.
        """
        env = {**self.env, **(extra_env or {})}
        try:
            proc = subprocess.run(
                list(args),
                env=env,
                cwd=cwd,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired as e:
            raise SlurmClusterError(
                f"{' '.join(args)} did not finish within {timeout:.0f}s\n"
                f"stdout: {_text(e.stdout)}\nstderr: {_text(e.stderr)}\n{self.diagnostics()}"
            ) from None
        if check and proc.returncode != 0:
            raise SlurmClusterError(
                f"{' '.join(args)} exited {proc.returncode}\nstdout: {proc.stdout}\n"
                f"stderr: {proc.stderr}\n{self.diagnostics()}"
            )
        return proc

    def node_states(self, timeout: float = 15.0) -> dict[str, str]:
        """Node name -> Slurm state as ``sinfo`` reports it (e.g. 'idle', 'mixed', 'down*')."""
        proc = subprocess.run(
            ["sinfo", "--noheader", "--Node", "--format=%N %T"],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        states: dict[str, str] = {}
        for line in proc.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2:
                states[parts[0]] = parts[1]
        return states

    def job_ids(self, timeout: float = 15.0) -> list[str]:
        """The IDs of the jobs the controller still knows as pending or running."""
        proc = subprocess.run(
            ["squeue", "--noheader", "--format=%A"],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        return proc.stdout.split()

    def diagnostics(self, lines: int = 30) -> str:
        """Best-effort text for a failure message: sinfo, squeue and each daemon's log tail."""
        out: list[str] = []
        for cmd in (["sinfo", "--Node", "--long"], ["squeue", "--all", "--long"]):
            try:
                p = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=10)
                out.append(f"$ {' '.join(cmd)}\n{p.stdout}{p.stderr}")
            except (OSError, subprocess.SubprocessError) as e:
                out.append(f"$ {' '.join(cmd)}: {e!r}")
        out.append(_log_tails(self.log_dir, lines))
        return "\n".join(out)


def _text(b: bytes | str | None) -> str:
    if b is None:
        return ""
    return b.decode(errors="replace") if isinstance(b, bytes) else b


def _log_tails(log_dir: Path, lines: int) -> str:
    out: list[str] = []
    for log in sorted(log_dir.glob("*")):
        try:
            tail = log.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            continue
        out.append(f"--- {log.name} (last {len(tail)} lines)\n" + "\n".join(tail))
    return "\n".join(out)


def _free_ports(n: int) -> list[int]:
    """``n`` distinct ports that are free right now on every address (all held while picked)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("0.0.0.0", 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def _slurm_env(conf: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {
        k: v
        for k, v in (os.environ if base is None else base).items()
        if not (k.startswith(("SLURM_", "SLURMD_", "SBATCH_", "SRUN_", "SALLOC_")))
    }
    env["SLURM_CONF"] = str(conf)
    path = env.get("PATH", "/usr/bin:/bin").split(os.pathsep)
    env["PATH"] = os.pathsep.join([*path, *(d for d in _SBIN_DIRS if d not in path)])
    return env


def _set_pdeathsig() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Ask the kernel to TERM the daemon if the Python process dies without cleaning up."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG


def _write_config(
    root: Path, *, hostname: str, ctl_port: int, node_ports: dict[str, int], cpus: int
) -> tuple[Path, Path]:
    etc, state, spool, run, dev, munge, logs = (root / d for d in _OWNED_SUBDIRS)
    for d in (etc, state, spool, logs, run, dev):
        d.mkdir(parents=True, exist_ok=True)
    for node in CPU_NODES:
        (spool / node).mkdir(exist_ok=True)
    for node in GPU_NODES:
        node_dev = dev / node
        node_dev.mkdir(exist_ok=True)
        (spool / node).mkdir(exist_ok=True)
        for i in range(GPUS_PER_NODE):
            f = node_dev / f"nvidia{i}"
            if not f.exists():
                # gres rejects plain files: it must be a character device; 1,3 is /dev/null's
                os.mknod(f, 0o666 | 0o020000, os.makedev(1, 3))
    plugstack = etc / "plugstack.conf"
    plugstack.write_text("")
    conf = etc / "slurm.conf"
    gres = etc / "gres.conf"

    node_lines = []
    for node in (*GPU_NODES, *CPU_NODES):
        gres_part = f" Gres=gpu:{GPUS_PER_NODE}" if node in GPU_NODES else ""
        node_lines.append(
            f"NodeName={node} NodeHostname={hostname} NodeAddr={NODE_ADDRS[node]} "
            f"Port={node_ports[node]} CPUs={cpus} RealMemory=1000{gres_part} State=UNKNOWN"
        )
    conf.write_text(
        "\n".join(
            [
                "# written by tests/helpers/slurm_cluster.py",
                "ClusterName=rstar2test",
                f"SlurmctldHost={hostname}(127.0.0.1)",
                f"SlurmctldPort={ctl_port}",
                "AuthType=auth/munge",
                "CredType=cred/munge",
                f"AuthInfo=socket={munge / 'munge.socket.2'}",
                "SlurmUser=root",
                "SlurmdUser=root",
                "ProctrackType=proctrack/linuxproc",
                "TaskPlugin=task/none",
                "MpiDefault=none",
                "ReturnToService=2",
                "SchedulerType=sched/backfill",
                # hetjobs are only started by the backfill pass: run it every second
                "SchedulerParameters=bf_interval=1,sched_min_interval=100000",
                "SelectType=select/cons_tres",
                "SelectTypeParameters=CR_Core",
                "SlurmdParameters=config_overrides",
                "JobAcctGatherType=jobacct_gather/none",
                "AccountingStorageType=accounting_storage/none",
                "JobCompType=jobcomp/none",
                "GresTypes=gpu",
                f"PlugStackConfig={plugstack}",
                "MailProg=/bin/true",
                f"StateSaveLocation={state}",
                f"SlurmdSpoolDir={spool}/%n",
                f"SlurmctldPidFile={run}/slurmctld.pid",
                f"SlurmdPidFile={run}/slurmd-%n.pid",
                f"SlurmctldLogFile={logs}/slurmctld.log",
                f"SlurmdLogFile={logs}/slurmd-%n.log",
                "SlurmctldDebug=info",
                "SlurmdDebug=info",
                "SlurmctldTimeout=30",
                "SlurmdTimeout=60",
                "MessageTimeout=20",
                "InactiveLimit=0",
                "KillWait=5",
                "MinJobAge=30",
                "Waittime=0",
                *node_lines,
                f"PartitionName=gpu Nodes={','.join(GPU_NODES)} Default=YES MaxTime=INFINITE "
                "State=UP OverSubscribe=FORCE:4",
                f"PartitionName=cpu Nodes={','.join(CPU_NODES)} MaxTime=INFINITE "
                "State=UP OverSubscribe=FORCE:4",
                "",
            ]
        )
    )
    gres.write_text(
        "".join(
            f"NodeName={node} Name=gpu File={dev / node}/nvidia[0-{GPUS_PER_NODE - 1}]\n"
            for node in GPU_NODES
        )
    )
    return conf, gres


class _Daemons:
    """The processes this harness started, by name, and how to stop exactly those."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        with open(self.log_dir / f"{name}.out", "ab") as out:
            proc = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a ^C in the test's terminal is ours to handle
                preexec_fn=_set_pdeathsig,
            )
        self.procs[name] = proc
        return proc

    def dead(self) -> dict[str, int]:
        return {n: rc for n, p in self.procs.items() if (rc := p.poll()) is not None}

    def stop(self, names: Sequence[str], deadline_s: float) -> None:
        """TERM ``names``, wait up to ``deadline_s`` for them, then KILL the rest and reap."""
        procs = [self.procs[n] for n in names if n in self.procs]
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGTERM)
        end = time.monotonic() + deadline_s
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(0.0, end - time.monotonic()))
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
                p.wait()


def _processes_with_env(marker: bytes, exclude: frozenset[int]) -> list[int]:
    """PIDs not in ``exclude`` (nor ours) whose initial environment holds ``marker``."""
    pids: list[int] = []
    skip = exclude | {os.getpid()}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker in environ.split(b"\0"):
            pids.append(int(entry.name))
    return pids


def _kill_leftovers(marker: bytes, exclude: frozenset[int], deadline_s: float) -> list[int]:
    """TERM then KILL every process (but ``exclude``) carrying ``marker``; return those found."""
    found = _processes_with_env(marker, exclude)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        end = time.monotonic() + deadline_s
        while time.monotonic() < end and _processes_with_env(marker, exclude):
            time.sleep(0.05)
        if not _processes_with_env(marker, exclude):
            break
    return found


def _wait_until(
    what: str,
    cond: Callable[[], bool],
    deadline_s: float,
    daemons: _Daemons,
    log_dir: Path,
    interval: float = 0.05,
) -> None:
    """Poll ``cond()`` until true; raise `SlurmClusterError` at the deadline or if a daemon dies."""
    end = time.monotonic() + deadline_s
    last_exc: BaseException | None = None
    while True:
        dead = daemons.dead()
        if dead:
            raise SlurmClusterError(
                f"while waiting for {what}: daemon(s) exited {dead}\n{_log_tails(log_dir, 40)}"
            )
        try:
            if cond():
                return
        except (OSError, subprocess.SubprocessError) as e:
            last_exc = e
        if time.monotonic() >= end:
            raise SlurmClusterError(
                f"{what} not reached within {deadline_s:.0f}s (last error: {last_exc!r})\n"
                f"{_log_tails(log_dir, 40)}"
            )
        time.sleep(interval)
        interval = min(interval * 1.5, 0.5)


@contextlib.contextmanager
def slurm_cluster(
    root: Path,
    *,
    start_deadline_s: float = 90.0,
    stop_deadline_s: float = 20.0,
    cpus_per_node: int = 2,
    start_attempts: int = 3,
) -> Iterator[SlurmCluster]:
    """Start the 3-node cluster described in the module docstring under ``root``; yield it.

    Guarantees:

    - On entry all three nodes are ``idle`` in ``sinfo``. Otherwise `SlurmClusterError` (with
      the daemon log tails) is raised within ``start_deadline_s`` per attempt, or as soon as
      a daemon exits, and nothing started here is left running. A start that fails because a
      picked port was taken meanwhile is retried with new ports, ``start_attempts`` in all.
    - On exit, normal or by an exception (which propagates unchanged): jobs still known to the
      controller are cancelled; then exactly the daemons started here are sent TERM, KILLed
      after ``stop_deadline_s`` and reaped; then any other process that still carries this
      cluster's ``SLURM_CONF`` in its environment (a stray slurmstepd or job task) is killed;
      munged goes last.
    - Ports are free ones picked at start, and every path is under ``root``, so clusters with
      different roots can run at the same time. ``root`` is created if missing; the harness
      replaces its own subfolders (etc, state, spool, run, dev, munge, log) on each start and
      leaves them after exit, for the logs under ``root/log``. ``root`` must be short enough
      for the Unix sockets put under it (about 60 characters; pytest's tmp paths are).
    - Daemons get PR_SET_PDEATHSIG(SIGTERM): if the calling thread dies without running the
      exit (SIGKILL), they are stopped by the kernel. Enter the context from a thread that
      outlives it (normally the main thread).
    """
    missing = missing_slurm_binaries()
    if missing:
        raise SlurmClusterError(f"missing {missing}; install with: {APT_INSTALL}")
    root = Path(root).resolve()
    if len(str(root / _LONGEST_STEP_SOCKET)) > _MAX_SOCKET_PATH:
        raise ValueError(f"root {root} is too long for the Unix sockets Slurm puts under it")
    for attempt in range(1, start_attempts + 1):
        cluster, daemons = _prepare(root, cpus_per_node)
        try:
            _start(cluster, daemons, start_deadline_s)
        except SlurmClusterError:
            _teardown(cluster, daemons, stop_deadline_s)
            if attempt < start_attempts and _port_clash(cluster.log_dir):
                continue
            raise
        except BaseException:
            _teardown(cluster, daemons, stop_deadline_s)
            raise
        break
    try:
        yield cluster
    finally:
        _teardown(cluster, daemons, stop_deadline_s)


def _port_clash(log_dir: Path) -> bool:
    return any(
        "Address already in use" in log.read_text(errors="replace")
        for log in log_dir.glob("*")
        if log.is_file()
    )


def _prepare(root: Path, cpus_per_node: int) -> tuple[SlurmCluster, _Daemons]:
    """Fresh folders, free ports and the config files; nothing started yet."""
    for sub in _OWNED_SUBDIRS:
        shutil.rmtree(root / sub, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    hostname = socket.gethostname().split(".")[0]
    nodes = (*GPU_NODES, *CPU_NODES)
    ctl_port, *ports = _free_ports(1 + len(nodes))
    node_ports = dict(zip(nodes, ports, strict=True))
    conf, gres = _write_config(
        root, hostname=hostname, ctl_port=ctl_port, node_ports=node_ports, cpus=cpus_per_node
    )
    log_dir = root / "log"
    cluster = SlurmCluster(
        root=root,
        conf=conf,
        gres_conf=gres,
        env=_slurm_env(conf),
        nodes=nodes,
        gpu_nodes=GPU_NODES,
        cpu_nodes=CPU_NODES,
        partitions={"gpu": GPU_NODES, "cpu": CPU_NODES},
        default_partition="gpu",
        node_addrs={n: NODE_ADDRS[n] for n in nodes},
        node_ports=node_ports,
        controller_port=ctl_port,
        gpus_per_node=GPUS_PER_NODE,
        cpus_per_node=cpus_per_node,
        log_dir=log_dir,
    )
    return cluster, _Daemons(log_dir)


def _start(cluster: SlurmCluster, daemons: _Daemons, deadline_s: float) -> None:
    """munged, slurmctld, the slurmds; return once every node is idle."""
    bin_ = {b: _find_binary(b) or b for b in SLURM_BINARIES}
    munge_dir = cluster.root / "munge"
    munge_dir.mkdir(mode=0o700)
    key = munge_dir / "munge.key"
    socket_path = munge_dir / "munge.socket.2"
    # a private munged with its own key. --force: the parents of root need not be searchable
    # by all (pytest's tmp dirs are 0700), which would only matter to non-root clients.
    # In the foreground it logs to stderr, i.e. log/munged.out.
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    munge_env = {k: v for k, v in cluster.env.items() if k != "SLURM_CONF"}
    daemons.start(
        "munged",
        [
            bin_["munged"],
            "--foreground",
            "--force",
            f"--socket={socket_path}",
            f"--key-file={key}",
            f"--pid-file={munge_dir / 'munged.pid'}",
            f"--seed-file={munge_dir / 'munged.seed'}",
        ],
        munge_env,
    )
    cluster.pids["munged"] = daemons.procs["munged"].pid
    _wait_until("munged's socket", socket_path.is_socket, deadline_s, daemons, cluster.log_dir)
    conf = str(cluster.conf)
    for name, argv in [
        ("slurmctld", [bin_["slurmctld"], "-D", "-f", conf]),
        *((f"slurmd-{n}", [bin_["slurmd"], "-D", "-N", n, "-f", conf]) for n in cluster.nodes),
    ]:
        cluster.pids[name] = daemons.start(name, argv, cluster.env).pid

    def all_idle() -> bool:
        states = cluster.node_states(timeout=5)
        return all(states.get(n) == "idle" for n in cluster.nodes)

    _wait_until("all nodes idle", all_idle, deadline_s, daemons, cluster.log_dir)


def _teardown(cluster: SlurmCluster, daemons: _Daemons, deadline_s: float) -> None:
    ctl = daemons.procs.get("slurmctld")
    if ctl is not None and ctl.poll() is None:
        # cancel what is left so slurmd ends its steps itself (clean), and wait for it briefly
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            jobs = cluster.job_ids(timeout=10)
            if jobs:
                subprocess.run(["scancel", *jobs], env=cluster.env, capture_output=True, timeout=10)
                end = time.monotonic() + deadline_s
                while time.monotonic() < end and cluster.job_ids(timeout=10):
                    time.sleep(0.2)
    slurmds = [n for n in daemons.procs if n.startswith("slurmd-")]
    # without a controller a slurmd may sit out MessageTimeout in its registration before it
    # handles TERM; it has nothing to save then, so it gets a short grace
    ctl_alive = ctl is not None and ctl.poll() is None
    daemons.stop(slurmds, deadline_s if ctl_alive else min(deadline_s, 2.0))
    daemons.stop(["slurmctld"], deadline_s)
    alive = frozenset(p.pid for p in daemons.procs.values() if p.poll() is None)
    strays = _kill_leftovers(f"SLURM_CONF={cluster.conf}".encode(), alive, deadline_s)
    if strays:
        _log.warning("killed %d leftover process(es) of the cluster: %s", len(strays), strays)
    daemons.stop(["munged"], deadline_s)
