"""TorchTitan 0.3.0's seam of ``rocm.numerics_audit``: the trainer adapter's calls.

A replayed CUDA graph runs no Python, so the audited micro-batch runs the body itself (the same
compiled kernels)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from titan_rocm.workarounds.base import TrainerSeam


class Kit:
    """TorchTitan 0.3.0's step on one micro-batch (:class:`~titan_rocm.numerics.audit_run.StepKit`).
    """

    def __init__(self, trainer: Any, denominator: torch.Tensor) -> None:
        self.trainer = trainer
        self.denominator = denominator

    @contextlib.contextmanager
    def _tokens_kept(self) -> Iterator[None]:
        seen = self.trainer.ntokens_seen
        try:
            yield
        finally:
            self.trainer.ntokens_seen = seen

    def run(self, input_dict: dict[str, torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
        t = self.trainer
        with self._tokens_kept():
            inputs, labels, extra = t.post_dataloading_process(input_dict, labels)
        return t._forward_backward_body(inputs, labels, self.denominator, extra)

    def forward(self, input_dict: dict[str, torch.Tensor],
                labels: torch.Tensor) -> torch.Tensor:
        t = self.trainer
        with self._tokens_kept():
            inputs, labels, extra = t.post_dataloading_process(input_dict, labels)
        with t.train_context():
            pred = t.model_parts[0](inputs, **extra)
            loss_kwargs = {"positions": extra["positions"]} if "positions" in extra else {}
            loss, _ = t.loss_fn(pred, labels, self.denominator, **loss_kwargs)
        return loss

    def reference(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()


def global_valid_tokens(trainer: Any, labels: torch.Tensor) -> torch.Tensor:
    """The loss denominator 0.3.0's ``Trainer.train_step`` computes for this one micro-batch."""
    from torchtitan.components.loss import IGNORE_INDEX

    local = (labels != IGNORE_INDEX).sum().to(trainer.device)
    dims = trainer.parallel_dims
    if getattr(dims, "dp_enabled", False):
        from torchtitan.distributed import utils as dist_utils

        return dist_utils.dist_sum_tensor(local, dims.get_mesh("batch"))
    return local


def _graphed(trainer: Any) -> bool:
    body = getattr(type(trainer), "_forward_backward_body", None)
    return getattr(getattr(trainer, "fwd_bwd_fn", None), "__func__", None) is not body


class AuditTrainerSeam(TrainerSeam):
    """The audit's :class:`~titan_rocm.workarounds.base.TrainerSeam` on TorchTitan 0.3.0."""

    def __init__(self, audit: Any) -> None:
        self.audit = audit
        self.step = 0

    def attach(self, trainer: Any) -> None:
        self.audit.attach(trainer)

    def before_step(self, step: int) -> None:
        self.step = step

    def forward_backward(self, run: Callable[[], Any], input_dict: Any, labels: Any,
                         global_valid_tokens: Any) -> Any:
        trainer = self.audit.trainer

        def live() -> Any:
            if trainer is None or not _graphed(trainer):
                return run()
            inputs, body_labels, extra = trainer.post_dataloading_process(input_dict, labels)
            return trainer._forward_backward_body(inputs, body_labels, global_valid_tokens,
                                                  extra)

        return self.audit.forward_backward(self.step, live, input_dict, labels,
                                           global_valid_tokens)


class Seam:
    """:class:`~titan_rocm.workarounds.numerics_audit.workaround.AuditSeam` for 0.3.0."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def install(self, audit: Any) -> TrainerSeam | None:
        """The trainer seam the 0.3.0 adapter calls (nothing of TorchTitan is patched)."""
        return AuditTrainerSeam(audit)

    def kit(self, trainer: Any, denominator: Any) -> Kit:
        return Kit(trainer, denominator)

    def kept(self, trainer: Any) -> Callable[[], None]:
        """``trainer.ntokens_seen``, which ``post_dataloading_process`` adds each micro-batch
        to (a redone micro-batch must not count twice)."""
        seen = trainer.ntokens_seen

        def put_back() -> None:
            trainer.ntokens_seen = seen

        return put_back
