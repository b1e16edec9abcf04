"""How a run that failed result validation ends, in both TorchTitan generations
(docs/divergence-detection.md).

A :class:`~titan_rocm.workarounds.base.RunStopped` left alone is a crash: TorchTitan's ``main``
re-raises, ``@record`` writes a traceback into torchrun's error file, the process group is
never destroyed, the exit code is 1, and a scheduler restarts the job into the same fault.
So ``train_step``, ``close`` and ``checkpointer.save`` are wrapped on the instance, and the
rank ends with :class:`Stopped`, a ``SystemExit`` of
:data:`~titan_rocm.exit_codes.FAILED_VALIDATION`: it passes TorchTitan's ``except
Exception``, and ``@record`` re-raises it without an error file. The step that raised never
reaches its optimizer step or its checkpoint save.
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
    ``error``: the guard's end-of-training check then skips, so closing runs no collective.
    """
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
    """Route a ``RunStopped`` from ``trainer``'s ``train_step``, ``close`` and
    ``checkpointer.save`` to :func:`end`, held by ``scope``; calling again patches only what
    is new (a checkpointer built since).
    """
    scope.patch(trainer, "train_step", _ending(trainer, closed=False), by=BY)
    # The stock close has run when a RunStopped leaves it (the guard's wrappers close in a
    # ``finally``): nothing left to close.
    scope.patch(trainer, "close", _ending(trainer, closed=True), by=BY)
    checkpointer = getattr(trainer, "checkpointer", None)
    if checkpointer is not None:
        scope.patch(checkpointer, "save", _ending(trainer, closed=False), by=BY)
