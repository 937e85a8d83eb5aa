"""A sandbox child's life, from the fork to its end: isolate, prepare, serve exactly one call.

Runs in the process the zygote has just forked (:mod:`sandbox_pool.zygote`); it never returns.
It writes ``{"ready": true}`` on its result pipe once isolated, reads one call frame, runs it
(:class:`sandbox_pool.runner.Runner`), reports how it ended, and parks until the pool kills it.
"""

from __future__ import annotations

import contextlib
import os
import signal
from typing import TYPE_CHECKING, Any

from sandbox_pool import isolation, runner
from sandbox_pool.protocol import FrameReader, encode_frame, write_all

if TYPE_CHECKING:
    from sandbox_pool.namespaces import CallNamespaces
    from sandbox_pool.zygote import ZygoteConfig

_READ_CHUNK = 1 << 16
CALL_DIR = "/tmp/sandbox-call"  # an isolated call's working directory, in its own /tmp


def child_main(
    cfg: ZygoteConfig,
    workdir: str | None,
    uid: int | None,
    slot: CallNamespaces | None,
    job_r: int,
    res_w: int,
    stdio: tuple[int, int],
    deny_keyrings: bool,
) -> None:
    """In the fresh child: isolate, drop privileges, then serve exactly one call.

    (Pre-faulting the call path here was measured: it makes an idle machine's call ~0.2 ms
    faster but costs more than that in CPU under load, so children do not warm up.)
    """
    signal.set_wakeup_fd(-1)
    try:
        if workdir is None:  # isolated: a /tmp and a network of its own, the call's dir in it
            assert slot is not None
            slot.enter()
            workdir = CALL_DIR
            os.mkdir(workdir, 0o700)
            if uid is not None:
                os.chown(workdir, uid, uid)
        isolation.prepare(workdir, *stdio, keep_fds=(job_r, res_w))
        static = isolation.StaticLimits(
            max_processes=cfg.max_processes,
            max_file_mb=cfg.max_file_mb,
            max_open_files=cfg.max_open_files,
        )
        isolation.drop_privileges(uid, static, deny_keyrings=deny_keyrings)
        prepared = runner.runner_for(workdir)
        base_vm_bytes = isolation.current_vm_bytes()
        write_all(res_w, encode_frame({"ready": True}))
    except BaseException:
        os._exit(1)
    _runner_main(job_r, res_w, prepared, base_vm_bytes)  # never returns


def _runner_main(job_r: int, res_w: int, prepared: runner.Runner, base_vm_bytes: int) -> None:
    code = 0
    try:
        call = _read_frame(job_r)
        os.close(job_r)
        memory_mb = int(call["memory_mb"])
        if call.get("language") == "cpp":  # the compiler runs under the cap too, not below 1 GiB
            memory_mb = max(memory_mb, 1024)
        isolation.limit_call(float(call["timeout_s"]), memory_mb, base_vm_bytes)

        def report(msg: dict[str, Any]) -> None:
            write_all(res_w, encode_frame(msg))

        prepared.run(call, report)
        while True:  # parked: the pool SIGKILLs the group at idle priority (cheap teardown)
            signal.pause()
    except BaseException as exc:
        code = 1
        with contextlib.suppress(BaseException):
            message = f"sandbox child failed: {type(exc).__name__}: {exc}"
            write_all(res_w, encode_frame({"status": "internal_error", "stderr": message}))
    finally:
        os._exit(code)


def _read_frame(fd: int) -> Any:
    reader = FrameReader()
    while True:
        data = os.read(fd, _READ_CHUNK)
        if not data:
            raise EOFError("the pool closed the call pipe")
        frames = reader.feed(data)
        if frames:
            return frames[0]
