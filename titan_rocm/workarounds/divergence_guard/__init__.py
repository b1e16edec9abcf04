"""``rocm.divergence_guard``: stop a run at its first non-finite loss or grad norm
(docs/divergence-detection.md).

On by default on every platform (``needs_rocm = False``): a device-side sticky record keeps the
first bad step with no extra synchronisation per step, and is read where TorchTitan
synchronises anyway (log steps, checkpoint saves, the end), or every step under
``divergence_check``. Every rank joins each check, so every rank stops; rank 0 logs why.
"""

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
