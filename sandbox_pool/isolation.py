"""Process isolation applied inside a freshly forked sandbox child (Linux).

Set-up in three places, so that nothing slow happens once a call arrives:
- :func:`enter_shared_namespaces` (zygote start): mount and network namespaces shared by all
  children, with private temp dirs, a hidden /root (or wherever Python lives) and /proc.
- :func:`fork_into_namespaces` + :func:`prepare` (pre-fork time): each child is PID 1 of its own
  PID namespace, so when it dies the kernel kills everything it started; own session and process
  group, cwd in its own temp dir, stdio redirected, other descriptors closed.
- :func:`drop_privileges` (still before the call): rlimits on processes, file size, open files
  and core dumps (soft = hard), an unprivileged per-slot uid/gid with no supplementary groups
  when the service runs as root, no-new-privileges, death with its parent, a scrubbed
  environment.
- :func:`limit_call` (when the call arrives): CPU seconds and address space, lowered to the
  call's own limits (an unprivileged process can lower limits, never raise them).
What each phase could not apply is returned as notes (see the module docstring of sandbox_pool).
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import platform
import resource
import shutil
import signal
import stat
import sys
from dataclasses import dataclass

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
CLONE_NEWPID = 0x20000000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
MS_BIND = 4096
MS_NOSUID = 2
MS_NODEV = 4
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
PR_SET_CHILD_SUBREAPER = 36
SHARED_TMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_SYS_CLONE = {"x86_64": 56, "aarch64": 220}.get(platform.machine())
_SIGCHLD = 17


def fork_into_namespaces() -> tuple[int, bool]:
    """Fork a child that is PID 1 of a new PID namespace.

    ``os.fork`` cannot do this in one step (``unshare(CLONE_NEWPID)`` works once per process),
    so this calls the clone syscall with fork semantics, bracketed by CPython's own pre/post
    fork hooks. Returns ``(pid, namespaced)`` like ``os.fork`` plus whether the namespaces were
    created; without privileges (or on another architecture) it falls back to ``os.fork``.
    A new PID namespace costs ~0.5 ms; mount and network namespaces are set up once for all
    children by :func:`enter_shared_namespaces` instead (they would cost ~3 ms per call).
    """
    if _SYS_CLONE is not None and is_root():
        api = ctypes.pythonapi
        api.PyOS_BeforeFork()
        flags = ctypes.c_ulong(CLONE_NEWPID | _SIGCHLD)
        pid = _libc.syscall(ctypes.c_long(_SYS_CLONE), flags, None, None, None, None)
        if pid == 0:
            api.PyOS_AfterFork_Child()
            return 0, True
        api.PyOS_AfterFork_Parent()
        if pid > 0:
            return pid, True
    return os.fork(), False


def enter_shared_namespaces(
    expose: list[tuple[str, tuple[str, ...]]], tmp_size_mb: int
) -> tuple[str | None, list[str]]:
    """Zygote start-up (as root): one private mount and network namespace for all children.

    - network: a new namespace whose only device, loopback, is down: every connect fails;
    - a fresh tmpfs (``tmp_size_mb``) over /tmp, bound over /var/tmp, /dev/shm and /run/lock,
      so the host's shared temp dirs are unreachable and everything written there can be purged;
    - directories the children's uids could not traverse on the way to the Python install
      (``expose``) are replaced by tmpfs with only the Python dirs bound back;
    - /proc remounted with ``hidepid=2``: a child sees only its own processes.
    Returns the folder for per-call temp dirs (None when this could not be done) and notes.
    """
    notes: list[str] = []
    if not is_root() or _libc.unshare(CLONE_NEWNS | CLONE_NEWNET) != 0:
        return None, ["no private mount/network namespaces (needs root)"]
    if _libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        return None, ["mount propagation could not be made private"]
    _expose_python(expose, notes)
    # Python that lives under /tmp (a checkout or venv there) stays visible inside the new /tmp.
    under_tmp = {p for p in python_paths() if p == "/tmp" or p.startswith("/tmp/")}
    keep = tuple(_outermost(under_tmp))
    if "/tmp" in keep:
        return None, [*notes, "Python lives in /tmp itself: /tmp cannot be made private"]
    opts = f"mode=1777,size={tmp_size_mb}m".encode()
    if not _mount_over("/tmp", opts, keep, notes):
        return None, [*notes, "could not mount a private /tmp"]
    for target in SHARED_TMP_DIRS[1:]:
        if os.path.isdir(target) and _mount_bind("/tmp", target) != 0:
            notes.append(f"could not cover {target}")
    if _libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV, b"hidepid=2") != 0:
        notes.append("could not remount /proc with hidepid=2")
    calls_dir = "/tmp/.calls"
    os.mkdir(calls_dir, 0o711)
    return calls_dir, notes


def purge_files_of(uid: int, root: str = "/tmp") -> None:
    """Delete what ``uid`` left in the shared tmpfs (it can write nowhere else there)."""
    with os.scandir(root) as entries:
        for entry in entries:
            try:
                owner = entry.stat(follow_symlinks=False).st_uid
            except OSError:
                continue
            if owner != uid:
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)


@dataclass(frozen=True, kw_only=True)
class StaticLimits:
    """Limits that do not depend on the call: applied before it arrives."""

    max_processes: int
    max_file_mb: int
    max_open_files: int


def is_root() -> bool:
    return os.geteuid() == 0


def python_paths() -> set[str]:
    """Directories a child needs to import what the zygote has not: the Python install, every
    sys.path entry, and this package's own checkout (editable installs)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    needed = {sys.base_prefix, sys.prefix, sys.exec_prefix, here}
    needed |= {p for p in sys.path if os.path.isabs(p) and os.path.isdir(p)}
    return {os.path.realpath(p) for p in needed}


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


def prepare(workdir: str, keep_fds: tuple[int, ...]) -> None:
    """In a fresh child, before its call: own session and process group, default signal
    dispositions, cwd in its temp dir, stdio redirected, every other descriptor closed."""
    os.setsid()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # over-size writes fail with EFBIG instead
    os.chdir(workdir)
    _redirect_stdio(workdir)
    _close_other_fds(keep_fds)


def drop_privileges(uid: int | None, limits: StaticLimits) -> None:
    """Before the call arrives: static rlimits, unprivileged uid, no new privileges.

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
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # cleared by setuid: set after it


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


def limit_call(timeout_s: float, memory_mb: int, base_vm_bytes: int) -> None:
    """The call's CPU-seconds and address-space caps (soft = hard: final).

    ``memory_mb`` is what the snippet may allocate on top of ``base_vm_bytes``, the child's
    address space when it became ready (:func:`current_vm_bytes`).
    """
    cpu_s = math.ceil(timeout_s) + 1
    vm_bytes = base_vm_bytes + memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
    resource.setrlimit(resource.RLIMIT_AS, (vm_bytes, vm_bytes))


def set_parent_death_signal(sig: int) -> None:
    """Receive ``sig`` when the parent process dies."""
    _libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)


def become_subreaper() -> None:
    """Orphans of our descendants are re-parented to us, so we can reap every one of them."""
    _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _expose_python(plan: list[tuple[str, tuple[str, ...]]], notes: list[str]) -> None:
    for hidden, keeps in plan:
        if not _mount_over(hidden, b"mode=755,size=1m", keeps, notes):
            notes.append(f"could not hide {hidden}")


def _mount_over(target: str, opts: bytes, keeps: tuple[str, ...], notes: list[str]) -> bool:
    """Mount a fresh tmpfs on ``target``, then bind ``keeps`` (paths under it) back into it."""
    # Open the kept dirs before the mount hides them; bind them back through /proc/self/fd.
    fds = [os.open(k, os.O_PATH | os.O_DIRECTORY) for k in keeps]
    try:
        if _libc.mount(b"tmpfs", target.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, opts) != 0:
            return False
        for keep, fd in zip(keeps, fds, strict=True):
            os.makedirs(keep, exist_ok=True)
            source = f"/proc/self/fd/{fd}".encode()
            if _libc.mount(source, keep.encode(), None, MS_BIND | MS_REC, None) != 0:
                notes.append(f"could not keep {keep} visible")
        return True
    finally:
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
    rc: int = _libc.mount(source.encode(), target.encode(), None, MS_BIND, None)
    return rc


def _redirect_stdio(workdir: str) -> None:
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    out = os.open(os.path.join(workdir, ".fd_output"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)


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
