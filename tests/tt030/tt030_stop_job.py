"""Config functions for tests/tt030/tt030_main.py (``--module tt030_stop_job --config
NAME``): stock debug configs cut to CPU size (tests/tt030/tt030_harness.py), with titan-rocm
and a checkpoint every step into ``./outputs/ckpt`` (the working directory is a scratch
folder), for the stop tests (tests/tt030/test_tt030_stop.py)."""

from __future__ import annotations

from typing import Any

from tt030_harness import cpu_config


def _llama3(steps: int, compile: bool) -> Any:
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    config = cpu_config(llama3_debugmodel(), layers=2, steps=steps, compile=compile)
    config.training.mixed_precision_param = "float32"  # FSDP on CPU: the job's own dtype
    config.checkpoint.enable = True
    config.checkpoint.interval = 1
    config.checkpoint.folder = "ckpt"
    return config


def llama3_guard() -> Any:
    """5 steps, eager, the divergence guard on (the NaN comes from its test hook)."""
    from titan_rocm.adapters.tt030 import rocm

    return rocm(_llama3(steps=5, compile=False), divergence_guard="on")


def llama3_audit_stop() -> Any:
    """4 steps, compiled, the in-training audit spread from step 1 with ``policy = stop``."""
    from titan_rocm.adapters.tt030 import rocm

    return rocm(_llama3(steps=4, compile=True), numerics_audit="first_step",
                numerics_audit_policy="stop")

