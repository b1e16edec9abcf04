"""Config functions for ``titan-rocm audit --module tt030_audit_job --config NAME`` in the
0.3.0 suite: stock debug configs cut to CPU size (tests/tt030/tt030_harness.py), with
titan-rocm, compiled. The harness's stand-ins must be installed (the ``cpu_harness``
fixture) and the working directory a scratch folder (the dump folder is relative)."""

from __future__ import annotations

from typing import Any

from tt030_harness import cpu_config


def llama3_cpu() -> Any:
    """llama3's debug model, 2 blocks, compiled, with titan-rocm."""
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    from titan_rocm.adapters.tt030 import rocm

    config = cpu_config(llama3_debugmodel(), layers=2, compile=True)
    config.training.mixed_precision_param = "float32"  # FSDP on one rank: see the tests
    return rocm(config)
