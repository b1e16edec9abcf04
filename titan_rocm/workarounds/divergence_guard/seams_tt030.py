"""TorchTitan 0.3.0's seam of the divergence guard: the trainer adapter's calls
(:class:`TrainerGuard`); docs/divergence-detection.md says why it listens where it does.

The loss may be captured in a CUDA graph, whose replays run no Python, so the guard reads
what ``forward_backward_step`` returns and injects through a device scalar."""

from __future__ import annotations

import functools
import math
from typing import Any

import torch

from titan_rocm import patches
from titan_rocm.workarounds.base import TrainerSeam
from titan_rocm.workarounds.divergence_guard import hooks
from titan_rocm.workarounds.divergence_guard.monitor import Monitor

NON_FINITE_ERROR = "Loss is not finite"
"""The start of TorchTitan 0.3.0's own error at a log step with a non-finite loss."""


def innermost_loss(loss_fn: Any) -> Any:
    """The loss whose backward runs: ``ChunkedLossWrapper.loss_fn`` (per chunk), else itself."""
    inner = getattr(loss_fn, "loss_fn", None)
    return innermost_loss(inner) if inner is not None and callable(inner) else loss_fn


class TrainerGuard(TrainerSeam):
    """The guard's :class:`~titan_rocm.workarounds.base.TrainerSeam` on TorchTitan 0.3.0."""

    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor
        self.factor: torch.Tensor | None = None
        """The NaN test hook's device scalar (None without the hook)."""
        self.patches = patches.current()
        """The job's scope (made while the guard applies): it holds the trainer's wrappers."""

    def attach(self, trainer: Any) -> None:
        monitor = self.monitor
        monitor.train_state = trainer  # its ``step`` numbers the steps (after a resume too)
        hooks.install_grad_norm(monitor, self.patches)
        metrics, checkpointer = trainer.metrics_processor, trainer.checkpointer
        self.patches.patch(metrics, "log", lambda log: _after_log(log, monitor), by=hooks.NAME)
        self.patches.patch(checkpointer, "save",
                           lambda save: _before_save(save, checkpointer, monitor), by=hooks.NAME)
        if monitor.injection is not None:
            self.factor = torch.ones((), device=trainer.device)
            _inject_into(innermost_loss(trainer.loss_fn), self)

    def before_step(self, step: int) -> None:
        if self.factor is not None:
            injecting = self.monitor.injecting(step)
            self.factor.fill_(math.nan if injecting else 1.0)  # a device op: no sync
            if injecting:
                self.monitor.note_injection()

    def after_forward_backward(self, loss: Any, labels: Any, global_valid_tokens: Any) -> None:
        if not isinstance(labels, torch.Tensor):
            return  # pipeline parallelism: the schedule's loss, observed by the last stage only
        # TorchTitan returns local sum / global valid tokens; the record wants the sum.
        self.monitor.on_loss(loss.detach() * global_valid_tokens, labels, inject=False)

    def after_optimizer_step(self, trainer: Any) -> None:
        step = trainer.step
        if trainer.metrics_processor.should_log(step):
            self.monitor.on_should_log(step)

    def step_failed(self, error: BaseException, step: int) -> None:
        if not (isinstance(error, RuntimeError) and str(error).startswith(NON_FINITE_ERROR)):
            return
        monitor = self.monitor
        if monitor.divergence is not None:
            return
        snapshot, monitor.pending = monitor.pending, None
        if snapshot is not None and snapshot.step != step:
            snapshot = None
        # Raises DivergenceError naming the first bad step (the host row if no device record).
        monitor.check(f"log step {step}", host=(step, math.nan, math.nan), snapshot=snapshot)

    def close(self) -> None:
        self.monitor.on_close()


def _after_log(log: Any, monitor: Monitor) -> Any:
    @functools.wraps(log)
    def logged(step: int, global_avg_loss: Any, global_max_loss: Any, grad_norm: Any,
               *args: Any, **kwargs: Any) -> Any:
        result = log(step, global_avg_loss, global_max_loss, grad_norm, *args, **kwargs)
        monitor.on_log(step, global_avg_loss, grad_norm)
        return result

    return logged


def _before_save(save: Any, checkpointer: Any, monitor: Monitor) -> Any:
    @functools.wraps(save)
    def checked(curr_step: int, last_step: bool = False) -> Any:
        should_save = getattr(checkpointer, "_should_save", None)
        if last_step or (should_save is not None and should_save(curr_step, last_step)):
            monitor.on_save(curr_step)
        return save(curr_step, last_step)

    return checked


def _inject_into(loss: Any, guard: TrainerGuard) -> None:
    """Make ``loss`` return its loss times ``guard.factor``; ``loss(...)`` looks ``__call__`` up on
    the class, so the instance gets a subclass."""
    cls = type(loss)

    class Injected(cls):  # type: ignore[misc, valid-type]
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            value, metrics = cls.__call__(self, *args, **kwargs)
            return value * guard.factor, metrics

    Injected.__name__ = Injected.__qualname__ = f"NaNTestHook{cls.__name__}"
    loss.__class__ = Injected


class Seam:
    """:class:`~.workaround.GuardSeam` for TorchTitan 0.3.0."""

    loss_observed = "Trainer.forward_backward_step's loss (each micro-batch)"

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def install(self, monitor: Monitor) -> TrainerSeam | None:
        """The guard the 0.3.0 trainer adapter calls at its own methods."""
        return TrainerGuard(monitor)
