"""rStar2's reward path (reward/server.py's prefix and suffix, read from it) via its client."""

import ast
import asyncio
import base64
import json
import os
import re
import sys
import time

import aiohttp

sys.path.insert(0, os.environ["RSTAR2_TOOLS"])
from code_judge_utils import run_tool_calls_on_server_async

with open(os.path.join(os.environ["RSTAR2_DIR"], "rstar2_agent/reward/server.py")) as fh:
    src = fh.read()
consts = {
    t.id: n.value.value
    for n in ast.parse(src).body
    if isinstance(n, ast.Assign)
    for t in n.targets
    if isinstance(t, ast.Name) and isinstance(n.value, ast.Constant)
}
prefix, suffix = consts["verify_math_prefix"], consts["verify_math_suffix"]

CASES = [
    (f"Reasoning... so the answer is \\boxed{{{ans}}}.", str(gt), ans == gt)
    for ans, gt in [
        (42, 42),
        (41, 42),
        ("\\frac{1}{2}", "0.5"),
        ("7", "7"),
        ("x^2", "x^2"),
        ("3", "4"),
        ("\\sqrt{2}", "\\sqrt{2}"),
        ("100", "10^2"),
        ("12", "13"),
        ("-1", "-1"),
        ("5", "five?"),
        ("2\\pi", "2\\pi"),
        ("0", "1"),
        ("9", "9"),
        ("1000", "1000"),
        ("6", "8"),
    ]
]


def tool_call(sol, gt):
    a = base64.b64encode(sol.encode()).decode()
    b = base64.b64encode(gt.encode()).decode()
    return {"name": "compute_score", "arguments": {"code": prefix.format(a, b) + suffix}}


async def main(port):
    conn = aiohttp.TCPConnector(limit=32, force_close=True, enable_cleanup_closed=True)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=60)) as s:
        t = time.perf_counter()
        out = await run_tool_calls_on_server_async(
            [tool_call(sol, gt) for sol, gt, _ in CASES],
            s,
            generate_tool_call_code=lambda x: x["arguments"]["code"],
            generate_tool_call_input=lambda x: None,
            host_addr="127.0.0.1",
            host_port=str(port),
        )
        wall = time.perf_counter() - t
    scores = []
    for r in out:
        m = re.search(r"<result>(.*?)</result>", r)
        scores.append(float(m.group(1)) if m else 0.0)
    return {"scores": scores, "wall_s": round(wall, 1), "first": out[0][:300]}


print(json.dumps(asyncio.run(main(int(sys.argv[1])))))
