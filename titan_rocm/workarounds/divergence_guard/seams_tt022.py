"""TorchTitan 0.2.2's seam of the divergence guard: library functions the trainer looks up at
call time, wrapped (:mod:`.hooks`)."""

from __future__ import annotations

from typing import Any

from titan_rocm.workarounds.base import TrainerSeam
from titan_rocm.workarounds.divergence_guard import hooks
from titan_rocm.workarounds.divergence_guard.monitor import Monitor


class Seam:
    """:class:`~.workaround.GuardSeam` for TorchTitan 0.2.2."""

    loss_observed = "torchtitan.components.loss.cross_entropy_loss (each micro-batch's loss)"

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def install(self, monitor: Monitor) -> TrainerSeam | None:
        """Wrap the loss, the grad-norm clip, the metrics and the checkpointer: no trainer
        adapter calls back on 0.2.2."""
        hooks.install(monitor)
        return None
