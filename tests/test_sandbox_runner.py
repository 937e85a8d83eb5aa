"""The in-child execution semantics (pure: no processes)."""

from __future__ import annotations

from sandbox_pool.runner import run_code


def test_final_expression_is_printed():
    out = run_code("x = 21\nx * 2", "", 1000)
    assert out == {"status": "ok", "stdout": "42\n", "stderr": "", "exit_code": 0}


def test_none_and_statements_print_nothing():
    assert run_code("x = None\nx", "", 1000)["stdout"] == ""
    assert run_code("for i in range(2): pass", "", 1000)["stdout"] == ""


def test_stdin_feeds_input():
    assert (
        run_code("a = input()\nb = input()\nprint(int(a) + int(b))", "2\n3\n", 1000)["stdout"]
        == "5\n"
    )


def test_exception_names_type_line_and_source():
    out = run_code("x = 1\ny = [1][x]\n", "", 1000)
    assert out["status"] == "error" and out["exit_code"] == 1
    assert out["stderr"] == "IndexError at line 2: list index out of range\n    y = [1][x]\n"


def test_syntax_error_is_reported_like_an_exception():
    out = run_code("x = (1,\n", "", 1000)
    assert out["status"] == "error"
    assert out["stderr"].startswith("SyntaxError at line 1:")


def test_sys_exit_codes():
    assert run_code("import sys; sys.exit(0)", "", 1000)["status"] == "ok"
    out = run_code("import sys; sys.exit(3)", "", 1000)
    assert out["status"] == "error" and out["exit_code"] == 3


def test_output_cap():
    out = run_code("while True: print('x' * 100)", "", 1000)
    assert out["status"] == "output_limit" and len(out["stdout"]) == 1000


def test_output_cap_survives_catching_everything():
    code = (
        "for _ in range(10**6):\n"
        "    try:\n        print('y' * 50)\n    except BaseException:\n        pass"
    )
    out = run_code(code, "", 500)
    assert out["status"] == "output_limit" and len(out["stdout"]) == 500
