"""Process isolation applied around a freshly forked sandbox child (Linux, as root).

Set-up in four places, so that nothing slow happens once a call arrives:
- :func:`enter_zygote_namespace` (zygote start): a private mount namespace with a hidden /root
  (or wherever Python lives, its directories bound back) and /proc with ``hidepid=2``.
- :func:`fork_into_namespaces` + :func:`prepare` (pre-fork time): each child is PID 1 of its own
  PID and IPC namespaces and enters a mount namespace with a private /tmp (:func:`private_tmp`)
  and a network namespace (loopback down) that no running call shares
  (:mod:`sandbox_pool.namespaces`), so when it dies the kernel kills everything it started and
  no two calls share a socket, a file in a temp dir or an IPC object; own session and process
  group, cwd in its own temp dir, stdio set.
- :func:`drop_privileges` (still before the call): rlimits on processes, file size, open files
  and core dumps (soft = hard), an unprivileged per-slot uid/gid with no supplementary groups,
  no-new-privileges, death with its parent, a scrubbed environment.
- :func:`limit_call` (when the call arrives): CPU seconds and address space, lowered to the
  call's own limits (an unprivileged process can lower limits, never raise them).
Nothing here falls back silently: a layer that cannot be applied raises or is returned as
missing, and the zygote refuses to serve unless weak isolation was explicitly accepted.
"""

from __future__ import annotations

import ctypes
import math
import os
import platform
import resource
import signal
import stat
import sys
from dataclasses import dataclass

from sandbox_pool import seccomp

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
CLONE_NEWPID = 0x20000000
CLONE_NEWIPC = 0x08000000
# A child's network and mount namespaces are not made at clone time (together ~0.55 ms of CPU to
# create and tear down): it enters reusable ones of the zygote's (:mod:`sandbox_pool.namespaces`).
CHILD_NAMESPACES = CLONE_NEWPID | CLONE_NEWIPC
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
MS_BIND = 4096
MS_NOSUID = 2
MS_NODEV = 4
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
PR_SET_CHILD_SUBREAPER = 36
# Covered once for all children by an empty read-only tmpfs (a call cannot write there at all);
# /tmp and /dev/shm are each child's own.
SEALED_TMP_DIRS = ("/var/tmp", "/run/lock")
MS_RDONLY = 1
MS_REMOUNT = 32
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_SYS_CLONE = {"x86_64": 56, "aarch64": 220}.get(platform.machine())
_SIGCHLD = 17


# the layer a chrooted service lacks; the zygote makes no namespace at all then (joining one
# would move it, and every call, to the host's root)
CHROOTED = (
    "a mount namespace rooted where the service runs (it runs chrooted, e.g. under buildah's "
    "chroot isolation: entering a call's namespace would leave the chroot for the host's root; "
    "run it in a container runtime that gives it its own mount namespace)"
)


def fork_into_namespaces(isolated: bool) -> int:
    """Fork; with ``isolated``, the child is PID 1 of new PID and IPC namespaces.

    ``os.fork`` cannot do this in one step (``unshare(CLONE_NEWPID)`` works once per process),
    so this calls the clone syscall with fork semantics, bracketed by CPython's own pre/post
    fork hooks. Raises OSError when the namespaces cannot be created: never a silent fallback.
    Measured on a 2-core VM (fork, exit and reap): 0.50 ms a plain fork, 0.55 ms with these two
    and reused mount and network namespaces entered, 0.75 ms with a new mount namespace and tmpfs.
    """
    if not isolated:
        return os.fork()
    if _SYS_CLONE is None:
        raise OSError(f"clone with namespaces is not supported on {platform.machine()}")
    api = ctypes.pythonapi
    api.PyOS_BeforeFork()
    flags = ctypes.c_ulong(CHILD_NAMESPACES | _SIGCHLD)
    pid = _libc.syscall(ctypes.c_long(_SYS_CLONE), flags, None, None, None, None)
    if pid == 0:
        api.PyOS_AfterFork_Child()
        return 0
    errno = ctypes.get_errno()
    api.PyOS_AfterFork_Parent()
    if pid < 0:
        raise OSError(errno, f"clone of an isolated child failed: {os.strerror(errno)}")
    return int(pid)


def enter_zygote_namespace(expose: list[tuple[str, tuple[str, ...]]]) -> list[str]:
    """Zygote start-up (as root): a private mount namespace that every child copies.

    - directories the children's uids could not traverse on the way to the Python install
      (``expose``) are replaced by tmpfs with only the Python dirs bound back;
    - /proc remounted with ``hidepid=2``: a child sees only its own uid's processes.
    Returns the layers that could not be applied (empty: all were).
    """
    if not is_root():
        return ["a private mount namespace (needs root)"]
    if chrooted():
        return [CHROOTED]
    if _libc.unshare(CLONE_NEWNS) != 0:
        return ["a private mount namespace (unshare failed)"]
    if _libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        return ["private mount propagation"]
    missing: list[str] = []
    for hidden, keeps in expose:
        if not _mount_over(hidden, b"mode=755,size=1m", keeps):
            missing.append(f"hiding {hidden} (Python is installed under it)")
    for target in SEALED_TMP_DIRS:
        flags = MS_NOSUID | MS_NODEV | MS_RDONLY
        if (
            os.path.isdir(target)
            and _libc.mount(b"tmpfs", target.encode(), b"tmpfs", flags, b"size=4k") != 0
        ):
            missing.append(f"an empty read-only {target}")
    if _libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV, b"hidepid=2") != 0:
        missing.append("/proc with hidepid=2")
    return missing


def chrooted() -> bool:
    """Whether this process's root is not its mount namespace's root (a chroot).

    Joining a mount namespace (setns) moves a process to that namespace's root, so a chrooted
    zygote would put its calls, and itself, on the host's root. Checked by a child that joins
    this same namespace and compares "/" before and after. Needs root.
    """
    here = os.stat("/")
    try:
        ns_fd = os.open("/proc/self/ns/mnt", os.O_RDONLY)
    except OSError:
        return False  # no /proc here: the mount namespace layers report their own failure
    try:
        pid = os.fork()
        if pid == 0:
            try:
                if _libc.setns(ns_fd, CLONE_NEWNS) != 0:
                    os._exit(2)  # not known; the namespace layers report their own failure
                root = os.stat("/")
                os._exit(0 if (root.st_dev, root.st_ino) == (here.st_dev, here.st_ino) else 1)
            except BaseException:
                os._exit(2)
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(ns_fd)
    return os.waitstatus_to_exitcode(status) == 1


def tmp_keeps() -> tuple[str, ...]:
    """Python directories under /tmp that a child's private /tmp must bind back.

    Raises ValueError when /tmp itself is on Python's path: /tmp could not be made private.
    """
    under_tmp = {p for p in python_paths() if p == "/tmp" or p.startswith("/tmp/")}
    if "/tmp" in under_tmp:
        raise ValueError("Python's import path includes /tmp itself (PYTHONPATH or cwd)")
    return tuple(_outermost(under_tmp))


def private_tmp(keeps: tuple[str, ...], tmp_size_mb: int) -> None:
    """In a new mount namespace (as root): a fresh tmpfs over /tmp, also bound over /dev/shm,
    with ``keeps`` bound back."""
    opts = f"mode=1777,size={tmp_size_mb}m".encode()
    if not _mount_over("/tmp", opts, keeps):
        raise OSError("could not mount a private /tmp")
    if os.path.isdir("/dev/shm") and _mount_bind("/tmp", "/dev/shm") != 0:
        raise OSError("could not cover /dev/shm")


@dataclass(frozen=True, kw_only=True)
class StaticLimits:
    """Limits that do not depend on the call: applied before it arrives."""

    max_processes: int
    max_file_mb: int
    max_open_files: int


def is_root() -> bool:
    return os.geteuid() == 0


def python_paths() -> set[str]:
    """Directories a child needs to import what the host Python can: the Python install, every
    sys.path entry (``.pth`` paths included), this package's own checkout, and the source
    directories of editable installs (setuptools' finders map them outside sys.path)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    needed = {sys.base_prefix, sys.prefix, sys.exec_prefix, here}
    needed |= {p for p in sys.path if os.path.isabs(p)}
    needed |= editable_paths()
    return {os.path.realpath(p) for p in needed if os.path.isdir(p)}


def editable_paths() -> set[str]:
    """Package directories of setuptools editable installs (``__editable___*_finder.MAPPING``)."""
    paths: set[str] = set()
    for name, module in list(sys.modules.items()):
        mapping = getattr(module, "MAPPING", None) if name.startswith("__editable__") else None
        if isinstance(mapping, dict):
            paths |= {os.path.dirname(p) if os.path.isfile(p) else p for p in mapping.values()}
    return {p for p in paths if isinstance(p, str) and os.path.isabs(p)}


def python_visibility_plan() -> list[tuple[str, tuple[str, ...]]]:
    """Directories the unprivileged child could not traverse on the way to the Python install.

    Returns ``(hidden_dir, python_dirs_under_it)`` pairs: each hidden dir (e.g. ``/root`` of a
    pyenv install, mode 700) is replaced in the child by an empty tmpfs into which only the
    Python directories are bind-mounted back, so imports work and nothing else there is visible.
    """
    plan: dict[str, set[str]] = {}
    for path in python_paths():
        blocked = _top_untraversable(path)
        if blocked is not None:
            plan.setdefault(blocked, set()).add(path)
    return [(hidden, tuple(_outermost(paths))) for hidden, paths in sorted(plan.items())]


def prepare(workdir: str, stdout_fd: int, stderr_fd: int, keep_fds: tuple[int, ...]) -> None:
    """In a fresh child, before its call: own session and process group, default signal
    dispositions, cwd in its temp dir, stdin /dev/null (the call installs its own), stdout and
    stderr the files the pool reads, every other descriptor closed."""
    os.setsid()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # over-size writes fail with EFBIG instead
    os.chdir(workdir)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(stdout_fd, 1)
    os.dup2(stderr_fd, 2)
    _close_other_fds(keep_fds)


def drop_privileges(uid: int | None, limits: StaticLimits, *, deny_keyrings: bool) -> None:
    """Before the call arrives: static rlimits, unprivileged uid, no new privileges, and with
    ``deny_keyrings`` the seccomp filter of :mod:`sandbox_pool.seccomp`.

    After this the process cannot raise any limit again (soft = hard, no privileges), but it can
    still lower them, which :func:`limit_call` does once the call's own limits are known.
    """
    for which, value in (
        (resource.RLIMIT_NPROC, limits.max_processes),
        (resource.RLIMIT_FSIZE, limits.max_file_mb * 1024 * 1024),
        (resource.RLIMIT_NOFILE, limits.max_open_files),
        (resource.RLIMIT_CORE, 0),
    ):
        resource.setrlimit(which, (value, value))
    if uid is not None and is_root():
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    set_no_new_privs()
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # cleared by setuid: set after it
    if deny_keyrings:
        seccomp.deny_keyrings()


def set_no_new_privs() -> None:
    """This process and its descendants can never gain privileges (setuid bits, caps)."""
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")


def scrub_environment(home: str) -> None:
    """The whole environment a call sees (set once in the zygote; children inherit it)."""
    os.environ.clear()
    os.environ.update(
        {
            "PATH": SAFE_PATH,
            "HOME": home,
            "TMPDIR": home,
            "LANG": "C.UTF-8",
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
        }
    )


def cpu_limit_s(timeout_s: float) -> int:
    """The CPU seconds a call may use: past its wall-clock timeout, which normally ends it
    first (the CPU cap stops a snippet whose wall timer could not fire)."""
    return math.ceil(timeout_s) + 1


def limit_call(timeout_s: float, memory_mb: int, base_vm_bytes: int) -> None:
    """The call's CPU-seconds and address-space caps (soft = hard: final).

    ``memory_mb`` is what the snippet may allocate on top of ``base_vm_bytes``, the child's
    address space when it became ready (:func:`current_vm_bytes`).
    """
    cpu_s = cpu_limit_s(timeout_s)
    vm_bytes = base_vm_bytes + memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
    resource.setrlimit(resource.RLIMIT_AS, (vm_bytes, vm_bytes))


def set_parent_death_signal(sig: int) -> None:
    """Receive ``sig`` when the parent process dies."""
    _libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)


def become_subreaper() -> None:
    """Orphans of our descendants are re-parented to us, so we can reap every one of them."""
    _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _mount_over(target: str, opts: bytes, keeps: tuple[str, ...]) -> bool:
    """Mount a fresh tmpfs on ``target``, then bind ``keeps`` (paths under it) back into it."""
    # Open the kept dirs before the mount hides them; bind them back through /proc/self/fd.
    fds = [os.open(k, os.O_PATH | os.O_DIRECTORY) for k in keeps]
    umask = os.umask(0o022)  # the dirs leading to a keep: root's, 0755, whatever our umask
    try:
        if _libc.mount(b"tmpfs", target.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, opts) != 0:
            return False
        for keep, fd in zip(keeps, fds, strict=True):
            os.makedirs(keep, 0o755, exist_ok=True)
            source = f"/proc/self/fd/{fd}".encode()
            if _libc.mount(source, keep.encode(), None, MS_BIND | MS_REC, None) != 0:
                return False
            # read-only for calls: nothing one call does there reaches the next
            flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV
            if _libc.mount(None, keep.encode(), None, flags, None) != 0:
                return False
        return True
    finally:
        os.umask(umask)
        for fd in fds:
            os.close(fd)


def _top_untraversable(path: str) -> str | None:
    current = "/"
    for part in [p for p in path.split("/") if p]:
        current = os.path.join(current, part)
        try:
            mode = os.stat(current).st_mode
        except OSError:
            return None
        if stat.S_ISDIR(mode) and not mode & stat.S_IXOTH:
            return current
    return None


def _outermost(paths: set[str]) -> list[str]:
    kept: list[str] = []
    for path in sorted(paths):
        if not any(path == k or path.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(path)
    return kept


def _mount_bind(source: str, target: str) -> int:
    """Bind ``source`` and the mounts under it (the keeps of a /tmp) onto ``target``."""
    rc: int = _libc.mount(source.encode(), target.encode(), None, MS_BIND | MS_REC, None)
    return rc


def _close_other_fds(keep_fds: tuple[int, ...]) -> None:
    low = 3
    for fd in sorted(keep_fds):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 20)


def current_vm_bytes() -> int:
    """This process's address-space size. Raw ``os`` calls: a child reads it on the pre-call
    path, and ``open()``'s buffered-text stack costs ~0.2 ms of copy-on-write faults there."""
    fd = os.open("/proc/self/statm", os.O_RDONLY)
    try:
        pages = int(os.read(fd, 256).split()[0])
    finally:
        os.close(fd)
    return pages * os.sysconf("SC_PAGE_SIZE")
