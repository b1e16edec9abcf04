"""TorchTitan 0.3.0's seam of the divergence guard: the trainer adapter's calls
(:class:`~.tt030.TrainerGuard`)."""

from __future__ import annotations

from typing import Any

from titan_rocm.workarounds.base import TrainerSeam
from titan_rocm.workarounds.divergence_guard import tt030
from titan_rocm.workarounds.divergence_guard.monitor import Monitor


class Seam:
    """:class:`~.workaround.GuardSeam` for TorchTitan 0.3.0."""

    loss_observed = "Trainer.forward_backward_step's loss (each micro-batch)"

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def install(self, monitor: Monitor) -> TrainerSeam | None:
        """The guard the 0.3.0 trainer adapter calls at its own methods."""
        return tt030.TrainerGuard(monitor)
