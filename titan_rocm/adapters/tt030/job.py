"""The titan-rocm workarounds of one TorchTitan 0.3.0 trainer (docs/torchtitan-0.3.md).

The :class:`Context` is built after ``init_distributed()`` so ``on`` workarounds fail before
the model exists; the ``parallelize_fn`` wrapper applies them on the meta model before the
stock function and so before Inductor's first compile, which reads the precision casts'
config."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch.nn as nn

from titan_rocm.adapters import stop
from titan_rocm.adapters.tt030.context import job_context
from titan_rocm.log import log
from titan_rocm.settings import RocmSettings
from titan_rocm.workarounds.base import Context, TrainerSeam, Workaround
from titan_rocm.workarounds.job import Decision, JobWorkarounds
from titan_rocm.workarounds.moe_blocks import realize_eager_marks
from titan_rocm.workarounds.registry import WORKAROUNDS

BY = "rocm (torchtitan 0.3.0)"
OVERRIDE_ENTRY = "titan_rocm.torchtitan.override.rocm"
"""What users list in ``--override.imports`` to attach a :class:`RocmJob` to a stock trainer
(TorchTitan 0.3.0's ``config/override.py`` keys it by module and name)."""
WRAPPED_ATTR = "titan_rocm_job"


def unwrapped(fn: Any) -> Any:
    """``fn`` without a titan-rocm wrapper (a config reused for a second trainer)."""
    while getattr(fn, WRAPPED_ATTR, None) is not None:
        fn = fn.__wrapped__
    return fn


class RocmJob:
    """titan-rocm's state for one trainer."""

    def __init__(self, settings: RocmSettings, names: list[str] | None = None) -> None:
        self.settings = settings
        self.names = list(WORKAROUNDS) if names is None else names
        self.ctx: Context | None = None
        self.workarounds: JobWorkarounds | None = None
        self.decisions: list[Decision] = []
        self._model_done = False

    # -- start-up ------------------------------------------------------------------------------
    def start(self, config: Any, parallel_dims: Any, parallelize_fn: Any = None) -> Context:
        """Build the context and the workarounds; ``on`` ones fail here naming what is missing
        (ValueError)."""
        parallelize_fn = unwrapped(parallelize_fn or config.model_spec.parallelize_fn)
        self.ctx = job_context(config, parallel_dims, self.settings, parallelize_fn)
        self.workarounds = JobWorkarounds(self.ctx, self.names)
        self.workarounds.require()
        return self.ctx

    def wrap_parallelize(self, parallelize_fn: Callable[..., Any]) -> Callable[..., Any]:
        """``parallelize_fn`` with the workarounds applied before and eager marks realized after
        (pipeline parallelism calls it once per stage)."""

        parallelize_fn = unwrapped(parallelize_fn)

        @functools.wraps(parallelize_fn)
        def parallelize(model: nn.Module, *args: Any, **kwargs: Any) -> nn.Module:
            self.apply(model)
            result = parallelize_fn(model, *args, **kwargs)
            parallelized = model if result is None else result
            eager = realize_eager_marks(parallelized)
            if eager:
                log.info("titan-rocm: after %s, blocks run eager: %s",
                         getattr(parallelize_fn, "__name__", "parallelize_fn"), eager)
            return result

        setattr(parallelize, WRAPPED_ATTR, self)
        return parallelize

    def wrap_pipelining(self, pipelining_fn: Callable[..., Any]) -> Callable[..., Any]:
        pipelining_fn = unwrapped(pipelining_fn)

        @functools.wraps(pipelining_fn)
        def pipelining(model: nn.Module, *args: Any, **kwargs: Any) -> Any:
            self.apply(model)
            return pipelining_fn(model, *args, **kwargs)

        setattr(pipelining, WRAPPED_ATTR, self)
        return pipelining

    def apply(self, model: nn.Module) -> list[Decision]:
        """Decide and apply every workaround on the whole model, once; one log line each."""
        if self._model_done:
            return self.decisions
        assert self.workarounds is not None, "RocmJob.start() runs first (init_distributed)"
        self._model_done = True
        self.decisions = self.workarounds.apply_all(self.names, model, BY)
        return self.decisions

    @property
    def applied(self) -> list[Workaround]:
        """The workarounds that applied, in apply order (none before :meth:`apply`)."""
        return self.workarounds.applied() if self.workarounds is not None else []

    @property
    def seams(self) -> list[TrainerSeam]:
        return [w.trainer_seam for w in self.applied if w.trainer_seam is not None]

    # -- the trainer's seams -------------------------------------------------------------------
    def attach(self, trainer: Any) -> None:
        """Attach the seams, hook the optimizers' step, end a stopped run with its exit code."""
        for seam in self.seams:
            seam.attach(trainer)
        self.stop_cleanly(trainer)
        if self.applied:
            trainer.optimizers.register_step_post_hook(
                lambda *args, **kwargs: self.after_optimizer_step(trainer)
            )

    def stop_cleanly(self, trainer: Any) -> None:
        """A stop ends the process with its exit code, not as a crash; called again once the
        checkpointer exists (patches nothing twice)."""
        if self.workarounds is not None:
            stop.install(trainer, self.workarounds.patches)

    def after_optimizer_step(self, trainer: Any) -> None:
        for w in self.applied:
            w.post_optimizer_hook(trainer.model_parts)
        for seam in self.seams:
            seam.after_optimizer_step(trainer)

    def train_step(self, run: Callable[..., Any], step: int, *args: Any, **kwargs: Any) -> Any:
        for seam in self.seams:
            seam.before_step(step)
        try:
            return run(*args, **kwargs)
        except Exception as error:
            for seam in self.seams:
                seam.step_failed(error, step)  # may raise its own verdict instead
            raise

    def forward_backward(self, run: Callable[[], Any], input_dict: Any, labels: Any,
                         global_valid_tokens: Any) -> Any:
        """Through every seam's ``forward_backward``, the first seam outermost."""
        for seam in reversed(self.seams):
            run = functools.partial(seam.forward_backward, run, input_dict, labels,
                                    global_valid_tokens)
        return run()

    def after_forward_backward(self, loss: Any, labels: Any, global_valid_tokens: Any) -> None:
        for seam in self.seams:
            seam.after_forward_backward(loss, labels, global_valid_tokens)

    def close(self) -> None:
        """The seams' last calls, then the job's teardown (every attribute patched is put back)."""
        try:
            for seam in self.seams:
                seam.close()
        finally:
            if self.workarounds is not None:
                self.workarounds.close()
