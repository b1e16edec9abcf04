"""Shared fixtures: the GPU marker, the fake aiter (MLA tests)."""

from __future__ import annotations

import pytest
from mla_test_support import clean_mla_state, fake_aiter, fake_aiter_path  # noqa: F401


def _has_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip GPU-marked tests, with the reason, where the machine has no GPU."""
    gpu = _has_gpu()
    for item in items:
        if item.get_closest_marker("gpu") is not None and not gpu:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA or ROCm GPU; none here"))
