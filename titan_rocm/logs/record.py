"""One metric line of a training log (:class:`Record`); its own module so that
:mod:`~titan_rocm.logs.parse` and :mod:`~titan_rocm.logs.tables` import no circle."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from titan_rocm.guard_message import fmt_value
from titan_rocm.serial import json_form

TORCHTITAN = "torchtitan"
MEGATRON = "megatron"
GUARD_FORMAT = "titan-rocm"


def json_value(value: float | None) -> float | str | None:
    """A metric value for strict JSON: non-finite values become the strings nan/inf/-inf."""
    if value is None or math.isfinite(value):
        return value
    return fmt_value(value)


@dataclass(frozen=True, slots=True)
class Record:
    """One metric line: a training (or validation) step of one rank."""

    format: str
    """``torchtitan`` or ``megatron``."""
    kind: str
    """``train``, ``validation`` or ``guard`` (the runtime guard's stop message)."""
    step: int
    rank: int | None
    """From a ``[rankN]:`` / ``[defaultN]:`` / ``N: `` prefix; None when the log shows none."""
    line: int
    """1-based line number in the source."""
    losses: tuple[tuple[str, float], ...]
    """Every loss the line logs, main loss first."""
    grad_norm: float | None = None
    tps: float | None = None
    """Tokens per second per device."""
    tflops: float | None = None
    """TFLOP/s per device."""
    mfu: float | None = None
    """Percent."""
    memory_gib: float | None = None
    """TorchTitan: peak reserved memory since the previous log line."""
    iteration_ms: float | None = None
    """Megatron: elapsed time per iteration."""
    nan_iterations: int | None = None
    """Megatron: ``number of nan iterations`` in the interval."""
    guard_stop: bool = False
    """A divergence guard stop message: stopped for a non-finite value, logged or not."""
    raw: str | None = None
    """Kind ``unreadable``: the text of a value the parser cannot read (``tensor(nan)``), counted as
    NaN."""

    @property
    def loss(self) -> float | None:
        """The main loss."""
        return self.losses[0][1] if self.losses else None

    def checked_values(self) -> dict[str, float]:
        """The values that must be finite: every loss and the grad norm."""
        values = dict(self.losses)
        if self.grad_norm is not None:
            values["grad_norm"] = self.grad_norm
        return values

    def bad_values(self) -> dict[str, float]:
        """The non-finite checked values, plus Megatron's nan-iteration count when non-zero."""
        bad = {k: v for k, v in self.checked_values().items() if not math.isfinite(v)}
        if self.nan_iterations:
            bad["number of nan iterations"] = float(self.nan_iterations)
        if self.guard_stop:
            bad["divergence guard stop"] = float("nan")
        return bad

    @property
    def finite(self) -> bool:
        """Every loss and grad norm is finite (and Megatron counted no nan iteration)."""
        return not self.bad_values()

    def describe(self) -> str:
        """``loss=nan grad_norm=1.23`` for messages: every checked value the line logged."""
        values = self.checked_values()
        if self.nan_iterations:
            values["nan iterations"] = float(self.nan_iterations)
        if not values:
            return "no loss or grad norm value logged"
        if self.raw is not None:
            name = next(iter(values))
            return f"{name}: {self.raw!r} is not a finite number the parser can read"
        return " ".join(f"{k.replace(' ', '_')}={fmt_value(v)}" for k, v in values.items())

    def to_dict(self) -> dict[str, Any]:
        """The record's position and values as strict JSON (non-finite values as strings)."""
        return json_form(
            self, "step rank line kind values bad",
            values={k: json_value(v) for k, v in self.checked_values().items()},
            bad={k: json_value(v) for k, v in self.bad_values().items()})
