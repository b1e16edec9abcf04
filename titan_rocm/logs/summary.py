"""What a benchmark pipeline may publish from a training log (``titan-rocm bench-summary``).

Median, min and max of tokens/s, TFLOP/s and MFU (TorchTitan) or TFLOP/s, tokens/s and
iteration time (Megatron-LM) over the training steps after warm-up, the memory peak and the
number of steps parsed. Only a run whose verdict (:mod:`titan_rocm.logs.verdict`) is ``ok``
and whose every throughput, timing and memory figure is finite and not negative is
``valid: true``; any other run is ``valid: false`` with the reason and gets no figure at all.

Exit codes:

====  =====================================================================================
0     valid: the figures may be published
1     not a valid benchmark: the run diverged, did not finish (``incomplete``: a crash, or
      no training step), or logged a non-finite or negative throughput/memory figure
2     nothing to summarize: a file unreadable or not a regular file, no metric line at all
      (``empty``), no training step after ``--warmup``, or no throughput figure logged
====  =====================================================================================
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from titan_rocm.guard_message import fmt_value
from titan_rocm.logs.parse import GUARD_FORMAT, ParsedLog, Record, UnreadableLog, json_value
from titan_rocm.logs.verdict import EMPTY, OK, Verdict, verdict_of

EXIT_VALID = 0
EXIT_INVALID = 1
EXIT_NOTHING = 2

DEFAULT_WARMUP = 1
"""Steps excluded from throughput: TorchTitan's step-1 line includes start-up and compile."""

THROUGHPUT_FIELDS: tuple[str, ...] = ("tps", "tflops", "mfu", "iteration_ms")
FIGURE_FIELDS: tuple[str, ...] = (*THROUGHPUT_FIELDS, "memory_gib")
"""Every figure bench-summary publishes from a record: each must be finite and >= 0."""


@dataclass(frozen=True)
class Stat:
    """Median, min and max of one metric over the measured steps."""

    median: float
    min: float
    max: float
    count: int

    @classmethod
    def of(cls, values: list[float]) -> Stat | None:
        """The statistics of ``values``, or None when there are none."""
        if not values:
            return None
        return cls(statistics.median(values), min(values), max(values), len(values))

    def to_dict(self) -> dict[str, float | str | int | None]:
        """``{"median", "min", "max", "count"}`` (strict JSON)."""
        return {"median": json_value(self.median), "min": json_value(self.min),
                "max": json_value(self.max), "count": self.count}


@dataclass
class Summary:
    """The publishable summary of one run (possibly split over several log files)."""

    sources: list[str]
    warmup: int
    valid: bool
    reason: str | None
    exit_code: int
    format: str | None = None
    steps_parsed: int = 0
    steps_measured: int = 0
    last_step: int | None = None
    ranks: tuple[int, ...] = ()
    stats: dict[str, Stat | None] | None = None
    memory_peak_gib: float | None = None
    first_bad: Record | None = None
    verdict: Verdict | None = None

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` object; throughput figures are null for an invalid run."""
        stats = self.stats or {}
        out: dict[str, Any] = {
            "valid": self.valid,
            "reason": self.reason,
            "exit_code": self.exit_code,
            "files": self.sources,
            "format": self.format,
            "warmup": self.warmup,
            "steps_parsed": self.steps_parsed,
            "steps_measured": self.steps_measured,
            "last_step": self.last_step,
            "ranks": list(self.ranks),
            "memory_peak_gib": json_value(self.memory_peak_gib),
            "first_bad": self.first_bad.to_dict() if self.first_bad else None,
            "verdict": self.verdict.to_dict() if self.verdict else None,
        }
        for name in THROUGHPUT_FIELDS:
            stat = stats.get(name)
            out[name] = stat.to_dict() if stat else None
        return out

    def lines(self) -> list[str]:
        """Human-readable report lines."""
        out = [f"valid: {'true' if self.valid else 'false'}"]
        if self.verdict is not None:
            out.append(f"verdict: {self.verdict.label}")
        if self.reason:
            out.append(f"reason: {self.reason}")
        out.append(f"files: {', '.join(self.sources)}")
        if self.format:
            out.append(f"format: {self.format}")
        last = f" (last step {self.last_step})" if self.last_step is not None else ""
        out.append(f"steps parsed: {self.steps_parsed}{last}")
        if self.verdict is not None and self.verdict.note:
            out.append(f"note: {self.verdict.note}")
        if self.valid:
            out.append(f"steps measured: {self.steps_measured} (after warm-up {self.warmup})")
            labels = {
                "tps": "tokens/s per device",
                "tflops": "TFLOP/s per device",
                "mfu": "MFU %",
                "iteration_ms": "iteration time ms",
            }
            for name, label in labels.items():
                stat = (self.stats or {}).get(name)
                if stat:
                    out.append(
                        f"{label}: median {stat.median:,.2f} "
                        f"(min {stat.min:,.2f}, max {stat.max:,.2f}, n={stat.count})"
                    )
            if self.memory_peak_gib is not None:
                out.append(f"memory peak: {self.memory_peak_gib:.2f} GiB")
        return out


def _invalid(sources: list[str], warmup: int, reason: str, code: int, **kw: Any) -> Summary:
    return Summary(sources, warmup, valid=False, reason=reason, exit_code=code, **kw)


def bad_figure(records: Sequence[Record], peaks_gib: Sequence[float] = ()) -> str | None:
    """The first non-finite or negative throughput, timing or memory figure, as a sentence
    (None: every figure is publishable)."""
    for r in records:
        for name in FIGURE_FIELDS:
            value = getattr(r, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                rank = f" on rank {r.rank}" if r.rank is not None else ""
                return (
                    f"{name} is {fmt_value(value)} at {r.kind} step {r.step}{rank} "
                    f"(line {r.line}): a non-finite or negative figure cannot be published."
                )
    for peak in peaks_gib:
        if not (math.isfinite(peak) and peak >= 0):
            return (
                f"a Megatron-LM memory report gives {fmt_value(peak)} GiB: a non-finite or "
                "negative figure cannot be published."
            )
    return None


def measured_stats(records: Sequence[Record], warmup: int) -> dict[str, Stat | None]:
    """Median, min and max of each throughput field over the training steps after ``warmup``:
    the figures bench-summary publishes (and compare's throughput ratio uses)."""
    measured = [r for r in records if r.kind == "train" and r.step > warmup]
    return {
        name: Stat.of([v for r in measured if (v := getattr(r, name)) is not None])
        for name in THROUGHPUT_FIELDS
    }


def summarize(logs: Sequence[ParsedLog], warmup: int = DEFAULT_WARMUP,
              unreadable: Sequence[UnreadableLog] = ()) -> Summary:
    """The summary of one run whose metric lines are spread over ``logs``.

    Args:
        logs: parsed logs of one run (several files are pooled, e.g. one file per rank).
        warmup: training steps ``<= warmup`` are left out of the throughput figures.
        unreadable: the run's files that could not be read (the run is then invalid).

    Raises:
        ValueError: ``warmup`` is negative.
    """
    if warmup < 0:
        raise ValueError(f"--warmup {warmup} is not valid; accepted: an integer >= 0")
    sources = [log.source for log in logs] + [e.path for e in unreadable]
    if unreadable:
        return _invalid(sources, warmup, " ".join(map(str, unreadable)), EXIT_NOTHING)
    records = [r for log in logs for r in log.records]
    formats = sorted({r.format for r in records if r.format != GUARD_FORMAT})
    verdict = verdict_of(logs)
    common: dict[str, Any] = {
        "format": (formats[0] if len(formats) == 1 else "mixed") if formats else None,
        "steps_parsed": verdict.train_steps,
        "last_step": verdict.last_step,
        "ranks": tuple(sorted({r.rank for r in records if r.rank is not None})),
        "verdict": verdict,
    }
    if verdict.status == EMPTY:
        return _invalid(sources, warmup, verdict.reason, EXIT_NOTHING, **common)
    if verdict.status != OK:
        reason = verdict.reason
        if verdict.first_bad is None:
            reason += " A run that did not finish is not a valid benchmark."
        return _invalid(
            sources, warmup, reason, EXIT_INVALID, first_bad=verdict.first_bad, **common
        )
    peaks = [p for log in logs for p in log.memory_peaks_gib]
    figure = bad_figure(records, peaks)
    if figure is not None:
        return _invalid(sources, warmup, figure, EXIT_INVALID, **common)
    stats = measured_stats(records, warmup)
    measured = {r.step for r in records if r.kind == "train" and r.step > warmup}
    if not measured:
        return _invalid(
            sources, warmup,
            f"no training step after warm-up: the last step is {verdict.last_step} and "
            f"--warmup {warmup} leaves out every step up to {warmup}.",
            EXIT_NOTHING, **common,
        )
    if all(s is None for s in stats.values()):
        return _invalid(
            sources, warmup, "the measured steps log no throughput or timing figure.",
            EXIT_NOTHING, **common,
        )
    peaks += [r.memory_gib for r in records if r.memory_gib is not None]
    return Summary(
        sources, warmup, valid=True, reason=None, exit_code=EXIT_VALID,
        steps_measured=len(measured), stats=stats,
        memory_peak_gib=max(peaks) if peaks else None, **common,
    )
