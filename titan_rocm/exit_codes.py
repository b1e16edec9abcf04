"""The exit code a training process ends with when titan-rocm stops it on purpose, not the 1 of
a crash, so a scheduler can tell a restart would replay the same fault
(docs/divergence-detection.md, docs/numerics-audit.md). Torch-free."""

from __future__ import annotations

FAILED_VALIDATION = 17
"""The run's results failed validation; the same number as Megatron-LM's
``EXIT_CODE_FAILED_ON_RESULT_VALIDATION`` (megatron/core/rerun_state_machine.py),
so a scheduler that knows Megatron's code reads ours alike."""

DOCS = "docs/divergence-detection.md#stop-exit-code-17"


def stop_line(code: int = FAILED_VALIDATION) -> str:
    """The last line each stopped rank logs, after the stop's own sentence."""
    return (f"titan-rocm: training stopped: failed result validation, not a crash; the "
            f"trainer is closed and the process exits with code {code} (restarting repeats "
            f"the fault; see {DOCS})")
