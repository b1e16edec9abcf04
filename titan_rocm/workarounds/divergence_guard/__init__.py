"""``rocm.divergence_guard``: stop a run at its first non-finite loss or grad norm, with no extra
synchronisation per step by default (docs/divergence-detection.md)."""

from titan_rocm.guard_message import DOCS_PAGE, Divergence
from titan_rocm.workarounds.divergence_guard import hooks
from titan_rocm.workarounds.divergence_guard.monitor import (
    INJECT_RANK_ENV,
    INJECT_STEP_ENV,
    Injection,
    Monitor,
)
from titan_rocm.workarounds.divergence_guard.verdict import DivergenceError

__all__ = [
    "DOCS_PAGE",
    "INJECT_RANK_ENV",
    "INJECT_STEP_ENV",
    "Divergence",
    "DivergenceError",
    "Injection",
    "Monitor",
    "hooks",
]
