"""docker/sandbox.Dockerfile built for real (buildah, from a local Debian base made here) and run
as an OCI container (crun: own PID/mount/IPC namespaces, docker's default capabilities plus
CAP_SYS_ADMIN, a default seccomp profile, no --privileged): the sandbox's HTTP checks against it.

The build takes ~2-3 minutes on a 2-core machine (debootstrap ~30 s, the image ~1-2 min); its
log is kept in the test's temp folder and printed on failure.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.faults import free_port
from tests.helpers import oci
from tests.integration.test_sandbox_http import HOSTILE

REPO = Path(__file__).resolve().parents[2]
TAG = "localhost/rstar2-sandbox:test"

pytestmark = [
    pytest.mark.full,  # minutes: an image build (bash scripts/test.sh --full)
    # serial: the container's pool claims its uid block in its own /run, so it would hand out
    # the uids a host pool of a test running beside it holds (and share its process limit)
    pytest.mark.serial,
    pytest.mark.skipif(
        bool(oci.missing_binaries()) or os.geteuid() != 0,
        reason=f"needs root and {', '.join(oci.missing_binaries()) or 'nothing'} "
        "(scripts/install.sh dev installs them)",
    ),
    pytest.mark.timeout(900),
]


def _commit() -> str:
    out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[oci.Storage]:
    storage = oci.Storage(tmp_path_factory.mktemp("oci"))
    log = storage.root / "build.log"
    start = time.monotonic()
    try:
        base, digest = oci.debian_base(storage, log)
        based = time.monotonic()
        oci.build(
            storage,
            REPO,
            REPO / "docker" / "sandbox.Dockerfile",
            TAG,
            {"BASE_IMAGE": base, "BASE_DIGEST": digest, "RSTAR2_COMMIT": _commit()},
            log,
        )
    except subprocess.CalledProcessError as exc:
        pytest.fail(f"image build failed ({exc}):\n{log.read_text()[-6000:]}")
    print(
        f"\nsandbox image: base {based - start:.0f} s, build {time.monotonic() - based:.0f} s "
        f"(log {log})"
    )
    yield storage
    shutil.rmtree(storage.root, ignore_errors=True)  # vfs keeps a full copy per image: GBs


def _wait_healthy(
    proc: subprocess.Popen[bytes] | None,
    output: Callable[[], str],
    url: str,
    timeout_s: float = 120,
) -> None:
    """Until GET /healthz answers 200; fails at once, with ``output()``, if ``proc`` exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc is not None
        if proc.poll() is not None:
            pytest.fail(f"exited {proc.returncode}:\n{output()}")
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    pytest.fail(f"no answer on {url}/healthz in {timeout_s:.0f} s:\n{output()}")


@contextlib.contextmanager
def _chrooted(image: oci.Storage) -> Iterator[list[str]]:
    """``buildah run --isolation chroot`` of the image (no mount namespace of its own) with
    CAP_SYS_ADMIN: the command line to append ``-- CMD`` to; the working container is removed."""
    working = image.buildah("from", "--pull-never", TAG).stdout.strip()
    try:
        yield image.argv("run", "--isolation", "chroot", "--cap-add", "CAP_SYS_ADMIN", working)
    finally:
        image.buildah("rm", working)


@pytest.fixture(scope="module")
def service(image: oci.Storage) -> Iterator[tuple[oci.Container, str]]:
    port = free_port()
    args = ["serve", "--host", "127.0.0.1", "--port", str(port), "--workers", "2"]
    container = oci.Container(image, TAG, "sandbox-test", args, cap_add=["CAP_SYS_ADMIN"])
    with container:
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(container.proc, container.output, url)
        yield container, url
    assert container.proc is not None and container.proc.returncode == 0, container.output()


async def _execute(url: str, code: str, **fields: object) -> dict[str, object]:
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{url}/v1/execute", json={"code": code, **fields}) as r,
    ):
        assert r.status == 200, await r.text()
        body = await r.json()
    assert isinstance(body, dict)
    return body


async def test_arithmetic_and_sympy(service):
    _, url = service
    assert (await _execute(url, "print(1+1)"))["stdout"] == "2\n"
    body = await _execute(url, "import sympy\nprint(sympy.factorint(360))")
    assert (body["status"], body["stdout"]) == ("ok", "{2: 3, 3: 2, 5: 1}\n")


async def test_timeout_and_fork_bomb_are_stopped_and_the_service_stays_healthy(service):
    _, url = service
    assert (await _execute(url, HOSTILE["infinite_loop"], timeout_s=1))["status"] == "timeout"
    assert (await _execute(url, HOSTILE["fork_bomb"], timeout_s=1))["status"] == "timeout"
    async with aiohttp.ClientSession() as s, s.get(f"{url}/healthz") as r:
        assert r.status == 200
    assert (await _execute(url, "print('alive')"))["stdout"] == "alive\n"


@pytest.mark.parametrize("name", ["memory_hog", "output_flood", "signal_server", "disk_fill"])
async def test_hostile_snippets(service, name):
    _, url = service
    body = await _execute(url, HOSTILE[name], timeout_s=1)
    expected = {
        "memory_hog": "memory",
        "output_flood": "output_limit",
        "signal_server": "ok",  # it ran, and killed nothing outside its own PID namespace
        "disk_fill": "error",  # its file size limit stopped it (EFBIG)
    }
    assert body["status"] == expected[name], body
    assert (await _execute(url, "print('alive')"))["stdout"] == "alive\n"


async def test_a_call_cannot_reach_the_network(service):
    _, url = service
    port = url.rsplit(":", 1)[1]
    code = (
        "import socket\n"
        f"for addr in [('127.0.0.1', {port}), ('1.1.1.1', 53)]:\n"
        "    try:\n"
        "        socket.create_connection(addr, timeout=1)\n"
        "        print('reached', addr)\n"
        "    except OSError as exc:\n"
        "        print('refused', exc.errno)\n"
    )
    body = await _execute(url, code)
    assert body["status"] == "ok", body
    lines = str(body["stdout"]).splitlines()
    # ENETUNREACH at once: no route at all (loopback down), not a timeout
    assert lines == [f"refused {errno.ENETUNREACH}"] * 2, body


async def test_a_call_runs_unprivileged_inside_the_image(service):
    """Not root, and on the image's file system (its versions.json), not the host's."""
    _, url = service
    code = (
        "import json, os\n"
        "print(os.getuid())\n"
        "print(json.load(open('/opt/rstar2/versions.json'))['rstar2_commit'])\n"
        f"print(os.path.exists({str(REPO)!r}))\n"
    )
    body = await _execute(url, code)
    uid, commit, host_visible = str(body["stdout"]).split()
    assert int(uid) != 0
    assert commit == _commit()
    assert host_visible == "False"


def test_versions_json(service):
    container, _ = service
    done = container.exec("cat", "/opt/rstar2/versions.json")
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    packages = record["packages"]
    assert packages["sympy"] == "1.14.0" and packages["rstar2"]
    assert record["base_image"].startswith(oci.BASE_IMAGE + "@sha256:")
    assert record["rstar2_commit"] == _commit()


def test_the_default_command_serves_on_8088_and_is_healthy(image):
    """The image's own entrypoint and command (no arguments given), its healthcheck passing."""
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", 8088)) == 0:
            pytest.skip("port 8088 is taken on this machine")
    container = oci.Container(image, TAG, "sandbox-default", cap_add=["CAP_SYS_ADMIN"])
    with container:
        _wait_healthy(container.proc, container.output, "http://127.0.0.1:8088")
        health = oci.image_config(image, TAG)["Healthcheck"]["Test"]  # type: ignore[index]
        done = container.exec(*health[1:])
        assert done.returncode == 0, done.stderr
    assert container.proc is not None and container.proc.returncode == 0, container.output()


def test_without_cap_sys_admin_it_refuses_with_one_line(image):
    port = free_port()
    args = ["serve", "--host", "127.0.0.1", "--port", str(port)]
    container = oci.Container(image, TAG, "sandbox-nocap", args)
    with container:
        assert container.proc is not None
        code = container.proc.wait(timeout=120)
    out = container.output().strip().splitlines()
    assert code == 2, out
    assert out[-1].startswith("sandbox-pool: refusing to start:"), out


def test_chrooted_without_its_own_mount_namespace_it_refuses(image):
    """buildah's chroot isolation: a call's mount namespace would be the host's root, outside
    the image; the service must see that and refuse (it once served there, on the host's files)."""
    port = str(free_port())
    with _chrooted(image) as run:
        done = subprocess.run(
            [*run, "--", "sandbox-pool", "serve", "--host", "127.0.0.1", "--port", port],
            capture_output=True,
            text=True,
            timeout=120,
        )
    ours = [x for x in done.stderr.splitlines() if x.startswith("sandbox-pool:")]
    assert done.returncode != 0, done.stderr  # buildah adds its own "Error: exit status 2"
    assert len(ours) == 1 and ours[0].startswith("sandbox-pool: refusing to start:"), ours
    assert "runs chrooted" in ours[0]


async def test_chrooted_with_weak_isolation_calls_stay_in_the_image(image):
    """--unsafe-weak-isolation under the same chroot: calls run without namespaces, so they
    stay on the image's files (joining a namespace would have put them on the host's)."""
    port = free_port()
    serve = ["sandbox-pool", "serve", "--host", "127.0.0.1", "--port", str(port)]
    log = image.root / "weak.log"
    with _chrooted(image) as run, log.open("wb") as out:
        proc = subprocess.Popen(
            [*run, "--", *serve, "--unsafe-weak-isolation"], stdout=out, stderr=out
        )
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_healthy(proc, log.read_text, url)
            code = f"import os\nprint(os.path.exists({str(REPO)!r}), os.path.exists('/opt/venv'))"
            body = await _execute(url, code)
            assert body["stdout"] == "False True\n", body
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
