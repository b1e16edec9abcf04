"""Turn every rank's record into one decision, and the error that stops training.

At a check point every rank contributes its record row to one all-gather
(:mod:`.snapshot`), so every rank reaches the same verdict from the same data and stops
together: none is left waiting in a later collective. The first bad step wins (lowest rank
on ties); rank 0 logs the full message, naming the rank that saw it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch.distributed as dist

from titan_rocm.logs.parse import fmt_value
from titan_rocm.workarounds.divergence_guard.record import Row

DOCS_PAGE = "docs/divergence-detection.md"


class DivergenceError(RuntimeError):
    """Training produced a non-finite loss or grad norm; titan-rocm stopped it."""

    def __init__(self, message: str, verdict: Verdict) -> None:
        super().__init__(message)
        self.verdict = verdict


@dataclass(frozen=True)
class Verdict:
    """The first non-finite step over all ranks."""

    step: int
    rank: int
    loss: float | None
    grad_norm: float | None
    checked_at: str
    """Where it was found: ``log step 10``, ``checkpoint save at step 8``, ..."""
    world_size: int
    ranks_bad: tuple[int, ...]


def _fmt(value: float | None) -> str:
    return "not seen on that rank" if value is None else fmt_value(value)


def distributed() -> bool:
    """A process group with more than one rank is up."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def decide(rows: list[Row], checked_at: str) -> Verdict | None:
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
    return Verdict(
        step=step, rank=rank, loss=loss, grad_norm=grad_norm, checked_at=checked_at,
        world_size=len(rows), ranks_bad=tuple(sorted(rank for _, rank in bad)),
    )


def message(v: Verdict) -> str:
    """The full error: the step, the values, likely causes and the knobs, the docs page."""
    ranks = ""
    if v.world_size > 1:
        others = [r for r in v.ranks_bad if r != v.rank]
        ranks = f" on rank {v.rank} of {v.world_size}" + (
            f" (non-finite by now on rank(s) {', '.join(map(str, others))} too)"
            if others else ""
        )
    return (
        f"titan-rocm divergence guard: training diverged at step {v.step}{ranks}: "
        f"loss = {_fmt(v.loss)}, grad_norm = {_fmt(v.grad_norm)} "
        f"(found at {v.checked_at}). Training stopped; no checkpoint was saved from step "
        f"{v.step} or later.\n"
        "Likely causes and knobs: a learning rate too high or a warm-up too short "
        "([optimizer] lr, [lr_scheduler] warmup_steps); no or a loose gradient clip "
        "([training] max_norm); bad data; low-precision numerics (a compiled kernel that "
        "drops BF16 rounding: keep [rocm] precision_casts on; FP8 / float8 converters); a "
        "miscompiled or hazardous kernel on ROCm (keep [rocm] triton_war on; run "
        "'titan-rocm scan' on the Triton cache; retry with [compile] enable = false to "
        "compare). Resume from the last checkpoint saved before this step.\n"
        f"Details: {DOCS_PAGE} in titan-rocm. To check every step exactly (one device sync "
        "per step): [rocm] divergence_check = \"every_step\"."
    )


def short_message(v: Verdict) -> str:
    """The exception every rank raises: step and values; rank 0 logs :func:`message`."""
    where = f" (first seen on rank {v.rank})" if v.world_size > 1 else ""
    return (
        f"titan-rocm divergence guard: training diverged at step {v.step}{where}: "
        f"loss = {_fmt(v.loss)}, grad_norm = {_fmt(v.grad_norm)}; rank 0 logged the likely "
        f"causes and knobs; see {DOCS_PAGE}"
    )
