"""TorchTitan 0.2.2's seam of ``rocm.numerics_audit``.

0.2.2 runs its ``Trainer`` as ``__main__``, so the class cannot be patched: the trainer
``CheckpointManager.load`` hands over gets its ``forward_backward_step`` wrapped."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch

from titan_rocm import patches
from titan_rocm.workarounds.base import TrainerSeam

NAME = "numerics_audit"
"""Who the audit's patches are ``by``."""
_audits: list[tuple[Any, patches.Scope]] = []
"""The newest job's audit, and the scope of that job."""


class Kit:
    """TorchTitan 0.2.2's step on one micro-batch (:class:`~titan_rocm.numerics.audit_run.StepKit`).
    """

    def __init__(self, trainer: Any, denominator: torch.Tensor) -> None:
        self.trainer = trainer
        self.denominator = denominator

    def run(self, input_dict: dict[str, torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
        step = type(self.trainer).forward_backward_step
        return step(self.trainer, input_dict=input_dict, labels=labels,
                    global_valid_tokens=self.denominator)

    def forward(self, input_dict: dict[str, torch.Tensor],
                labels: torch.Tensor) -> torch.Tensor:
        t = self.trainer
        inputs, labels, extra_inputs, extra_kwargs = t.post_dataloading_process(input_dict,
                                                                                labels)
        with t.train_context(), t.maybe_enable_amp:
            pred = t.model_parts[0](inputs, **extra_inputs, **extra_kwargs)
            return t.loss_fn(pred, labels) / self.denominator

    @contextlib.contextmanager
    def reference(self) -> Iterator[None]:
        saved = self.trainer.maybe_enable_amp
        self.trainer.maybe_enable_amp = contextlib.nullcontext()
        try:
            yield
        finally:
            self.trainer.maybe_enable_amp = saved


def global_valid_tokens(trainer: Any, labels: torch.Tensor) -> torch.Tensor:
    """The loss denominator ``Trainer.train_step`` computes (0.2.2) for a step of this one
    micro-batch: valid labels, summed over the batch mesh when data parallel."""
    from torchtitan.components.loss import IGNORE_INDEX

    local = (labels != IGNORE_INDEX).sum().to(labels.device)
    dims = trainer.parallel_dims
    if getattr(dims, "dp_enabled", False):
        from torchtitan.distributed import utils as dist_utils

        return dist_utils.dist_sum(local, dims.get_mesh("batch"))
    return local.float()


class Seam:
    """:class:`~titan_rocm.workarounds.numerics_audit.workaround.AuditSeam` for 0.2.2."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def install(self, audit: Any) -> TrainerSeam | None:
        """Patch ``CheckpointManager.load`` once per process; the newest job's audit listens."""
        from torchtitan.components.checkpoint import CheckpointManager

        _audits[:] = [(audit, patches.current())]
        patches.patch(CheckpointManager, "load", _wrap_load, by=NAME)
        return None

    def kit(self, trainer: Any, denominator: Any) -> Kit:
        return Kit(trainer, denominator)

    def kept(self, trainer: Any) -> Callable[[], None]:
        """Nothing: 0.2.2's ``forward_backward_step`` changes only the model (its token
        count is kept by ``train_step``, outside it)."""
        return lambda: None


def attach(audit: Any, trainer: Any, scope: patches.Scope | None = None) -> None:
    """Hand ``trainer`` to ``audit`` and route its ``forward_backward_step`` through it (once)."""
    audit.attach(trainer)

    def wrap(original: Any) -> Any:
        @functools.wraps(original)
        def forward_backward_step(*, input_dict: Any, labels: Any,
                                  global_valid_tokens: Any) -> Any:
            def run() -> Any:
                return original(input_dict=input_dict, labels=labels,
                                global_valid_tokens=global_valid_tokens)

            return audit.forward_backward(int(getattr(trainer, "step", 0)), run, input_dict,
                                          labels, global_valid_tokens)

        return forward_backward_step

    (scope or patches.current()).patch(trainer, "forward_backward_step", wrap, by=NAME)


def _wrap_load(original: Any) -> Any:
    @functools.wraps(original)
    def load(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        trainer = (getattr(self, "states", None) or {}).get("train_state")
        if trainer is not None and hasattr(trainer, "forward_backward_step"):
            for audit, scope in _audits:
                attach(audit, trainer, scope)
        return result

    return load


def uninstall() -> None:
    """Restore every patch of the audit, whoever holds it (tests)."""
    _audits.clear()
    patches.restore(by=NAME)
