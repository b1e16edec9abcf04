"""What a benchmark pipeline may publish from a training log (``titan-rocm bench-summary``;
docs/divergence-detection.md).

Only an ``ok`` run with every figure finite and not negative is ``valid: true``; any other gets the
reason and no figure, so a broken run's numbers cannot be published."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from titan_rocm.guard_message import fmt_value
from titan_rocm.logs.parse import (
    GUARD_FORMAT,
    TORCHTITAN,
    ParsedLog,
    Record,
    UnreadableLog,
    json_value,
)
from titan_rocm.logs.tables import (
    FIGURE_FIELDS,
    THROUGHPUT_FIELDS,
    Figures,
    distinct_count,
    median,
)
from titan_rocm.logs.verdict import (
    EMPTY,
    FLAGGED,
    INCOMPLETE,
    OK,
    UNREADABLE,
    Verdict,
    verdict_of,
)
from titan_rocm.numbers import STEPS

__all__ = ["DEFAULT_WARMUP", "FIGURE_FIELDS", "THROUGHPUT_FIELDS", "Stat", "Summary",
           "figures_of", "summarize"]

EXIT_VALID = 0
EXIT_INVALID = 1
EXIT_NOTHING = 2

DEFAULT_WARMUP = 1
"""Steps excluded from throughput: TorchTitan's step-1 line includes start-up and compile."""


@dataclass(frozen=True)
class Stat:
    """Median, min and max of one metric over the measured steps."""

    median: float
    min: float
    max: float
    count: int

    @classmethod
    def of(cls, counts: Counter[float]) -> Stat | None:
        """The statistics of ``counts`` (value -> multiplicity), or None when empty."""
        if not counts:
            return None
        return cls(median(counts), min(counts), max(counts), sum(counts.values()))

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


def figures_of(log: ParsedLog, warmup: int) -> Figures:
    """``log``'s figures for ``warmup``; ValueError for a lean log read for another warm-up."""
    if log.figures is not None and log.figures.warmup == warmup:
        return log.figures
    if log.lean:
        raise ValueError(f"{log.source} was read lean for warm-up "
                         f"{log.figures.warmup if log.figures else None}, not {warmup}")
    return Figures.of(log.records, warmup)


def _bad_peak(peaks_gib: Sequence[float]) -> str | None:
    for peak in peaks_gib:
        if not (math.isfinite(peak) and peak >= 0):
            return (
                f"a Megatron-LM memory report gives {fmt_value(peak)} GiB: a non-finite or "
                "negative figure cannot be published."
            )
    return None


def _stats(figures: Sequence[Figures]) -> dict[str, Stat | None]:
    stats: dict[str, Stat | None] = {}
    for name in THROUGHPUT_FIELDS:
        counts: Counter[float] = Counter()
        for f in figures:
            counts.update(f.counts[name])
        stats[name] = Stat.of(counts)
    return stats


def _reason(verdict: Verdict) -> str:
    if verdict.status == INCOMPLETE and not verdict.unread_bytes:
        return verdict.reason + " A run that did not finish is not a valid benchmark."
    if verdict.status == FLAGGED:
        after = (" (after a quarantine, its steps do not time the compiled program)"
                 if verdict.quarantines else "")
        return (f"{verdict.reason} A run whose numerics audit flagged a step is not a valid "
                f"benchmark{after}.")
    if verdict.status == UNREADABLE:
        return verdict.reason + " A run whose audit verdict cannot be read is not a valid " \
            "benchmark."
    return verdict.reason


def summarize(logs: Sequence[ParsedLog], warmup: int = DEFAULT_WARMUP,
              unreadable: Sequence[UnreadableLog] = ()) -> Summary:
    """The summary of one run whose lines are spread over ``logs`` (e.g. one per rank);
    ``unreadable`` files make it invalid. ValueError for a bad ``warmup``."""
    STEPS.check(warmup, "--warmup")
    sources = [log.source for log in logs] + [e.path for e in unreadable]
    if unreadable:
        return _invalid(sources, warmup, " ".join(map(str, unreadable)), EXIT_NOTHING)
    formats = sorted(
        {r.format for log in logs for r in log.records if r.format != GUARD_FORMAT}
        | {f for log in logs for f in log.train_formats}
        | ({TORCHTITAN} if any(r.kind == "unreadable" for log in logs for r in log.records)
           else set()))
    verdict = verdict_of(logs)
    common: dict[str, Any] = {
        "format": (formats[0] if len(formats) == 1 else "mixed") if formats else None,
        "steps_parsed": verdict.train_steps,
        "last_step": verdict.last_step,
        "ranks": tuple(sorted({rank for log in logs for rank in log.ranks})),
        "verdict": verdict,
    }
    if verdict.status == EMPTY:
        return _invalid(sources, warmup, verdict.reason, EXIT_NOTHING, **common)
    if verdict.status != OK:
        return _invalid(
            sources, warmup, _reason(verdict), EXIT_INVALID, first_bad=verdict.first_bad,
            **common
        )
    figures = [figures_of(log, warmup) for log in logs]
    peaks = [p for log in logs for p in log.memory_peaks_gib]
    figure = next((f.bad for f in figures if f.bad is not None), None) or _bad_peak(peaks)
    if figure is not None:
        return _invalid(sources, warmup, figure, EXIT_INVALID, **common)
    stats = _stats(figures)
    measured, _ = distinct_count((c.steps for log in logs for c in log.curves.values()),
                                 above=warmup)
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
    peaks += [f.memory_peak for f in figures if f.memory_peak is not None]
    return Summary(
        sources, warmup, valid=True, reason=None, exit_code=EXIT_VALID,
        steps_measured=measured, stats=stats,
        memory_peak_gib=max(peaks) if peaks else None, **common,
    )
