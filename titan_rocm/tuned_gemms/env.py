"""The device and software a GEMM kernel was chosen on: identifies a task, heads a table and is
compared before a table is trusted."""

from __future__ import annotations

from typing import Any


def environment() -> dict[str, Any]:
    """This process's device and software (the ``env`` of records and table meta)."""
    import torch

    env: dict[str, Any] = {"device": "cpu", "device_key": None, "torch": torch.__version__,
                           "hip": torch.version.hip, "cuda": torch.version.cuda,
                           "fp32_precision": torch.get_float32_matmul_precision()}
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env["device"] = props.name
        env["device_key"] = getattr(props, "gcnArchName", None) or props.name
    return env
