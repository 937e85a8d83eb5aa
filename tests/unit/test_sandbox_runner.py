"""What a call sees: a real Python script (fds, argv, __main__, exit paths) in both modes, and C++.

These run through the embedded pool: the runner rewires the process's own file descriptors, so it
can only be exercised in a sandbox child.
"""

from __future__ import annotations

import shutil

import pytest
import pytest_asyncio

from sandbox_pool import ExecRequest, Limits, PoolConfig, SandboxPool
from sandbox_pool.runner import format_cell_error

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool():
    async with SandboxPool(PoolConfig(num_workers=2, limits=Limits(timeout_s=3.0))) as p:
        yield p


async def run(pool: SandboxPool, code: str, **kw):
    return await pool.execute(ExecRequest(code=code, **kw))


async def test_cell_error_names_type_line_and_source():
    try:
        exec(compile("x = 1\ny = [1][x]\n", "/w/main.py", "exec"), {})
    except IndexError as exc:
        text = format_cell_error(exc, "x = 1\ny = [1][x]\n", "/w/main.py")
    assert text == "IndexError at line 2: list index out of range\n    y = [1][x]\n"


async def test_cell_mode_prints_the_final_expression(pool):
    r = await run(pool, "x = 21\nx * 2")
    assert (r.status, r.stdout, r.stderr, r.exit_code) == ("ok", "42\n", "", 0)
    assert (await run(pool, "x = None\nx")).stdout == ""


async def test_script_mode_does_not(pool):
    r = await run(pool, "print('a')\n'b'", mode="script")
    assert r.stdout == "a\n"


async def test_cell_errors_keep_prior_output(pool):
    r = await run(pool, "print('before')\nx = (1,\n")
    assert r.status == "error" and r.stdout == ""  # a syntax error runs nothing
    assert r.stderr.startswith("SyntaxError at line 2:")
    r = await run(pool, "print('before')\n1 / 0")
    assert r.stdout == "before\n" and r.exit_code == 1
    assert r.stderr == "ZeroDivisionError at line 2: division by zero\n    1 / 0\n"


async def test_script_errors_are_python_tracebacks(pool):
    r = await run(pool, "print('before')\n1 / 0", mode="script")
    assert r.stdout == "before\n" and r.exit_code == 1 and r.status == "error"
    assert r.stderr.startswith('Traceback (most recent call last):\n  File "')
    assert 'main.py", line 2, in <module>' in r.stderr
    assert r.stderr.rstrip().endswith("ZeroDivisionError: division by zero")
    assert "sandbox_pool" not in r.stderr  # no frame of ours


async def test_streams_are_real_file_descriptors(pool):
    code = (
        "import os, sys, subprocess\n"
        "sys.stdout.buffer.write(b'buffer\\n')\n"
        "os.write(sys.stdout.fileno(), b'fd1\\n')\n"
        "os.system('echo from-shell')\n"
        "subprocess.run(['cat'])\n"  # the child reads the same stdin fd
        "print('rest:', repr(open(0).read()))\n"
        "os.write(2, b'fd2\\n')\n"
    )
    r = await run(pool, code, stdin="line1\nline2\n", mode="script")
    assert r.stdout == "buffer\nfd1\nfrom-shell\nline1\nline2\nrest: ''\n", r
    assert r.stderr == "fd2\n"
    r = await run(pool, "print(input())\nprint(input())", stdin="a\nb\n")
    assert r.stdout == "a\nb\n"


async def test_missing_stdin_is_an_eof_error(pool):
    r = await run(pool, "print(input())", mode="script")
    assert r.exit_code == 1 and "EOFError" in r.stderr


async def test_argv_file_and_main_module(pool):
    code = (
        "import sys, os, pickle\n"
        "def f(): return 7\n"
        "print(len(sys.argv), sys.argv[0] == __file__, os.path.basename(__file__))\n"
        "print(sys.path[0] == os.path.dirname(__file__) == os.getcwd())\n"
        "print(pickle.loads(pickle.dumps(f))())\n"  # functions pickle by reference to __main__
    )
    r = await run(pool, code, mode="script")
    assert r.stdout == "1 True main.py\nTrue\n7\n", r


async def test_output_survives_os_exit_and_crashes(pool):
    r = await run(pool, "import os\nprint('kept')\nos._exit(1)")
    assert (r.status, r.stdout, r.exit_code) == ("error", "kept\n", 1)
    r = await run(pool, "import os\nprint('kept')\nos._exit(0)")
    assert (r.status, r.stdout, r.exit_code) == ("ok", "kept\n", 0)
    r = await run(pool, "import posix\nprint('kept')\nposix._exit(3)")  # the unhooked path
    assert (r.status, r.stdout, r.exit_code) == ("error", "kept\n", 3)
    r = await run(pool, "import ctypes\nprint('kept')\nctypes.string_at(0)")
    assert r.stdout == "kept\n" and r.exit_code == 139 and "SIGSEGV" in r.stderr


async def test_a_timeout_keeps_what_was_printed(pool):
    r = await run(pool, "import time\nprint('partial')\ntime.sleep(30)", timeout_s=0.5)
    assert r.status == "timeout" and r.stdout == "partial\n"
    assert r.stderr == "TimeoutError: execution exceeded 0.5 s"


async def test_exit_codes_and_interpreter_shutdown(pool):
    assert (await run(pool, "import sys; sys.exit(0)")).status == "ok"
    r = await run(pool, "import sys; sys.exit(3)")
    assert (r.status, r.exit_code) == ("error", 3)
    r = await run(pool, "import sys; sys.exit('bad')")
    assert (r.exit_code, r.stderr) == (1, "bad\n")
    code = (
        "import atexit, threading, time\n"
        "atexit.register(lambda: print('atexit'))\n"
        "t = threading.Thread(target=lambda: (time.sleep(0.2), print('thread')))\n"
        "t.start()\n"
        "print('main')\n"
    )
    assert (await run(pool, code, mode="script")).stdout == "main\nthread\natexit\n"


async def test_a_lingering_child_process_is_waited_for(pool):
    code = "import subprocess\nsubprocess.Popen(['sleep', '0.3'])\nprint('main done')"
    r = await run(pool, code)
    assert r.status == "ok" and r.duration_s >= 0.3
    code = "import subprocess\nsubprocess.Popen(['sleep', '30'])\nprint('main done')"
    r = await run(pool, code, timeout_s=0.5)
    assert r.status == "timeout" and r.stdout == "main done\n"


async def test_output_past_the_cap_is_cut_and_flagged(pool):
    r = await run(pool, "print('x' * 100_000)")
    assert r.status == "output_limit" and r.exit_code == 0
    assert r.stdout == "x" * Limits().max_output_chars
    r = await run(pool, "print('y' * 5000)", max_output_chars=10)
    assert r.status == "output_limit" and r.stdout == "y" * 10


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
async def test_cpp_compiles_and_runs_with_stdin(pool):
    code = "#include <iostream>\nint main(){int a,b;std::cin>>a>>b;std::cout<<a+b<<'\\n';}"
    r = await run(pool, code, language="cpp", stdin="2 3")
    assert (r.status, r.stdout, r.exit_code) == ("ok", "5\n", 0), r
    r = await run(pool, "int main(){return 0}", language="cpp")
    assert r.status == "error" and "error: expected" in r.stderr
    r = await run(pool, "int main(){for(;;);}", language="cpp", timeout_s=0.5)
    assert r.status == "timeout"
    r = await run(pool, "int main(){return 4;}", language="cpp")
    assert (r.status, r.exit_code) == ("error", 4)
