"""``rocm.divergence_guard``: stop a run at its first non-finite loss or grad norm.

On by default on every platform (``needs_rocm = False``). Without any extra device-to-host
synchronisation per step, a device-side sticky record keeps the first step whose loss or
grad norm was non-finite; TorchTitan's log steps, checkpoint saves and the end of training
read it (they synchronise anyway), so a NaN at step 7 with ``log_freq = 10`` stops the run
as "step 7" at step 10 at the latest. ``[rocm] divergence_check = "every_step"`` reads each
step's record at the end of the next step (no wait in steady state: a NaN at step 7 stops the
run at the end of step 8, named step 7); ``"every_step_exact"`` at the step's own end (one
sync per step). Every rank takes part in each check
(one all-gather), so every rank stops; rank 0 logs the message. See
``docs/divergence-detection.md``. The workaround is :mod:`.workaround`.
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
