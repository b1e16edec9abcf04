"""The divergence guard's stop message: its wording, the pattern that finds it, value format.

One owner for a contract that must never drift: the guard writes it and the log tools
recognise a stopped run by it. Torch-free, so the log tools import it anywhere."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

DOCS_PAGE = "docs/divergence-detection.md"

PREFIX = "titan-rocm divergence guard: training diverged at step"
"""The log parser keys on it."""

NUMBER = r"[-+]?(?:nan|inf(?:inity)?|(?:\d{1,40}(?:\.\d{0,40})?|\.\d{1,40})(?:[eE][-+]?\d{1,4})?)"
"""A number as Python, C printf or Java print it; digits are bounded so ``float()`` never sees
thousands of digits."""

PATTERN = re.compile(
    rf"{re.escape(PREFIX)} (?P<step>\d{{1,18}})(?!\d)"
    rf"(?: on rank (?P<rank>\d{{1,6}}) of \d{{1,6}}| \(first seen on rank (?P<seen>\d{{1,6}})\))?"
    rf"(?:[^:]*:\s*loss = (?P<loss>{NUMBER})?[^,]*,\s*grad_norm = (?P<gn>{NUMBER})?)?",
    re.IGNORECASE,
)
"""Finds :func:`message` and :func:`short_message`; ``loss`` and ``gn`` are absent when the first
rank did not see the value."""


def fmt_value(value: float | None) -> str:
    """``nan``, ``inf``, ``-inf``, a short number, or ``n/a``."""
    if value is None:
        return "n/a"
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:.6g}"


@dataclass(frozen=True)
class Divergence:
    """The first non-finite step over all ranks, as the guard found it."""

    step: int
    rank: int
    """The rank that saw it first (whose own loss went non-finite, where one did)."""
    loss: float | None
    grad_norm: float | None
    checked_at: str
    world_size: int
    ranks_bad: tuple[int, ...]


def _value(value: float | None) -> str:
    return "not seen on that rank" if value is None else fmt_value(value)


def message(d: Divergence) -> str:
    """The full error rank 0 logs: the step, the values, likely causes and knobs, the docs."""
    ranks = ""
    if d.world_size > 1:
        others = [r for r in d.ranks_bad if r != d.rank]
        ranks = f" on rank {d.rank} of {d.world_size}" + (
            f" (non-finite by now on rank(s) {', '.join(map(str, others))} too)"
            if others else ""
        )
    return (
        f"{PREFIX} {d.step}{ranks}: "
        f"loss = {_value(d.loss)}, grad_norm = {_value(d.grad_norm)} "
        f"(found at {d.checked_at}). Training stopped; no checkpoint was saved from step "
        f"{d.step} or later.\n"
        "Likely causes and knobs: a learning rate too high or a warm-up too short "
        "([optimizer] lr, [lr_scheduler] warmup_steps); no or a loose gradient clip "
        "([training] max_norm); bad data; low-precision numerics (a compiled kernel that "
        "drops BF16 rounding: keep [rocm] precision_casts on; FP8 / float8 converters); a "
        "miscompiled or hazardous kernel on ROCm (keep [rocm] triton_war on; run "
        "'titan-rocm scan' on the Triton cache; retry with [compile] enable = false to "
        "compare). Resume from the last checkpoint saved before this step.\n"
        f"Details: {DOCS_PAGE} in titan-rocm. To check every step: [rocm] divergence_check "
        "= \"every_step\" (each step's record read at the end of the next step, no wait) or "
        "\"every_step_exact\" (at the step's own end, one device sync per step)."
    )


def short_message(d: Divergence) -> str:
    """The exception every rank raises: step and values; rank 0 logs :func:`message`."""
    where = f" (first seen on rank {d.rank})" if d.world_size > 1 else ""
    return (
        f"{PREFIX} {d.step}{where}: "
        f"loss = {_value(d.loss)}, grad_norm = {_value(d.grad_norm)}; rank 0 logged the likely "
        f"causes and knobs; see {DOCS_PAGE}"
    )
