"""rstar2.console in this process: what reaches the console and what the log, and that leaving
the block (normally or by an error) puts fds 1/2, sys streams, warnings and env back."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
from tqdm import tqdm

from rstar2.console import LOGS_DIR_ENV, link_logs, run_console

OWN = ("tests",)  # this module's writes stand for rstar2's here


def _foreign(code: str) -> None:
    """Run ``code`` as a module that is not ours (a library)."""
    exec(compile(code, "<library>", "exec"), {"__name__": "library"})


def _state() -> dict[str, Any]:
    fds = sorted(os.listdir("/proc/self/fd"))
    return {
        "fd1": (os.fstat(1).st_dev, os.fstat(1).st_ino),
        "fd2": (os.fstat(2).st_dev, os.fstat(2).st_ino),
        "stdout": sys.stdout,
        "stderr": sys.stderr,
        "showwarning": warnings.showwarning,
        "py.warnings": list(logging.getLogger("py.warnings").handlers),
        "env": {
            k: os.environ.get(k)
            for k in (LOGS_DIR_ENV, "VLLM_LOGGING_COLOR", "RAY_TQDM_PATCH_PRINT")
        },
        "num_fds": len(fds),
    }


def test_our_writes_reach_the_console_and_the_rest_the_log(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    before = _state()
    with run_console(tmp_path / "logs", own_packages=OWN) as log:
        print("ours on stdout")
        print("ours on stderr", file=sys.stderr)
        for _ in tqdm(range(3), desc="our bar"):
            pass
        lonely = logging.getLogger("library.lonely")  # no handler: logging's last resort,
        lonely.propagate = False  # which writes to sys.stderr (pytest holds the root's)
        lonely.warning("library log record")
        handler = logging.StreamHandler()  # created now: it holds our console stream
        logging.getLogger("library.chatty").addHandler(handler)
        logging.getLogger("library.chatty").warning("library handler on sys.stderr")
        warnings.warn("library warning", stacklevel=1)
        _foreign("print('library print')")
        _foreign("from tqdm import tqdm\nfor _ in tqdm(range(3), desc='library bar'): pass")
        os.write(1, b"C code on fd 1\n")
        os.write(2, b"C code on fd 2\n")
        subprocess.run([sys.executable, "-c", "print('child process')"], check=True)
    assert _state() == before
    # a handler that took our console stream writes where sys.stderr now goes (not to a closed fd)
    logging.getLogger("library.chatty").warning("library handler after the block")
    logging.getLogger("library.chatty").removeHandler(handler)
    out, err = capfd.readouterr()
    assert err.endswith("library handler after the block\n") and "Logging error" not in err
    err = err.removesuffix("library handler after the block\n")
    assert out == "ours on stdout\n"
    assert err.startswith("ours on stderr\n") and "our bar: 100%" in err
    assert "library" not in out + err and "C code" not in err and "child" not in out
    text = log.read_text()
    for line in (
        "library log record",
        "library handler on sys.stderr",
        "UserWarning: library warning",
        "library print",
        "library bar: 100%",
        "C code on fd 1",
        "C code on fd 2",
        "child process",
    ):
        assert line in text, line
    assert "ours" not in text and "our bar" not in text


def test_our_prints_reach_the_console_after_ray_replaced_print(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ray replaces builtins.print with its own for the whole driver process once a worker's
    log or a cluster error (an engine actor that died) is printed there; our lines stay ours."""
    import builtins

    from ray.experimental import tqdm_ray

    # what tqdm_ray.instance() does, unless RAY_TQDM_PATCH_PRINT=0, when the driver first
    # prints a worker's line (restored after the test)
    monkeypatch.setattr(builtins, "print", tqdm_ray.safe_print)
    with run_console(tmp_path / "logs", own_packages=OWN) as log:
        print("ours through ray's print")
        print("ours on stderr through ray's print", file=sys.stderr)
        _foreign("print('library print through ray')")
    out, err = capfd.readouterr()
    assert out == "ours through ray's print\n"
    assert err == "ours on stderr through ray's print\n"
    assert "library print through ray" in log.read_text()


def test_the_block_keeps_ray_from_replacing_print(tmp_path: Path) -> None:
    code = (
        "import builtins, pathlib, sys\n"
        "from rstar2.console import run_console\n"
        "from ray.experimental import tqdm_ray\n"
        "with run_console(pathlib.Path(sys.argv[1])):\n"
        "    tqdm_ray.instance()\n"
        "    replaced = builtins.print is not tqdm_ray._print\n"
        "print(replaced)\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "logs")],
        capture_output=True, text=True, check=True, timeout=120,
        env={k: v for k, v in os.environ.items() if k != "RAY_TQDM_PATCH_PRINT"},
    )  # fmt: skip
    assert res.stdout == "False\n"


def test_an_error_restores_everything_and_names_the_log(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    before = _state()
    with (
        pytest.raises(RuntimeError, match="boom"),
        run_console(tmp_path / "logs", own_packages=OWN),
    ):
        os.write(2, b"the root cause\n")
        raise RuntimeError("boom")
    assert _state() == before
    assert f"library logs in {tmp_path / 'logs' / 'third_party.log'}" in capfd.readouterr().err


def test_a_block_that_left_no_library_output_leaves_no_new_folder(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A command stopped by a user error before any library ran writes no run folder."""
    with (
        pytest.raises(ValueError),
        run_console(tmp_path / "report" / "logs", own_packages=OWN),
    ):
        print("rstar2 eval: --n must be positive", file=sys.stderr)
        raise ValueError
    assert list(tmp_path.iterdir()) == []
    assert "library logs" not in capfd.readouterr().err  # no log to point at
    (tmp_path / "logs").mkdir()  # an existing folder (a resumed run's) keeps its log
    with run_console(tmp_path / "logs", own_packages=OWN) as log:
        pass
    assert log.is_file()


def test_a_second_run_appends_to_the_log(tmp_path: Path) -> None:
    for _ in range(2):
        with run_console(tmp_path / "logs", own_packages=OWN) as log:
            os.write(1, b"line\n")
    assert log.read_text().count("line\n") == 2
    assert log.read_text().count("=== ") == 2  # one header per command


def test_link_logs_names_a_folder_in_the_logs_of_the_command_running(tmp_path: Path) -> None:
    first, second = tmp_path / "session_1", tmp_path / "session_2"
    first.mkdir()
    second.mkdir()
    assert link_logs("ray", first) is None  # no command running: nowhere to name it
    with run_console(tmp_path / "logs", own_packages=OWN) as log:
        link = link_logs("ray", first)
        assert link == tmp_path / "logs" / "ray" and link.resolve() == first
        assert link_logs("ray", second) == link and link.resolve() == second  # a new session
        assert link_logs("gone", tmp_path / "missing") is None
    assert f"logs/ray -> {second}" in log.read_text()
