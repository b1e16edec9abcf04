"""TorchTitan 0.3.0's seam of ``rocm.numerics_audit``: the trainer adapter's calls.

``attach`` hands over the trainer (its ``post_dataloading_process`` keeps the step's first
micro-batch, as on 0.2.2); ``before_step`` arms the audit and the step's first
``after_forward_backward`` (that micro-batch's backward has run, nothing is clipped or
stepped yet) runs it when due. The passes run 0.3.0's forward and backward through
:func:`titan_rocm.torchtitan.audit.trainer_step`.
"""

from __future__ import annotations

from typing import Any

from titan_rocm.workarounds.base import TrainerSeam


class AuditTrainerSeam(TrainerSeam):
    """The audit's :class:`~titan_rocm.workarounds.base.TrainerSeam` on TorchTitan 0.3.0."""

    def __init__(self, audit: Any) -> None:
        self.audit = audit
        self.armed = False

    def attach(self, trainer: Any) -> None:
        self.audit.attach(trainer)

    def before_step(self, step: int) -> None:
        self.armed = True
        self.audit.batch = None  # a micro-batch of an earlier step is never audited

    def after_forward_backward(self, loss: Any, labels: Any, global_valid_tokens: Any) -> None:
        if self.armed and not self.audit.auditing:
            self.armed = False  # later micro-batches of the step (gradient accumulation): not
            self.audit.maybe_audit()


class Seam:
    """:class:`~titan_rocm.workarounds.numerics_audit.AuditSeam` for TorchTitan 0.3.0."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def install(self, audit: Any) -> TrainerSeam | None:
        """The trainer seam the 0.3.0 adapter calls (nothing of TorchTitan is patched)."""
        return AuditTrainerSeam(audit)

    def step(self, trainer: Any, labels: Any) -> Any:
        """0.3.0's forward and backward (:func:`titan_rocm.torchtitan.audit.trainer_step`)."""
        from titan_rocm.adapters.tt030.audit import trainer_step

        return trainer_step(trainer, labels)
