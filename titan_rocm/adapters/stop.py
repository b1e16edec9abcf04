"""How a run that failed result validation ends, in both TorchTitan generations.

The divergence guard (``DivergenceError``) and the numerics audit's ``stop`` policy
(``NumericsAuditFlagged``) raise a :class:`~titan_rocm.workarounds.base.RunStopped` inside a
training step, a checkpoint save (the guard checks before one is written) or the trainer's
``close`` (the guard's check at the end of training). Left alone, that exception is a crash:
TorchTitan's ``main`` closes the trainer and re-raises, ``@record`` (torch.distributed.elastic)
writes its traceback into torchrun's error file, the process never destroys its process group
and exits with 1, and a scheduler that restarts failed jobs restarts this one into the same
fault.

So the trainer's ``train_step``, ``close`` and ``checkpointer.save`` are wrapped on the
instance (patches of :mod:`titan_rocm.patches` held by the job), and a ``RunStopped`` from
any of them ends the rank here: its sentence is logged (unless this rank logged it already),
then :func:`titan_rocm.exit_codes.stop_line`; the trainer is closed, the process group
destroyed, and :class:`Stopped`, a ``SystemExit`` with
:data:`~titan_rocm.exit_codes.FAILED_VALIDATION`, is raised. ``SystemExit`` is no
``Exception``: it passes TorchTitan's ``except Exception`` in ``Trainer.train``'s loop and in
``main``, and ``@record`` re-raises a non-zero ``SystemExit`` without writing an error file, so
no traceback is printed and the process exits with the code. The step that raised never
reaches its optimizer step (the audit flags before it) or its checkpoint save (the loop's save
comes after ``train_step``; the guard's own check stops a save before it writes).

Both generations call :func:`install`: TorchTitan 0.2.2's converter job when
``CheckpointManager.load`` hands it the trainer (the first thing ``Trainer.train`` does), 0.3.0's
:class:`~titan_rocm.adapters.tt030.job.RocmJob` when it attaches to the built trainer.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NoReturn

import torch.distributed as dist

from titan_rocm import patches
from titan_rocm.exit_codes import FAILED_VALIDATION, stop_line
from titan_rocm.log import log
from titan_rocm.workarounds.base import RunStopped

BY = "titan-rocm stop"
"""Who the stop's patches are ``by``."""


class Stopped(SystemExit):
    """The ``SystemExit`` a stopped rank raises: code
    :data:`~titan_rocm.exit_codes.FAILED_VALIDATION`; :attr:`error` is what stopped it."""

    def __init__(self, error: RunStopped) -> None:
        super().__init__(FAILED_VALIDATION)
        self.error = error


def end(trainer: Any, error: RunStopped, *, closed: bool = False) -> NoReturn:
    """End this rank after ``error``: log, close ``trainer`` (unless ``closed``), destroy the
    process group, raise :class:`Stopped`. Call it inside the ``except`` that caught
    ``error``: the guard's end-of-training check skips while an exception is handled, so
    closing runs no collective."""
    if not error.logged:
        log.error("%s", error)
    log.error("%s", stop_line())
    if not closed:
        try:
            trainer.close()
        except Exception as exc:  # noqa: BLE001 - the stop goes on; the reason is logged
            log.warning("titan-rocm: closing the trainer after the stop failed (%s: %s); "
                        "exiting with code %d anyway", type(exc).__name__, exc,
                        FAILED_VALIDATION)
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    raise Stopped(error) from None


def _ending(trainer: Any, closed: bool) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return original(*args, **kwargs)
            except RunStopped as error:
                end(trainer, error, closed=closed)

        return call

    return make


def install(trainer: Any, scope: patches.Scope) -> None:
    """Route a :class:`~titan_rocm.workarounds.base.RunStopped` from ``trainer``'s
    ``train_step``, ``close`` and ``checkpointer.save`` to :func:`end`, held by ``scope``
    (the job's). Calling it again patches nothing twice (and a checkpointer built since)."""
    scope.patch(trainer, "train_step", _ending(trainer, closed=False), by=BY)
    # The stock close has run when a RunStopped leaves it (the guard's wrappers close in a
    # ``finally``): nothing left to close.
    scope.patch(trainer, "close", _ending(trainer, closed=True), by=BY)
    checkpointer = getattr(trainer, "checkpointer", None)
    if checkpointer is not None:
        scope.patch(checkpointer, "save", _ending(trainer, closed=False), by=BY)
