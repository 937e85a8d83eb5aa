"""Build a Dockerfile for real and run the image as an OCI container, with no registry.

Installation is the CI script's job (``scripts/install.sh dev``): Debian's ``buildah`` (which
brings ``crun`` and containers-common's default seccomp profile) and ``debootstrap``.

- :func:`debian_base`: a Debian 12 minbase made by debootstrap, imported with buildah as
  ``localhost/debian-bookworm-base``; its digest stands in for the Dockerfile's pinned
  ``BASE_DIGEST`` (``FROM ${BASE_IMAGE}@${BASE_DIGEST}`` resolves it in local storage).
- :func:`build`: ``buildah bud`` (vfs storage, chroot isolation, Docker format so HEALTHCHECK is
  kept), with the host's CA bundle mounted for pip (outbound HTTPS here goes through an
  intercepting CA).
- :class:`Container`: the image's root file system (``buildah mount``) run by ``crun`` as a
  container would be run by docker: its own PID, mount (pivot_root), IPC and UTS namespaces,
  docker's default capability set plus what the caller adds, containers-common's default seccomp
  profile, masked /proc paths; the image's entrypoint, command, environment and user. It shares
  the host's network namespace (as ``docker run --network host``) so the test reaches its port.
  podman is not used: as root it raises RLIMIT_NOFILE, which needs CAP_SYS_RESOURCE that this
  machine's sandbox withholds. On a host with both cgroup v1 and a cgroup2 mount ("hybrid",
  which crun refuses), crun runs in a private mount namespace without the cgroup2 mount.

Everything lives under one storage root given by the caller: nothing outside it is written.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
SECCOMP_PROFILE = Path("/usr/share/containers/seccomp.json")
BASE_IMAGE = "localhost/debian-bookworm-base"
# docker's default capability set (moby's oci/caps/defaults.go), which `--cap-add` extends
DOCKER_DEFAULT_CAPS = (
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
)
_SECCOMP_ARCHES = {"x86_64": ("amd64", "x32", "x86"), "aarch64": ("arm64", "arm")}


def missing_binaries() -> list[str]:
    return [b for b in ("buildah", "crun", "debootstrap") if shutil.which(b) is None]


@dataclass(frozen=True)
class Storage:
    """One buildah storage root (vfs driver) and its run root."""

    root: Path

    def argv(self, *args: str) -> list[str]:
        """A buildah command line on this storage."""
        root, run = str(self.root / "storage"), str(self.root / "run")
        return ["buildah", "--storage-driver", "vfs", "--root", root, "--runroot", run, *args]

    def buildah(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(*args), check=True, capture_output=True, text=True)

    def digest(self, image: str) -> str:
        return self.buildah("images", "--digests", "--format", "{{.Digest}}", image).stdout.split()[
            0
        ]


def debian_base(storage: Storage, log: Path) -> tuple[str, str]:
    """A Debian 12 minbase image in ``storage``: (name, digest). ~40 s (debootstrap + import)."""
    work = storage.root / "base"
    rootfs = work / "rootfs"
    work.mkdir(parents=True, exist_ok=True)
    with log.open("a") as out:
        subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                "bookworm",
                str(rootfs),
                "http://deb.debian.org/debian",
            ],
            check=True,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    subprocess.run(["tar", "-C", str(rootfs), "-cf", str(work / "rootfs.tar"), "."], check=True)
    shutil.rmtree(rootfs)
    (work / "Containerfile").write_text('FROM scratch\nADD rootfs.tar /\nCMD ["bash"]\n')
    storage.buildah("bud", "--isolation", "chroot", "-q", "-t", BASE_IMAGE, str(work))
    (work / "rootfs.tar").unlink()
    return BASE_IMAGE, storage.digest(BASE_IMAGE)


def build(
    storage: Storage,
    context: Path,
    dockerfile: Path,
    tag: str,
    build_args: dict[str, str],
    log: Path,
) -> None:
    """``buildah bud`` the Dockerfile; its output goes to ``log``. Raises CalledProcessError."""
    args = ["bud", "--isolation", "chroot", "--format", "docker", "--layers=false"]
    args += ["-f", str(dockerfile), "-t", tag]
    args += ["-v", f"{CA_BUNDLE}:/run/host-ca.crt:ro"]
    for key, value in {"HOST_CA_BUNDLE": "/run/host-ca.crt", **build_args}.items():
        args += ["--build-arg", f"{key}={value}"]
    with log.open("a") as out:
        subprocess.run(
            storage.argv(*args, str(context)),
            check=True,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def image_config(storage: Storage, image: str) -> dict[str, object]:
    """The image's Docker config (Entrypoint, Cmd, Env, User, WorkingDir, Healthcheck, ...)."""
    out = storage.buildah("inspect", "--type", "image", image).stdout
    info = json.loads(out)
    config = info["Docker"]["config"]
    assert isinstance(config, dict)
    return config


def oci_seccomp(profile: dict[str, object], caps: Sequence[str]) -> dict[str, object]:
    """A containers/docker seccomp profile resolved for this architecture and ``caps``, in the
    OCI runtime spec's form (what docker and podman hand the runtime)."""
    arches = _SECCOMP_ARCHES[platform.machine()]
    syscalls = []
    for entry in profile["syscalls"]:  # type: ignore[attr-defined]
        inc, exc = entry.get("includes") or {}, entry.get("excludes") or {}
        if inc.get("arches") and not set(inc["arches"]) & set(arches):
            continue
        if exc.get("arches") and set(exc["arches"]) & set(arches):
            continue
        if not set(inc.get("caps", [])) <= set(caps):
            continue
        if set(exc.get("caps", [])) & set(caps):
            continue
        rule = {"names": entry["names"], "action": entry["action"]}
        for key in ("args", "errnoRet"):
            if entry.get(key):
                rule[key] = entry[key]
        syscalls.append(rule)
    arch_map = {m["architecture"]: m for m in profile["archMap"]}  # type: ignore[attr-defined]
    native = {"x86_64": "SCMP_ARCH_X86_64", "aarch64": "SCMP_ARCH_AARCH64"}[platform.machine()]
    return {
        "defaultAction": profile["defaultAction"],
        "defaultErrnoRet": profile.get("defaultErrnoRet", 1),
        "architectures": [native, *arch_map[native]["subArchitectures"]],
        "syscalls": syscalls,
    }


class Container:
    """One image run by crun (see the module docstring); a context manager that stops it."""

    def __init__(
        self,
        storage: Storage,
        image: str,
        name: str,
        args: Sequence[str] | None = None,
        cap_add: Sequence[str] = (),
        log: Path | None = None,
    ) -> None:
        self.storage, self.image, self.name = storage, image, name
        self.caps = [*DOCKER_DEFAULT_CAPS, *cap_add]
        self.args = args
        self.log = log or storage.root / f"{name}.log"
        self.bundle = storage.root / "bundles" / name
        self.proc: subprocess.Popen[bytes] | None = None
        self.working: str | None = None

    def _spec(self, rootfs: str) -> dict[str, object]:
        config = image_config(self.storage, self.image)
        subprocess.run(["crun", "spec", "-b", str(self.bundle)], check=True)
        spec = json.loads((self.bundle / "config.json").read_text())
        entry = list(config.get("Entrypoint") or [])  # type: ignore[call-overload]
        cmd = list(self.args if self.args is not None else config.get("Cmd") or [])  # type: ignore[call-overload]
        user = str(config.get("User") or "0")
        process = spec["process"]
        process.update(terminal=False, args=entry + cmd, env=list(config.get("Env") or []))  # type: ignore[call-overload]
        process["cwd"] = str(config.get("WorkingDir") or "/")
        process["user"] = {"uid": 0 if user in ("root", "0") else int(user), "gid": 0}
        process["capabilities"] = {k: self.caps for k in ("bounding", "effective", "permitted")}
        process.pop("rlimits", None)  # keep the host's: raising them needs CAP_SYS_RESOURCE
        spec["root"] = {"path": rootfs, "readonly": False}
        linux = spec["linux"]
        linux["namespaces"] = [n for n in linux["namespaces"] if n["type"] != "network"]
        linux.pop("cgroupsPath", None)
        linux["seccomp"] = oci_seccomp(json.loads(SECCOMP_PROFILE.read_text()), self.caps)
        # /etc/resolv.conf and /etc/hosts as docker provides them
        spec["mounts"] += [
            {"destination": p, "type": "bind", "source": p, "options": ["rbind", "ro"]}
            for p in ("/etc/resolv.conf", "/etc/hosts")
            if os.path.exists(p)
        ]
        return spec

    def start(self) -> None:
        self.working = self.storage.buildah("from", "--pull-never", self.image).stdout.strip()
        rootfs = self.storage.buildah("mount", self.working).stdout.strip()
        self.bundle.mkdir(parents=True, exist_ok=True)
        spec = self._spec(rootfs)
        (self.bundle / "config.json").write_text(json.dumps(spec))
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                _crun("run", "--bundle", str(self.bundle), self.name),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def exec(self, *cmd: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` inside the running container (``docker exec``)."""
        return subprocess.run(
            _crun("exec", self.name, *cmd), capture_output=True, text=True, timeout=timeout_s
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, timeout_s: float = 60.0) -> int | None:
        """TERM the container's init, wait, then KILL what is left; its exit code (None: killed)."""
        if self.proc is None:
            return None
        code: int | None = None
        if self.proc.poll() is None:
            subprocess.run(_crun("kill", self.name, "TERM"), capture_output=True)
            try:
                code = self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                subprocess.run(_crun("kill", "--all", self.name, "KILL"), capture_output=True)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=timeout_s)
        else:
            code = self.proc.returncode
        subprocess.run(_crun("delete", "--force", self.name), capture_output=True)
        if self.working:
            with contextlib.suppress(subprocess.CalledProcessError):
                self.storage.buildah("umount", self.working)
                self.storage.buildah("rm", self.working)
        return code

    def __enter__(self) -> Container:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _crun(*args: str) -> list[str]:
    """A crun command line that also works on a hybrid cgroup host (see the module docstring)."""
    crun = " ".join(["exec crun --cgroup-manager=disabled", *(shlex.quote(a) for a in args)])
    script = (
        "if [ -d /sys/fs/cgroup/unified ] && [ -d /sys/fs/cgroup/memory ]; then "
        "umount /sys/fs/cgroup/unified; fi; " + crun
    )
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]
