"""Drive a code-judge-compatible server with the public rStar2 client, unchanged."""

import asyncio
import json
import os
import re
import sys
import time

import aiohttp

sys.path.insert(0, os.environ["RSTAR2_TOOLS"])
from code_judge_utils import (
    generate_tool_call_code,
    generate_tool_call_input,
    run_tool_calls_on_server_async,
)
from request_processor import RequestProcessor

CELLS = {
    "zero_division": "print('step 1')\nx = 1 / 0",
    "syntax": "print('a'\n",
    "missing_stdin": "n = int(input())\nprint(n)",
    "name_error": "print('before')\nprint(undefined_name)",
    "exit0_after_print": "import os\nprint('done')\nos._exit(0)",
    "sys_exit_1": "import sys\nprint('x')\nsys.exit(1)",
    "big_output": "print('x' * 5000)",
    "final_expr": "a = 3\na * 7",
    "stdout_buffer": "import sys\nsys.stdout.buffer.write(b'raw\\n')\nprint('ok')",
    "os_system": "import os\nos.system('echo shell')",
    "sympy": "import sympy as sp\nx = sp.symbols('x')\nprint(sp.solve(x**2 - 4, x))",
    "stdin_ok": ("print(input()[::-1])", "abc"),
}


def call(name, body):
    code, stdin = body if isinstance(body, tuple) else (body, "")
    return {"name": "python_code_with_standard_io", "arguments": {"code": code, "input": stdin}}


async def cells(port):
    conn = aiohttp.TCPConnector(limit=32, force_close=True, enable_cleanup_closed=True)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=60)) as s:
        out = await run_tool_calls_on_server_async(
            [call(n, b) for n, b in CELLS.items()],
            s,
            generate_tool_call_code=generate_tool_call_code,
            generate_tool_call_input=generate_tool_call_input,
            host_addr="127.0.0.1",
            host_port=str(port),
        )
    return {
        n: re.sub(r"execution time: [0-9.]+s", "execution time: Xs", o)
        for n, o in zip(CELLS, out, strict=True)
    }


async def load(port, n=2000, concurrency=64, batch=32):
    from functools import partial

    fn = partial(
        run_tool_calls_on_server_async,
        generate_tool_call_code=generate_tool_call_code,
        generate_tool_call_input=generate_tool_call_input,
        host_addr="127.0.0.1",
        host_port=str(port),
    )
    conn = aiohttp.TCPConnector(limit=concurrency, force_close=True, enable_cleanup_closed=True)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=60)) as s:
        rp = RequestProcessor(
            batch_size=batch,
            batch_timeout_seconds=1,
            session=s,
            concurrency=concurrency,
            batch_submit_func=fn,
        )
        await rp.start()
        t = time.perf_counter()
        payloads = [call("x", (f"print({i} * 2)", "")) for i in range(n)]
        results = await rp.send_requests(payloads)
        wall = time.perf_counter() - t
        await rp.stop()
    lost = sum(isinstance(r, BaseException) for r in results)
    wrong = sum(
        1
        for i, r in enumerate(results)
        if not isinstance(r, BaseException) and f"stdout: {i * 2}\n" not in r
    )
    return {"calls": n, "lost": lost, "wrong": wrong, "wall_s": round(wall, 1)}


if __name__ == "__main__":
    what, port = sys.argv[1], int(sys.argv[2])
    if what == "cells":
        print(json.dumps(asyncio.run(cells(port))))
    else:
        print(json.dumps(asyncio.run(load(port))))
