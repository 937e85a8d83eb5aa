"""The HTTP service on a real embedded pool: native API, code-judge shapes, 429, auth, client."""

from __future__ import annotations

import asyncio
import socket
import time

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from sandbox_pool import ClientConfig, ExecRequest, Limits, PoolConfig, SandboxClient, SandboxPool
from sandbox_pool.server import SandboxServer, ServerConfig

# /healthz answers from the event loop, never behind a call: well under the 1 s a call blocked
# behind it would take, with room for a loaded machine running other tests beside it
HEALTHZ_S = 0.5


@pytest.fixture
async def service():
    pool = SandboxPool(PoolConfig(num_workers=2, limits=Limits(timeout_s=2.0)))
    await pool.start()
    server = SandboxServer(pool, ServerConfig(max_pending=8))
    test_server = TestServer(server.build_app())
    await test_server.start_server()
    async with aiohttp.ClientSession() as session:
        yield test_server, session, server
    await test_server.close()
    await pool.aclose()


def url(ts: TestServer, path: str) -> str:
    return str(ts.make_url(path))


async def test_native_execute_and_batch(service):
    ts, s, _ = service
    async with s.post(url(ts, "/v1/execute"), json={"code": "1 + 1"}) as r:
        body = await r.json()
    assert r.status == 200
    assert body["status"] == "ok" and body["stdout"] == "2\n" and body["exit_code"] == 0
    assert set(body) == {"status", "stdout", "stderr", "exit_code", "duration_s"}
    reqs = [{"code": "print(input())", "stdin": str(i)} for i in range(5)]
    async with s.post(url(ts, "/v1/execute/batch"), json={"requests": reqs}) as r:
        results = (await r.json())["results"]
    assert [x["stdout"] for x in results] == [f"{i}\n" for i in range(5)]


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"{not json", "not valid JSON"),
        (b'{"code": 3}', "'code' must be a string"),
        (b'{"code": "1", "extra": 1}', "unknown field"),
        (b'{"code": "1", "timeout_s": -1}', "'timeout_s' must be a positive finite number"),
        (b'{"requests": []}', "non-empty"),
    ],
)
async def test_bad_requests_are_4xx_with_a_reason(service, body, needle):
    ts, s, _ = service
    path = "/v1/execute/batch" if b"requests" in body else "/v1/execute"
    async with s.post(url(ts, path), data=body) as r:
        assert r.status == 400
        assert needle in (await r.json())["error"]


async def test_oversize_body_is_413(service):
    ts, s, _ = service
    async with s.post(url(ts, "/v1/execute"), data=b"x" * (17 * 1024 * 1024)) as r:
        assert r.status == 413


async def test_backpressure_is_429_never_a_drop(service):
    ts, s, server = service

    async def one():
        async with s.post(
            url(ts, "/v1/execute"), json={"code": "import time; time.sleep(0.3)"}
        ) as r:
            return r.status, r.headers.get("Retry-After")

    answers = await asyncio.gather(*(one() for _ in range(20)))
    statuses = [a[0] for a in answers]
    assert statuses.count(200) >= 8 and statuses.count(429) >= 1
    assert set(statuses) == {200, 429}
    assert all(a[1] == "1" for a in answers if a[0] == 429)
    assert server.pending == 0


async def test_metrics_and_health(service):
    ts, s, _ = service
    await (await s.post(url(ts, "/v1/execute"), json={"code": "print(1)"})).read()
    start = time.perf_counter()
    async with s.get(url(ts, "/healthz")) as r:
        assert r.status == 200 and (await r.json())["status"] == "ok"
    assert time.perf_counter() - start < HEALTHZ_S
    async with s.get(url(ts, "/metrics")) as r:
        text = await r.text()
    for name in (
        'sandbox_calls_total{status="ok"}',
        "sandbox_call_seconds_bucket",
        "sandbox_in_flight",
        "sandbox_queue_depth",
    ):
        assert name in text


async def test_bearer_token():
    async with SandboxPool(PoolConfig(num_workers=1)) as pool:
        server = SandboxServer(pool, ServerConfig(token="s3cret"))
        ts = TestServer(server.build_app())
        await ts.start_server()
        async with aiohttp.ClientSession() as s:
            async with s.post(url(ts, "/v1/execute"), json={"code": "1"}) as r:
                assert r.status == 401
            async with s.get(url(ts, "/healthz")) as r:
                assert r.status == 200
        async with SandboxClient(url(ts, "/"), ClientConfig(token="s3cret")) as client:
            assert (await client.run("print(5)")).stdout == "5\n"
        await ts.close()


async def test_client_batches_and_retries(service):
    ts, _, _ = service
    async with SandboxClient(url(ts, "/"), ClientConfig(max_batch=16)) as client:
        results = await client.run_batch([ExecRequest(code=f"{i} * 3") for i in range(40)])
        assert [r.stdout for r in results] == [f"{i * 3}\n" for i in range(40)]
        assert client.batches_sent >= 1
    # 40 calls against max_pending 8: batches got 429 and were retried, nothing was lost


async def test_client_sends_every_request_field(service):
    ts, _, _ = service
    async with SandboxClient(url(ts, "/")) as client:
        script = await client.execute(ExecRequest(code="print('a')\n'b'", mode="script"))
        capped = await client.execute(ExecRequest(code="print('x' * 50)", max_output_chars=5))
    assert script.stdout == "a\n"
    assert (capped.status, capped.stdout) == ("output_limit", "xxxxx")


async def test_client_reports_an_unreachable_service():
    async with SandboxClient("http://127.0.0.1:9", ClientConfig(max_wait_s=0.2)) as client:
        result = await client.run("print(1)")
    assert result.status == "internal_error" and "unreachable" in result.stderr


HOSTILE = {
    "infinite_loop": "while True:\n    pass",
    "memory_hog": "x = bytearray(2000 * 1024 * 1024)",
    "fork_bomb": (
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    ),
    "output_flood": "while True:\n    print('x' * 4096)",
    "signal_server": (
        "import os, signal\nfor pid in range(2, 5000):\n"
        "    try:\n        os.kill(pid, signal.SIGKILL)\n    except OSError:\n        pass"
    ),
    "disk_fill": "f = open('big', 'wb')\nwhile True:\n    f.write(b'x' * (1 << 20))",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
async def test_hostile_snippets_leave_the_server_healthy(service, name):
    ts, s, _ = service
    async with s.post(url(ts, "/v1/execute"), json={"code": HOSTILE[name], "timeout_s": 1}) as r:
        body = await r.json()
    assert r.status == 200, body
    expected = {"infinite_loop": "timeout", "memory_hog": "memory", "output_flood": "output_limit"}
    if name in expected:
        assert body["status"] == expected[name], body
    start = time.perf_counter()
    async with s.get(url(ts, "/healthz")) as r:
        assert r.status == 200
    assert time.perf_counter() - start < HEALTHZ_S
    async with s.post(url(ts, "/v1/execute"), json={"code": "print('alive')"}) as r:
        assert (await r.json())["stdout"] == "alive\n"


async def test_cli_serve_starts_answers_and_stops(tmp_path):
    import os
    import signal
    import socket
    import subprocess
    import sys

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "sandbox_pool.cli", "serve", "--port", str(port), "--workers", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert "serving on" in proc.stdout.readline()
        execute = f"http://127.0.0.1:{port}/v1/execute"
        async with aiohttp.ClientSession() as s, s.post(execute, json={"code": "7 * 6"}) as r:
            assert (await r.json())["stdout"] == "42\n"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0, proc.stderr.read()
    assert os.path.exists(sys.executable)


async def test_the_runtime_uses_a_server_and_refuses_one_that_does_not_answer(service):
    """``sandbox.mode: http`` in a run: the limits of the section go with every call (here a
    memory cap the server's default would allow); a URL where nothing answers stops the run at
    start with the key named."""
    from rstar2.config import ConfigError, HttpSandboxConfig
    from rstar2.runtime import Runtime
    from rstar2.runtime.placement import LocalPlacement

    ts, _, _ = service
    async with Runtime(LocalPlacement()) as runtime:
        section = HttpSandboxConfig(mode="http", url=url(ts, "/"))
        async with runtime.sandbox(section) as sandbox:
            ok = await sandbox.execute(ExecRequest(code="print('hi')", memory_mb=256))
            big = await sandbox.execute(
                ExecRequest(code="x = bytearray(400 * 2**20)\nprint('no')", memory_mb=256)
            )
        assert (ok.status, ok.stdout) == ("ok", "hi\n")
        assert big.stdout != "no\n" and (big.status != "ok" or big.exit_code != 0)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dead = HttpSandboxConfig(mode="http", url=f"http://127.0.0.1:{port}")
        with pytest.raises(ConfigError) as info:
            async with runtime.sandbox(dead):
                pass
        assert info.value.key == "sandbox.url"
