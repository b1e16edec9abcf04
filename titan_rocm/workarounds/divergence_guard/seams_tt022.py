"""TorchTitan 0.2.2's seam of the divergence guard: functions and methods the trainer looks up
at call time, wrapped.

``torchtitan.train`` runs as ``__main__`` (a second copy of the module), so patching it would
not reach the running trainer (docs/divergence-detection.md lists what is wrapped)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from titan_rocm import patches
from titan_rocm.workarounds.base import TrainerSeam
from titan_rocm.workarounds.divergence_guard import hooks
from titan_rocm.workarounds.divergence_guard.monitor import Monitor


@torch.compiler.disable
def _observe_loss(loss: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    # Kept out of torch.compile (``[compile] components`` with "loss"): a graph break here
    # keeps the guard's bookkeeping eager and the compiled loss free of step-dependent guards.
    monitor = hooks.active()
    return loss if monitor is None else monitor.on_loss(loss, labels)


def _wrap_loss(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    @functools.wraps(original)
    def cross_entropy_loss(pred: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return _observe_loss(original(pred, labels), labels)

    return cross_entropy_loss


def _wrap_log(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def log(self: Any, step: int, global_avg_loss: Any, global_max_loss: Any, grad_norm: Any,
            *args: Any, **kwargs: Any) -> Any:
        result = original(self, step, global_avg_loss, global_max_loss, grad_norm,
                          *args, **kwargs)
        monitor = hooks.active()
        if monitor is not None:
            monitor.on_log(step, global_avg_loss, grad_norm)
        return result

    return log


def _wrap_should_log(original: Callable[..., bool]) -> Callable[..., bool]:
    @functools.wraps(original)
    def should_log(self: Any, step: int) -> bool:
        result = original(self, step)
        monitor = hooks.active()
        if monitor is not None and result:
            monitor.on_should_log(step)
        return result

    return should_log


def _wrap_close(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def close(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            monitor = hooks.active()
            if monitor is not None:
                monitor.on_close()
        finally:
            result = original(self, *args, **kwargs)
        return result

    return close


def _wrap_save(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def save(self: Any, curr_step: int, last_step: bool = False) -> Any:
        monitor = hooks.active()
        if monitor is not None:
            should_save = getattr(self, "_should_save", None)
            if last_step or (should_save is not None and should_save(curr_step, last_step)):
                monitor.on_save(curr_step)
        return original(self, curr_step, last_step)

    return save


def _wrap_load(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def load(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        monitor = hooks.active()
        if monitor is not None:
            states = getattr(self, "states", None) or {}
            monitor.train_state = states.get("train_state", monitor.train_state)
        return result

    return load


def install(monitor: Monitor) -> None:
    """Make ``monitor`` the active one and wrap TorchTitan 0.2.2's functions (once per process)."""
    import torchtitan.components.loss as loss_module
    from torchtitan.components.checkpoint import CheckpointManager
    from torchtitan.components.metrics import MetricsProcessor

    hooks.install_grad_norm(monitor)
    for owner, name, make in (
        (loss_module, "cross_entropy_loss", _wrap_loss),
        (MetricsProcessor, "should_log", _wrap_should_log),
        (MetricsProcessor, "log", _wrap_log),
        (MetricsProcessor, "close", _wrap_close),
        (CheckpointManager, "save", _wrap_save),
        (CheckpointManager, "load", _wrap_load),
    ):
        patches.patch(owner, name, make, by=hooks.NAME)


class Seam:
    """:class:`~.workaround.GuardSeam` for TorchTitan 0.2.2."""

    loss_observed = "torchtitan.components.loss.cross_entropy_loss (each micro-batch's loss)"

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def install(self, monitor: Monitor) -> TrainerSeam | None:
        """Wrap the loss, grad-norm clip, metrics and checkpointer: 0.2.2 has no trainer adapter."""
        install(monitor)
        return None
