"""Training runs side by side against a baseline, within or outside the noise that repeats of the
baseline show (``titan-rocm compare``; docs/compare.md).

The band is a running maximum: runs that drifted apart by step t can be that far apart at any later
step. Only the loss decides: the grad norm swings by tens of percent between repeats."""

from __future__ import annotations

import math
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from titan_rocm.logs.parse import ParsedLog, parse_file
from titan_rocm.logs.summary import DEFAULT_WARMUP, Summary, summarize
from titan_rocm.logs.tables import StepValues
from titan_rocm.logs.verdict import EMPTY, OK, Verdict
from titan_rocm.numbers import Bounds

DEFAULT_TOLERANCE_PCT = 0.01
TOLERANCE = Bounds(float, 0, 1e6, unit="percent")
"""``--tolerance``: a relative difference in percent."""
"""Relative differences up to this (percent) are never a difference: one BF16 rounding is 0.4 %."""

METRICS: tuple[str, ...] = ("loss", "grad_norm")
METRIC_NAMES: dict[str, str] = {"loss": "loss", "grad_norm": "grad norm"}

WITHIN = "within noise"
UNQUALIFIED = "unqualified"
BASELINE = "baseline"

EXIT_SAME = 0
EXIT_DIFFERS = 1


class CompareError(Exception):
    """Bad input for compare: ``str()`` is one sentence naming what and what is accepted."""


@dataclass(frozen=True)
class Series:
    """One run's training curve on one rank: step -> value, as logged (non-finite kept)."""

    loss: Mapping[int, float]
    grad_norm: Mapping[int, float]

    def values(self, metric: str) -> Mapping[int, float]:
        """``loss`` or ``grad_norm``."""
        return self.loss if metric == "loss" else self.grad_norm

    def first_nonfinite(self) -> int | None:
        """The first step whose loss or grad norm is not finite."""
        bad = [s for m in METRICS for s, v in self.values(m).items() if not math.isfinite(v)]
        return min(bad) if bad else None


def series_of(log: ParsedLog, rank: int | None) -> Series:
    """The training curve of ``rank`` (None: lines without a rank prefix); a step's first line wins.
    """
    curve = log.curves.get(rank)
    if curve is None:
        return Series(StepValues(), StepValues())
    return Series(*curve.series())


def train_ranks(log: ParsedLog) -> list[int | None]:
    """The ranks with training-step lines, untagged (None) first."""
    return sorted(log.curves, key=lambda r: -1 if r is None else r)


@dataclass
class Run:
    """One log file: its curves per rank, its run verdict and its bench-summary."""

    label: str
    path: str
    log: ParsedLog
    verdict: Verdict
    summary: Summary

    @property
    def valid(self) -> bool:
        """The run trained finitely to its end (run verdict ``ok``)."""
        return self.verdict.status == OK

    def series(self, rank: int | None) -> Series:
        """:func:`series_of` this run's log."""
        return series_of(self.log, rank)

    def describe(self) -> str:
        """``ok, 7 training steps (last 60)`` or the verdict's reason."""
        if self.valid:
            return (f"ok, {self.verdict.train_steps} training step(s), the last step "
                    f"{self.verdict.last_step}")
        return f"{self.verdict.label}: {self.verdict.reason}"

    def to_dict(self) -> dict[str, Any]:
        """Label, path, run verdict, throughput summary (strict JSON)."""
        return {"label": self.label, "path": self.path, "verdict": self.verdict.to_dict(),
                "summary": self.summary.to_dict()}


def load_run(path: str | Path, label: str, fmt: str = "auto",
             warmup: int = DEFAULT_WARMUP) -> Run:
    """Parse one log into a :class:`Run`; UnreadableLog, or CompareError when it has no metric line.
    """
    log = parse_file(path, fmt, lean=True, warmup=warmup)
    summary = summarize([log], warmup)
    verdict = summary.verdict  # always set for a log that was read
    assert verdict is not None
    if verdict.status == EMPTY:
        raise CompareError(verdict.reason)
    return Run(label, str(path), log, verdict, summary)


def _common(base: StepValues, other: StepValues) -> tuple[array, array, array]:
    steps, mine, theirs = array("q"), array("d"), array("d")
    a, b = base.steps, other.steps
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i] < b[j]:
            i += 1
        elif a[i] > b[j]:
            j += 1
        else:
            steps.append(a[i])
            mine.append(base.values[i])
            theirs.append(other.values[j])
            i += 1
            j += 1
    return steps, mine, theirs


def relative(base: Mapping[int, float], other: Mapping[int, float]) -> StepValues:
    """``(other - base) / |base|`` at the steps both have finite; an overflow is held at
    :data:`CEILING` (outside every band, still finite JSON)."""
    out = StepValues()
    for step, b, o in zip(*_common(StepValues.of(base), StepValues.of(other)), strict=True):
        if math.isfinite(b) and math.isfinite(o) and b != 0:
            out.steps.append(step)
            out.values.append(_finite((o - b) / abs(b)))
    return out


CEILING = 1e300
"""The largest relative difference or ratio held (finite also as a percentage)."""


def _finite(value: float) -> float:
    """``value`` with an overflow (to +-inf, or past :data:`CEILING`) held at +-CEILING."""
    return max(-CEILING, min(CEILING, value))


def noise_band(
    base: Mapping[int, float], repeats: Sequence[Mapping[int, float]], tolerance: float
) -> StepValues:
    """At each baseline step, the largest ``|relative difference|`` of any repeat up to it, at least
    ``tolerance``."""
    base = StepValues.of(base)
    diffs = [relative(base, rep) for rep in repeats]
    at = [0] * len(diffs)  # each difference's next step (its steps are the baseline's)
    band = StepValues()
    widest = tolerance
    for step in base.steps:
        for k, d in enumerate(diffs):
            if at[k] < len(d.steps) and d.steps[at[k]] == step:
                widest = max(widest, abs(d.values[at[k]]))
                at[k] += 1
        band.steps.append(step)
        band.values.append(widest)
    return band


@dataclass(frozen=True)
class MetricDiff:
    """How one metric of a run differs from the baseline's on one rank."""

    metric: str
    rel: Mapping[int, float]
    """Relative difference per common finite step, ascending."""
    band: Mapping[int, float] | None
    """Noise band per baseline step (None: no repeats; the tolerance alone then)."""
    tolerance: float

    def limit(self, step: int) -> float:
        """The band at ``step`` (the tolerance without repeats)."""
        return self.band.get(step, self.tolerance) if self.band is not None else self.tolerance

    @property
    def first_outside(self) -> int | None:
        """The first common step where ``|rel|`` exceeds the band (or the tolerance)."""
        return next((s for s, v in self.rel.items() if abs(v) > self.limit(s)), None)

    @property
    def largest(self) -> tuple[int, float] | None:
        """(step, rel) of the largest ``|rel|``."""
        return max(self.rel.items(), key=lambda kv: abs(kv[1])) if self.rel else None

    @property
    def final(self) -> tuple[int, float] | None:
        """(step, rel) at the last common step."""
        return max(self.rel.items()) if self.rel else None

    @property
    def first(self) -> tuple[int, float] | None:
        """(step, rel) at the first common step (step 1 in a TorchTitan log)."""
        return min(self.rel.items()) if self.rel else None

    def to_dict(self) -> dict[str, Any]:
        """Strict JSON; differences in percent."""

        def at(item: tuple[int, float] | None) -> dict[str, Any] | None:
            return {"step": item[0], "pct": 100 * item[1]} if item else None

        return {
            "first": at(self.first),
            "max": at(self.largest),
            "final": at(self.final),
            "first_outside_band": self.first_outside,
            "per_step": [
                {"step": s, "pct": 100 * v, "band_pct": 100 * self.limit(s)}
                for s, v in self.rel.items()
            ],
        }


@dataclass(frozen=True)
class RankComparison:
    """A run against the baseline on one rank."""

    rank: int | None
    base_rank: int | None
    steps_in_common: Sequence[int]
    """Ascending."""
    diffs: dict[str, MetricDiff]

    @property
    def first_outside(self) -> int | None:
        """The step where the loss first leaves its band (the verdict's step)."""
        return self.diffs["loss"].first_outside

    def to_dict(self) -> dict[str, Any]:
        """Strict JSON."""
        return {
            "rank": self.rank,
            "baseline_rank": self.base_rank,
            "steps_in_common": list(self.steps_in_common),
            **{m: d.to_dict() for m, d in self.diffs.items()},
        }


@dataclass(frozen=True)
class Throughput:
    """The run's throughput over the baseline's, as bench-summary computes both."""

    field: str | None
    ratio: float | None
    value: float | None
    base_value: float | None
    reason: str | None = None
    """Why there is no ratio."""

    def to_dict(self) -> dict[str, Any]:
        """Strict JSON."""
        return {"field": self.field, "ratio": self.ratio, "median": self.value,
                "baseline_median": self.base_value, "reason": self.reason}


_THROUGHPUT_LABELS = {"tps": "tokens/s", "tflops": "TFLOP/s", "iteration_ms": "iteration time"}


def throughput(run: Run, base: Run) -> Throughput:
    """Median after warm-up of ``run`` over ``base``: tokens/s, else TFLOP/s, else 1 / iteration
    time."""
    for summary, who in ((base.summary, "baseline"), (run.summary, "run")):
        if not summary.valid:
            return Throughput(None, None, None, None,
                              f"no publishable figure for the {who}: {summary.reason}")
    for name in _THROUGHPUT_LABELS:
        a = (run.summary.stats or {}).get(name)
        b = (base.summary.stats or {}).get(name)
        if a is not None and b is not None and a.median > 0 and b.median > 0:
            ratio = _finite(b.median / a.median if name == "iteration_ms"
                            else a.median / b.median)
            return Throughput(name, ratio, a.median, b.median)
    return Throughput(None, None, None, None,
                      "the two logs share no throughput field (tokens/s, TFLOP/s, iteration time)")


@dataclass
class RunComparison:
    """One run against the baseline: per rank, its verdict, throughput and memory."""

    run: Run
    ranks: list[RankComparison]
    throughput: Throughput
    qualified: bool
    """The verdict rests on a noise band (repeats given)."""

    @property
    def outside(self) -> int | None:
        """The first step where the run's loss leaves the band, over all ranks."""
        found = [f for rc in self.ranks if (f := rc.first_outside) is not None]
        return min(found) if found else None

    @property
    def verdict(self) -> str:
        """``diverged at step N``, ``incomplete``, ``within noise``, ``differs from step N`` or
        ``unqualified``."""
        if not self.run.valid:
            return self.run.verdict.label
        if not any(rc.steps_in_common for rc in self.ranks):
            return "no common step"
        if not self.qualified:
            return UNQUALIFIED
        outside = self.outside
        return f"differs from step {outside}" if outside is not None else WITHIN

    @property
    def ok(self) -> bool:
        """Counts as the same as the baseline for the exit code."""
        return self.verdict in (WITHIN, UNQUALIFIED)

    def to_dict(self) -> dict[str, Any]:
        """Strict JSON."""
        return {
            **self.run.to_dict(),
            "compare_verdict": self.verdict,
            "first_outside": self.outside,
            "ranks": [rc.to_dict() for rc in self.ranks],
            "throughput": self.throughput.to_dict(),
            "memory_peak_gib": self.run.summary.memory_peak_gib,
        }


def _rank_pairs(base: Run, run: Run) -> list[tuple[int | None, int | None]]:
    """(run rank, baseline rank) to compare: every rank both tag, else each log's first."""
    base_ranks, run_ranks = train_ranks(base.log), train_ranks(run.log)
    common = [r for r in run_ranks if r in base_ranks]
    if common:
        return [(r, r) for r in common]
    if base_ranks and run_ranks:
        return [(run_ranks[0], base_ranks[0])]
    return []


@dataclass
class Comparison:
    """Every run against the baseline, with the noise band from the repeats."""

    baseline: Run
    runs: list[RunComparison]
    repeats: list[Run]
    tolerance: float
    warmup: int
    plot_rank: int | None = None
    """The rank the picture shows (the first compared)."""
    bands: dict[str, Mapping[int, float]] = field(default_factory=dict)
    """The noise band of each metric on :attr:`plot_rank`."""

    @property
    def qualified(self) -> bool:
        """A noise band exists (at least one valid repeat)."""
        return any(r.valid for r in self.repeats)

    @property
    def invalid(self) -> list[Run]:
        """Every run (baseline, others, repeats) that diverged or did not finish."""
        return [r for r in (self.baseline, *(rc.run for rc in self.runs), *self.repeats)
                if not r.valid]

    @property
    def exit_code(self) -> int:
        """0 same (or unqualified and valid), 1 a run differs or is invalid."""
        if self.invalid or not all(rc.ok for rc in self.runs):
            return EXIT_DIFFERS
        return EXIT_SAME

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` object (strict JSON; differences in percent)."""
        valid_repeats = [r for r in self.repeats if r.valid]
        return {
            "exit_code": self.exit_code,
            "qualified": self.qualified,
            "tolerance_pct": 100 * self.tolerance,
            "warmup": self.warmup,
            "baseline": {**self.baseline.to_dict(),
                         "memory_peak_gib": self.baseline.summary.memory_peak_gib},
            "noise": {
                "repeats": [r.to_dict() for r in self.repeats],
                "used": [r.label for r in valid_repeats],
                "excluded": [r.label for r in self.repeats if not r.valid],
            },
            "runs": [rc.to_dict() for rc in self.runs],
            "plot_rank": self.plot_rank,
        }

    def lines(self) -> list[str]:
        """The human-readable report."""
        return report_lines(self)


def repeat_series(repeat: Run, rank: int | None) -> Series | None:
    """A repeat run's curve on ``rank`` (its only rank when it tags another)."""
    ranks = train_ranks(repeat.log)
    if rank in ranks:
        return repeat.series(rank)
    return repeat.series(ranks[0]) if len(ranks) == 1 else None


def compare(
    baseline: Run, others: Sequence[Run], repeats: Sequence[Run] = (),
    tolerance_pct: float = DEFAULT_TOLERANCE_PCT, warmup: int = DEFAULT_WARMUP,
) -> Comparison:
    """Compare each of ``others`` with ``baseline``; the band comes from the valid repeats.
    ValueError for a negative or non-finite ``tolerance_pct``."""
    tolerance = TOLERANCE.parse(tolerance_pct, "--tolerance") / 100
    usable = [r for r in repeats if r.valid]
    band_cache: dict[tuple[int | None, str], StepValues | None] = {}

    def band(rank: int | None, metric: str) -> StepValues | None:
        if not usable:
            return None
        key = (rank, metric)
        if key not in band_cache:
            base = baseline.series(rank).values(metric)
            reps = [s.values(metric) for r in usable if (s := repeat_series(r, rank))]
            band_cache[key] = noise_band(base, reps, tolerance)
        return band_cache[key]

    results = []
    for run in others:
        ranks = []
        for rank, base_rank in _rank_pairs(baseline, run):
            mine, theirs = run.series(rank), baseline.series(base_rank)
            diffs = {
                m: MetricDiff(m, relative(theirs.values(m), mine.values(m)),
                              band(base_rank, m), tolerance)
                for m in METRICS
            }
            steps = _common(StepValues.of(mine.loss), StepValues.of(theirs.loss))[0]
            ranks.append(RankComparison(rank, base_rank, steps, diffs))
        results.append(RunComparison(run, ranks, throughput(run, baseline), bool(usable)))
    plot_rank = next((rc.ranks[0].base_rank for rc in results if rc.ranks), None)
    if plot_rank is None and train_ranks(baseline.log):
        plot_rank = train_ranks(baseline.log)[0]
    bands = {m: b for m in METRICS if (b := band(plot_rank, m)) is not None}
    return Comparison(baseline, results, list(repeats), tolerance, warmup, plot_rank, bands)


# -- the report -----------------------------------------------------------------------------


def plural(n: int, noun: str) -> str:
    """``1 repeat run``, ``2 repeat runs``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def pct(value: float, digits: int = 3) -> str:
    """A signed relative difference in percent, ``digits`` significant: ``+1.23 %``."""
    return f"{100 * value:+.{digits}g} %"


def _rank_word(rank: int | None) -> str:
    return "lines without a rank prefix" if rank is None else f"rank {rank}"


def _metric_line(d: MetricDiff, qualified: bool) -> str:
    name = METRIC_NAMES[d.metric]
    if not d.rel:
        return f"  {name}: no step with a finite value in both logs."
    first, largest, final = d.first, d.largest, d.final
    assert first and largest and final
    where = "the noise band" if qualified else f"the tolerance ({pct(d.tolerance)[1:]})"
    outside = d.first_outside
    said = f"first outside {where}: step {outside}" if outside else f"never outside {where}"
    return (
        f"  {name}: step {first[0]} {pct(first[1])}, largest {pct(largest[1])} at step "
        f"{largest[0]}, final {pct(final[1])} at step {final[0]}; {said}."
    )


def _verdict_line(rc: RunComparison) -> str:
    run = rc.run
    head = f"{run.label} ({run.path}): {rc.verdict}"
    if not run.valid:
        return f"{head}. {run.verdict.reason[0].upper()}{run.verdict.reason[1:]}"
    outside = rc.outside
    if rc.verdict == UNQUALIFIED:
        tail = (f"the loss first differs by more than the tolerance at step {outside}"
                if outside is not None else "no loss difference above the tolerance")
        return f"{head}: no repeat runs (--noise), so no noise band to judge by; {tail}."
    if outside is not None:
        d = next(r.diffs["loss"] for r in rc.ranks if r.first_outside == outside)
        # Four digits: a run just outside the band must not read as equal to it.
        return (f"{head} (loss {pct(d.rel[outside], 4)} against a band of "
                f"{pct(d.limit(outside), 4)[1:]}).")
    return f"{head}."


def _same_curves(ranks: list[RankComparison]) -> bool:
    first = ranks[0]
    return all(
        all(r.diffs[m].rel == first.diffs[m].rel for m in METRICS) for r in ranks[1:]
    )


def report_lines(c: Comparison) -> list[str]:
    """Text report of a comparison, a sentence or a labelled figure per line."""
    base = c.baseline
    out = [f"baseline: {base.label} ({base.path}): {base.describe()}."]
    used = [r for r in c.repeats if r.valid]
    if used:
        k = len(used)
        names = ", ".join(r.label for r in used)
        out.append(
            f"noise band: from {plural(k, 'repeat run')} of the baseline ({names}): at each step, "
            "the largest relative difference any repeat showed at that step or "
            f"before, at least {pct(c.tolerance)[1:]}. A further run of the same job lands "
            f"outside such a band at about 1 step in {k + 1}"
            + (", so a 'differs' verdict from it is weak; give more repeats." if k < 3 else ".")
        )
    else:
        out.append(
            "noise band: none (no --noise repeat runs of the baseline): every verdict below is "
            f"unqualified; differences are set against the tolerance {pct(c.tolerance)[1:]} only."
        )
    for r in c.repeats:
        if not r.valid:
            out.append(f"repeat {r.label} ({r.path}) is left out of the band: {r.verdict.label}: "
                       f"{r.verdict.reason}")
    for rc in c.runs:
        out.append("")
        out.append(_verdict_line(rc))
        ranks = rc.ranks
        if ranks and len(ranks) > 1 and _same_curves(ranks):
            names = ", ".join(str(r.rank) for r in ranks)
            out.append(f"  ranks {names}: identical differences on every rank; shown once.")
            ranks = ranks[:1]
        for r in ranks:
            paired = (f"{_rank_word(r.rank)}" if r.rank == r.base_rank
                      else f"{_rank_word(r.rank)} against the baseline's {_rank_word(r.base_rank)}")
            span = (f" ({r.steps_in_common[0]} to {r.steps_in_common[-1]})"
                    if r.steps_in_common else "")
            out.append(f"  {paired}: {len(r.steps_in_common)} step(s) in common{span}.")
            for m in METRICS:
                out.append(_metric_line(r.diffs[m], c.qualified))
        t = rc.throughput
        if t.ratio is not None and t.field is not None:
            out.append(
                f"  throughput: {t.ratio:.4f} x the baseline (median {_THROUGHPUT_LABELS[t.field]} "
                f"after warm-up {c.warmup}: {t.value:,.1f} against {t.base_value:,.1f})."
            )
        else:
            out.append(f"  throughput: no ratio: {t.reason}")
        mem, base_mem = rc.run.summary.memory_peak_gib, base.summary.memory_peak_gib
        if mem is not None and base_mem is not None:
            out.append(f"  memory peak: {mem:.2f} GiB (baseline {base_mem:.2f} GiB).")
    out.append("")
    verdicts = ", ".join(f"{rc.run.label}: {rc.verdict}" for rc in c.runs)
    out.append(f"verdict: {verdicts}.")
    return out
