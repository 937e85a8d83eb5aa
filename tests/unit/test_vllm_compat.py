"""rstar2.rollout.vllm_compat: the vLLM version window and what differs inside it."""

from __future__ import annotations

import tomllib

import pytest
from packaging.requirements import Requirement

from rstar2.config import ConfigError
from rstar2.rollout import vllm_compat
from tests.conftest import REPO


@pytest.mark.parametrize(
    ("text", "version"),
    [("0.26.0", (0, 26)), ("0.32.0+cpu", (0, 32)), ("0.33.0rc1", (0, 33)), ("1.2", (1, 2))],
)
def test_versions_are_read_as_major_minor(text: str, version: tuple[int, int]) -> None:
    assert vllm_compat.parse_version(text) == version


@pytest.mark.parametrize("version", [(0, 26), (0, 31), (0, 32), (0, 33)])
def test_the_versions_run_or_read_are_inside_the_window(version: tuple[int, int]) -> None:
    vllm_compat.check_supported(version)


@pytest.mark.parametrize("version", [(0, 25), (0, 34), (1, 0)])
def test_a_version_outside_is_refused_in_one_line_naming_the_window(
    version: tuple[int, int],
) -> None:
    with pytest.raises(ConfigError) as refused:
        vllm_compat.check_supported(version)
    text = str(refused.value)
    assert "\n" not in text and f"vLLM {version[0]}.{version[1]}" in text
    assert ">= 0.26, < 0.34" in text


def test_the_gpu_extra_pins_the_same_window() -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    (vllm,) = [
        Requirement(r)
        for r in extras["optional-dependencies"]["gpu"]
        if Requirement(r).name == "vllm"
    ]
    lo, hi = vllm_compat.OLDEST, vllm_compat.NEWEST_EXCLUSIVE
    assert str(vllm.specifier) == f"<{hi[0]}.{hi[1]},>={lo[0]}.{lo[1]}"
