"""CPU/GPU markers."""

from __future__ import annotations

import pytest


def _has_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _is_rocm() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return getattr(torch.version, "hip", None) is not None and torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip GPU- and ROCm-marked tests, with the reason, where the machine lacks them."""
    gpu, rocm = _has_gpu(), _is_rocm()
    for item in items:
        if "gpu" in item.keywords and not gpu:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA or ROCm GPU; none here"))
        if "rocm" in item.keywords and not rocm:
            item.add_marker(pytest.mark.skip(reason="needs a ROCm build of torch on an AMD GPU"))
