"""Config functions for ``titan-rocm tune collect --module tt030_tune_job --config NAME`` in
the 0.3.0 suite: llama3's debug model cut to CPU size (tests/tt030/tt030_harness.py),
compiled, with titan-rocm attached each way a 0.3.0 job can attach it, and without it."""

from __future__ import annotations

from typing import Any

from tt030_harness import cpu_config


def _llama3() -> Any:
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    config = cpu_config(llama3_debugmodel(), layers=2, steps=3, compile=True)
    config.training.mixed_precision_param = "float32"  # FSDP on one rank, as the audit's
    return config


def llama3_rocm() -> Any:
    """With titan-rocm: ``rocm(cfg)``, a table required that does not exist (collect turns
    ``gemm_lookup`` off for its step, so it is never read)."""
    from titan_rocm.adapters.tt030 import rocm

    return rocm(_llama3(), gemm_lookup="on", gemm_lookup_table="no-such-table.json")


def llama3_override() -> Any:
    """A stock trainer with titan-rocm through the override entry (settings as its JSON)."""
    from titan_rocm.adapters.tt030.job import OVERRIDE_ENTRY

    config = _llama3()
    config.override.imports = [(OVERRIDE_ENTRY, {"moe_eager_compile": "off",
                                                 "gemm_lookup": "on"})]
    return config


def llama3_stock() -> Any:
    """Without titan-rocm."""
    return _llama3()
