"""Shared fixtures: TorchTitan reference configs, the GPU marker, the fake aiter (MLA tests)."""

from __future__ import annotations

from pathlib import Path

import pytest
from mla_test_support import clean_mla_state, fake_aiter, fake_aiter_path  # noqa: F401

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
REFERENCE_CONFIGS = SHARED / "reference" / "torchtitan-v0.2.2" / "train_configs"


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


@pytest.fixture
def reference_configs() -> Path:
    """TorchTitan v0.2.2's own TOML configs (from ../shared)."""
    if not REFERENCE_CONFIGS.is_dir():
        pytest.skip(f"TorchTitan reference configs not found at {REFERENCE_CONFIGS}")
    return REFERENCE_CONFIGS
