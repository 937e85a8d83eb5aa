"""A seccomp filter for sandbox children: no kernel keyrings.

Kernel keyrings are the one piece of kernel state that outlives every process of a uid: a
uid's user and session keyrings stay registered after its processes are gone (Linux >= 5.3),
and the pool hands uids out again, so a call could read keys a call before it stored (and use
up the uid's key quota). ``add_key``, ``request_key`` and ``keyctl`` therefore fail with EPERM
(what Docker's default profile does), and so does every syscall of another ABI (x32, i386),
where the same calls have other numbers. Everything else is allowed. The filter is inherited by
every process a call starts, across ``execve``.

Installed with ``prctl(PR_SET_SECCOMP)``, which needs no-new-privileges (or CAP_SYS_ADMIN).
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct

_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_RET_ALLOW = 0x7FFF0000
_RET_EPERM = 0x00050000 | errno.EPERM
_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K
_X32_BIT = 0x40000000

# audit arch, (add_key, request_key, keyctl), whether the arch has an x32-style alias range
_ARCHES = {
    "x86_64": (0xC000003E, (248, 249, 250), True),
    "aarch64": (0xC00000B7, (217, 218, 219), False),
}

_libc = ctypes.CDLL(None, use_errno=True)


class _Filter(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


def keyring_filter(machine: str) -> bytes:
    """The BPF program (struct sock_filter[]) for ``machine``; ValueError if unsupported."""
    if machine not in _ARCHES:
        raise ValueError(f"no seccomp filter for {machine}")
    arch, denied, has_x32 = _ARCHES[machine]
    prog: list[tuple[int, int, int, int]] = [
        (_LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
        (_JEQ_K, 1, 0, arch),
        (_RET_K, 0, 0, _RET_EPERM),  # another ABI
        (_LD_W_ABS, 0, 0, 0),  # seccomp_data.nr
    ]
    checks = [(_JGE_K, _X32_BIT)] if has_x32 else []
    checks += [(_JEQ_K, nr) for nr in denied]
    for i, (op, k) in enumerate(checks):
        prog.append((op, len(checks) - i, 0, k))  # jump to the EPERM return below
    prog += [(_RET_K, 0, 0, _RET_ALLOW), (_RET_K, 0, 0, _RET_EPERM)]
    return b"".join(struct.pack("HBBI", *ins) for ins in prog)


_PROGRAM: tuple[bytes, _Filter] | None = None


def prepare() -> None:
    """Build the filter now (the zygote does, once: its children only install it)."""
    _program()


def _program() -> _Filter:
    global _PROGRAM
    if _PROGRAM is None:
        program = keyring_filter(platform.machine())
        _PROGRAM = (program, _Filter(len(program) // 8, program))
    return _PROGRAM[1]


def deny_keyrings() -> None:
    """Install the filter in this process (and so in everything it starts); OSError if the
    kernel refuses it. Call after no-new-privileges is set."""
    fprog = _program()
    if _libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"seccomp filter refused: {errno.errorcode.get(err, err)}")
