"""Every rank's record (one all-gather) turned into one decision, so every rank stops together
and none waits in a later collective; the first bad step wins, lowest rank on ties."""

from __future__ import annotations

import math

import torch.distributed as dist

from titan_rocm.guard_message import Divergence
from titan_rocm.workarounds.base import RunStopped
from titan_rocm.workarounds.divergence_guard.record import Row


class DivergenceError(RunStopped):
    """A non-finite loss or grad norm: every rank exits with ``FAILED_VALIDATION``."""

    def __init__(self, message: str, divergence: Divergence) -> None:
        super().__init__(message)
        self.divergence = divergence


def distributed() -> bool:
    """A process group with more than one rank is up."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def decide(rows: list[Row], checked_at: str) -> Divergence | None:
    """The first bad step of ``rows`` (index = rank), or None when every row is clean."""
    bad = [(r.step, rank) for rank, r in enumerate(rows) if r.step is not None]
    if not bad:
        return None
    step = min(bad)[0]
    # Among the ranks that went bad at that step, name one whose own loss is non-finite:
    # the grad norm is reduced over every rank (FSDP, PP), so all ranks see a NaN grad norm
    # at the step where one rank's loss went NaN; that rank is the origin.
    rank = min(
        (r.loss is None or math.isfinite(r.loss), rank)
        for rank, r in enumerate(rows) if r.step == step
    )[1]
    first = rows[rank]
    # Fill a value this rank did not see (PP: loss lives on the last stage) from another
    # rank that went bad at the same step.
    loss, grad_norm = first.loss, first.grad_norm
    for r in rows:
        if r.step == step:
            loss = r.loss if loss is None else loss
            grad_norm = r.grad_norm if grad_norm is None else grad_norm
    return Divergence(
        step=step, rank=rank, loss=loss, grad_norm=grad_norm, checked_at=checked_at,
        world_size=len(rows), ranks_bad=tuple(sorted(rank for _, rank in bad)),
    )
