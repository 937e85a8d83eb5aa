"""Bad input at every endpoint of the sandbox service: each POST endpoint x each class of bad
body is a 4xx with a one-line reason (never a 500, never a hang), GET endpoints refuse a wrong
method, and the service still runs a call afterwards."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
import pytest_asyncio
from aiohttp.test_utils import TestServer

from sandbox_pool import Limits, PoolConfig, SandboxPool
from sandbox_pool.server import SandboxServer, ServerConfig

NATIVE = ("/v1/execute", "/v1/execute/batch")
CODE_JUDGE = tuple(f"{p}{s}" for p in ("/run", "/judge") for s in ("", "/batch", "/long-batch"))
GETS = ("/v1/status", "/healthz", "/metrics", "/ping", "/status")
MAX_BODY_MB = 1
DEEP = 100_000  # far past the JSON decoder's recursion limit

# A valid call on each endpoint, as a dict one bad field is put into.
_NATIVE_CALL = {"code": "print(1)"}
_CJ_CALL = {"type": "python", "solution": "print(1)"}


def _wrap(path: str, call: str) -> bytes:
    """``call`` (JSON text of one call) in the body ``path`` takes."""
    if path == "/v1/execute/batch":
        return f'{{"requests": [{call}]}}'.encode()
    if path.endswith("batch"):
        return f'{{"submissions": [{call}]}}'.encode()
    return call.encode()


def _bodies(path: str) -> dict[str, bytes]:
    """Every class of bad body for ``path``."""
    native = path in NATIVE
    field = "code" if native else "solution"
    number = "timeout_s" if native else "sub_id"  # a field whose type is not a huge number
    call = json.dumps(_NATIVE_CALL if native else _CJ_CALL)

    def with_field(key: str, raw: str) -> bytes:
        return _wrap(path, call[:-1] + f', "{key}": {raw}}}')

    return {
        "empty": b"",
        "malformed": b"{not json",
        "cut_off": _wrap(path, call)[:-3],
        "trailing_garbage": _wrap(path, call) + b" }",
        "not_utf8": _wrap(path, call).replace(b"print(1)", b"print(\xff\xfe1)"),
        "lone_surrogate": _wrap(path, call.replace("print(1)", "print(1)\\ud800")),
        "deeply_nested": b"[" * DEEP + b"]" * DEEP,
        "deeply_nested_in_a_field": with_field(
            "stdin" if native else "input", "[" * DEEP + "]" * DEEP
        ),
        "top_level_list": b"[1, 2, 3]",
        "top_level_null": b"null",
        "top_level_string": b'"print(1)"',
        "field_of_wrong_type": _wrap(path, call.replace('"print(1)"', "[1]")),
        "missing_field": _wrap(path, call.replace(f'"{field}"', '"other"')),
        "huge_integer": with_field(number, "1" + "0" * 5000),
        "nan": with_field(number, "NaN"),
        "infinity": with_field(number, "Infinity"),
        "oversized": b'{"code": "' + b"x" * (MAX_BODY_MB * 1024 * 1024) + b'"}',
    }


pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def service():
    """One service for the module: every test ends by checking it still serves."""
    pool = SandboxPool(PoolConfig(num_workers=1, limits=Limits(timeout_s=5.0)))
    await pool.start()
    server = SandboxServer(pool, ServerConfig(max_body_mb=MAX_BODY_MB, body_read_timeout_s=1.0))
    test_server = TestServer(server.build_app())
    await test_server.start_server()
    async with aiohttp.ClientSession() as session:
        yield test_server, session
    await test_server.close()
    await pool.aclose()


async def _still_serves(ts: TestServer, session: aiohttp.ClientSession) -> None:
    async with session.get(ts.make_url("/healthz")) as r:
        assert r.status == 200
    async with session.post(ts.make_url("/v1/execute"), json={"code": "print(6 * 7)"}) as r:
        assert r.status == 200 and (await r.json())["stdout"] == "42\n"


async def _one_line(response: aiohttp.ClientResponse) -> str:
    """The reason a 4xx gives: /v1's ``error`` or code-judge's first ``detail`` message."""
    text = await response.text()
    body = json.loads(text)
    if isinstance(body, dict) and "detail" in body:
        return str(body["detail"][0]["msg"])
    return str(body["error"]) if isinstance(body, dict) and "error" in body else text


@pytest.mark.parametrize("path", NATIVE + CODE_JUDGE)
async def test_every_bad_body_on_every_post_endpoint_is_a_4xx(service, path: str) -> None:
    ts, session = service
    answers = {}
    for name, body in _bodies(path).items():
        async with session.post(ts.make_url(path), data=body) as r:
            reason = await _one_line(r) if r.status != 413 else "too large"
            answers[name] = (r.status, reason)
    bad = {k: v for k, v in answers.items() if not 400 <= v[0] < 500 or "\n" in v[1]}
    assert not bad, bad
    expected = 400 if path in NATIVE else 422
    assert {k for k, (status, _) in answers.items() if status == 413} == {"oversized"}
    assert all(status == expected for k, (status, _) in answers.items() if k != "oversized")
    await _still_serves(ts, session)


async def _status_line(ts: TestServer, request: bytes) -> bytes:
    """Send ``request`` on a fresh connection that stays open, and read the answer's status
    line (a deadline far past the server's 1 s body timeout, so a server that waits forever
    fails here instead of hanging the suite)."""
    reader, writer = await asyncio.open_connection(ts.host, ts.port)
    writer.write(request)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.readline(), timeout=60)
    finally:
        writer.close()


@pytest.mark.parametrize("path", NATIVE + CODE_JUDGE)
async def test_a_body_shorter_than_its_content_length_is_a_4xx(service, path: str) -> None:
    ts, session = service
    body = _wrap(path, json.dumps(_NATIVE_CALL if path in NATIVE else _CJ_CALL))
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    answer = await _status_line(
        ts, f"{head}Content-Length: {len(body) + 50}\r\n\r\n".encode() + body
    )
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    await _still_serves(ts, session)


@pytest.mark.parametrize("path", NATIVE + CODE_JUDGE)
async def test_a_broken_chunked_body_is_a_400(service, path: str) -> None:
    ts, session = service
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    answer = await _status_line(ts, head.encode() + b"zz\r\n{}\r\n0\r\n\r\n")
    assert answer.split(b" ", 2)[1] == b"400", answer  # aiohttp's parser answers HTTP/1.0
    await _still_serves(ts, session)


@pytest.mark.parametrize("path", GETS)
async def test_get_endpoints_refuse_a_wrong_method(service, path: str) -> None:
    ts, session = service
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        async with session.request(method, ts.make_url(path), data=b"{}") as r:
            assert r.status == 405, (method, r.status)
    await _still_serves(ts, session)


@pytest.mark.parametrize("path", ("/v1/status", "/healthz", "/metrics"))
async def test_our_get_endpoints_refuse_a_query(service, path: str) -> None:
    """code-judge's /ping and /status ignore a query, as FastAPI does; ours take none."""
    ts, session = service
    async with session.get(ts.make_url(path).with_query(verbose="1")) as r:
        assert r.status == 400 and "verbose" in await _one_line(r)
    await _still_serves(ts, session)
