"""TorchTitan 0.2.2's seam of ``rocm.numerics_audit``: the process-wide patches of
:mod:`titan_rocm.workarounds.numerics_audit` (``CheckpointManager.load``,
``dist_utils.clip_grad_norm_``) and 0.2.2's ``forward_backward_step``."""

from __future__ import annotations

from typing import Any

from titan_rocm.workarounds.base import TrainerSeam


class Seam:
    """:class:`~titan_rocm.workarounds.numerics_audit.AuditSeam` for TorchTitan 0.2.2."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def install(self, audit: Any) -> TrainerSeam | None:
        """Patch 0.2.2's seams; 0.2.2 has no trainer adapter to call back."""
        from titan_rocm.workarounds.numerics_audit import install_tt022

        install_tt022()
        return None

    def step(self, trainer: Any, labels: Any) -> Any:
        """0.2.2's ``forward_backward_step`` (:func:`titan_rocm.numerics.audit.trainer_step`)."""
        from titan_rocm.numerics.audit import trainer_step

        return trainer_step(trainer, labels)
