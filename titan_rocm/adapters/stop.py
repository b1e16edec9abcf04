"""How a run that failed result validation ends, in both generations
(docs/divergence-detection.md).

A ``RunStopped`` left alone is a crash (traceback in torchrun's error file, exit 1, a
scheduler restart into the same fault); :class:`Stopped` is a ``SystemExit`` that passes
TorchTitan's ``except Exception`` and that ``@record`` re-raises without an error file."""

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


class Stopped(SystemExit):
    """The ``SystemExit`` a stopped rank raises; :attr:`error` is what stopped it."""

    def __init__(self, error: RunStopped) -> None:
        super().__init__(FAILED_VALIDATION)
        self.error = error


def end(trainer: Any, error: RunStopped, *, closed: bool = False) -> NoReturn:
    """End this rank after ``error``: log, close, destroy the process group, raise :class:`Stopped`.
    Call it inside the ``except`` that caught ``error``: the guard's end-of-training check then
    skips, so closing runs no collective."""
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
    """Route a ``RunStopped`` from ``train_step``, ``close`` and ``checkpointer.save`` to
    :func:`end`; calling again patches only what is new (a checkpointer built since)."""
    scope.patch(trainer, "train_step", _ending(trainer, closed=False), by=BY)
    # The stock close has run when a RunStopped leaves it (the guard's wrappers close in a
    # ``finally``): nothing left to close.
    scope.patch(trainer, "close", _ending(trainer, closed=True), by=BY)
    checkpointer = getattr(trainer, "checkpointer", None)
    if checkpointer is not None:
        scope.patch(checkpointer, "save", _ending(trainer, closed=False), by=BY)
