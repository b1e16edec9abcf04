"""The exit code a training process ends with when titan-rocm stops it on purpose.

One owner for a contract with whoever launches training (a job scheduler, a retry loop, CI):
the divergence guard and the in-training numerics audit's ``stop`` policy end every rank
with :data:`FAILED_VALIDATION`, not the 1 of a crash, so a scheduler that restarts crashed
jobs can tell that restarting this one would replay the same fault. Both stops' pages
(docs/divergence-detection.md, docs/numerics-audit.md, each in its "Stop" section) name it.

Torch-free and TorchTitan-free: the offline log tools import it on any machine.
"""

from __future__ import annotations

FAILED_VALIDATION = 17
"""The run's results failed validation (a non-finite loss or grad norm; a flagged numerics
audit under ``numerics_audit_policy = "stop"``). The same number as Megatron-LM's
``EXIT_CODE_FAILED_ON_RESULT_VALIDATION`` (megatron/core/rerun_state_machine.py), so a
scheduler that already knows Megatron's code reads ours alike."""

DOCS = "docs/divergence-detection.md#stop-exit-code-17"
"""Where the code, what torchrun does with it and what a scheduler should read are written."""


def stop_line(code: int = FAILED_VALIDATION) -> str:
    """The last line each stopped rank logs, after the stop's own sentence."""
    return (f"titan-rocm: training stopped: failed result validation, not a crash; the "
            f"trainer is closed and the process exits with code {code} (restarting repeats "
            f"the fault; see {DOCS})")
