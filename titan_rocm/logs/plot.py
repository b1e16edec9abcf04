"""The picture of ``titan-rocm compare --plot`` (docs/compare.md); matplotlib is an optional extra,
imported only here, and the file is written atomically."""

from __future__ import annotations

import io
import math
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from titan_rocm.files import write_atomic
from titan_rocm.logs.compare import (
    CompareError,
    Comparison,
    pct,
    plural,
    relative,
    repeat_series,
)

DPI = 100
MARGIN_LEFT = 110
"""Pixels left of the axes: two-line y labels and tick labels such as ``-1.5`` or ``12.5``."""
BASE_COLOUR = "black"
REPEAT_COLOUR = "#9a9a9a"
REPEAT_REL_COLOUR = "#6e6e6e"  # darker: it lies on the band it makes
BAND_COLOUR = "#d9d9d9"
RUN_COLOURS: tuple[str, ...] = (
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
)


class MissingMatplotlib(CompareError):
    """matplotlib is not installed: ``str()`` says how to install it."""


def require_matplotlib() -> None:
    """Raise :class:`MissingMatplotlib` when matplotlib cannot be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise MissingMatplotlib(
            "--plot needs matplotlib, which is not installed; install it with: "
            "pip install 'titan-rocm[plot]' (or pip install matplotlib)."
        ) from exc


PLOT_SUFFIXES: tuple[str, ...] = (".png", ".svg")
"""What ``--plot`` writes (``compare``, ``audit``): PNG or SVG, by the file's suffix."""


def plot_path(text: str) -> Path:
    """``--plot``'s file, checked before any work; CompareError names what is accepted."""
    path = Path(text)
    if path.suffix.lower() not in PLOT_SUFFIXES:
        raise CompareError(
            f"--plot {text!r} is not valid: the file name must end in "
            f"{' or '.join(PLOT_SUFFIXES)}.")
    if not path.parent.is_dir():
        raise CompareError(f"--plot {text!r}: the directory {str(path.parent)!r} does not exist.")
    return path


PANELS: tuple[str, ...] = ("difference", "loss", "grad_norm")
"""Top to bottom: the difference panel is the main one."""


@dataclass(frozen=True)
class Curve:
    """One line of the picture, in the units it is drawn in (difference: percent)."""

    panel: str
    """One of :data:`PANELS`."""
    role: str
    """``baseline``, ``repeat`` or ``run``."""
    name: str
    """The run's label (for the marker at its first non-finite step)."""
    label: str
    """Its legend entry (all repeats share one)."""
    colour: str
    steps: tuple[int, ...]
    values: tuple[float, ...]
    """Non-finite values are NaN: a gap in the line."""
    first_nonfinite: int | None = None
    """The step the run's verdict says it diverged at (else its first logged non-finite value)."""
    note: str = ""
    """The mark's text: the same story as the run's legend entry."""
    first_outside: int | None = None
    """Difference panel: the first step the run's loss leaves the noise band."""


def _curve(panel: str, role: str, name: str, label: str, colour: str,
           values: dict[int, float], bad: tuple[int | None, str] = (None, ""),
           first_outside: int | None = None) -> Curve:
    steps = tuple(sorted(values))
    return Curve(panel, role, name, label, colour, steps,
                 tuple(v if math.isfinite(v) else math.nan for v in (values[s] for s in steps)),
                 bad[0], bad[1], first_outside)


def _bad(run: Any, logged: int | None) -> tuple[int | None, str]:
    """Where to mark a non-finite run: the verdict's step (the guard may name one before the first
    logged bad value), and the logged one if later."""
    verdict = run.verdict
    step = verdict.step if verdict.status == "diverged" else logged
    if step is None:
        return None, ""
    note = f"{run.label}: {verdict.label if verdict.status == 'diverged' else 'non-finite'}"
    if verdict.status != "diverged":
        note += f" at step {step}"
    if logged is not None and logged != step:
        note += f"\n(first non-finite value logged at step {logged})"
    return step, note


def _gib(value: float | None) -> str:
    return f"{value:.1f} GiB" if value is not None else "memory not logged"


def _base_stats(run: Any) -> str:
    stats = run.summary.stats or {}
    tps = stats.get("tps")
    rate = f"{tps.median:,.0f} tokens/s" if tps is not None else "no tokens/s"
    return f"{rate}, {_gib(run.summary.memory_peak_gib)}" if run.summary.valid else \
        run.summary.reason or "no figures"


def _run_stats(rc: Any) -> str:
    t = rc.throughput
    rate = (f"{t.ratio:.3f}x {_THROUGHPUT_NAMES.get(t.field, t.field)}" if t.ratio is not None
            else "no throughput ratio")
    return f"{rate}, {_gib(rc.run.summary.memory_peak_gib)}"


_THROUGHPUT_NAMES = {"tps": "tokens/s", "tflops": "TFLOP/s", "iteration_ms": "speed"}


def curves(c: Comparison) -> list[Curve]:
    """Every line the picture draws, repeats first (underneath), on :attr:`Comparison.plot_rank`."""
    rank = c.plot_rank
    base = c.baseline.series(rank)
    out: list[Curve] = []
    for r in c.repeats:
        s = repeat_series(r, rank) if r.valid else None
        if s is None:
            continue
        label = "repeat of the baseline"
        out.append(_curve("loss", "repeat", r.label, label, REPEAT_COLOUR, s.loss))
        out.append(_curve("grad_norm", "repeat", r.label, label, REPEAT_COLOUR, s.grad_norm))
        rel = relative(base.loss, s.loss)
        out.append(_curve("difference", "repeat", r.label, label, REPEAT_REL_COLOUR,
                          {t: 100 * v for t, v in rel.items()}))
    name = c.baseline.label
    label = f"baseline: {name} ({_base_stats(c.baseline)})"
    bad = _bad(c.baseline, base.first_nonfinite())
    out.append(_curve("loss", "baseline", name, label, BASE_COLOUR, base.loss, bad))
    out.append(_curve("grad_norm", "baseline", name, label, BASE_COLOUR, base.grad_norm, bad))
    for i, rc in enumerate(c.runs):
        colour = RUN_COLOURS[i % len(RUN_COLOURS)]
        run_rank = next((r.rank for r in rc.ranks if r.base_rank == rank), None)
        series = rc.run.series(run_rank if rc.ranks else rank)
        name, label = rc.run.label, f"{rc.run.label}: {rc.verdict} ({_run_stats(rc)})"
        bad = _bad(rc.run, series.first_nonfinite())
        out.append(_curve("loss", "run", name, label, colour, series.loss, bad))
        out.append(_curve("grad_norm", "run", name, label, colour, series.grad_norm, bad))
        rel = relative(base.loss, series.loss)
        outside = next((r.first_outside for r in rc.ranks if r.base_rank == rank), None) \
            if c.qualified else None
        out.append(_curve("difference", "run", name, label, colour,
                          {t: 100 * v for t, v in rel.items()}, bad, outside))
    return out


def bands(c: Comparison) -> dict[str, tuple[list[int], list[float], list[float]]]:
    """The shaded noise band of each panel: (steps, low, high) in the panel's units."""
    base = c.baseline.series(c.plot_rank)
    out = {}
    for panel, metric in (("loss", "loss"), ("grad_norm", "grad_norm")):
        band, values = c.bands.get(metric), base.values(metric)
        steps = [s for s in sorted(values) if band and s in band and math.isfinite(values[s])]
        if band and steps:
            out[panel] = (steps, [values[s] - abs(values[s]) * band[s] for s in steps],
                          [values[s] + abs(values[s]) * band[s] for s in steps])
    band = c.bands.get("loss")
    if band:
        steps = sorted(band)
        out["difference"] = (steps, [-100 * band[s] for s in steps],
                             [100 * band[s] for s in steps])
    return out


def _draw(ax: Any, curve: Curve, legend: bool, marks: list[str]) -> None:
    style: dict[str, Any] = (
        {"linewidth": 1, "linestyle": "--", "zorder": 2} if curve.role == "repeat"
        else {"linewidth": 1.6 if curve.role == "baseline" else 1.4, "marker": "o",
              "markersize": 3, "zorder": 3}
    )
    ax.plot(curve.steps, curve.values, color=curve.colour,
            label=curve.label if legend else None, **style)
    if curve.first_outside is not None and curve.first_outside in curve.steps:
        value = curve.values[curve.steps.index(curve.first_outside)]
        ax.plot([curve.first_outside], [value], marker="o", markersize=11, markeredgewidth=2,
                markerfacecolor="none", color=curve.colour, zorder=6)
    step = curve.first_nonfinite
    if step is None:
        return
    ax.axvline(step, color=curve.colour, linestyle=":", linewidth=1.2)
    if curve.panel != "difference" and curve.role != "baseline":
        return  # one mark and one sentence per run: on the main panel
    height = 0.97 - 0.1 * sum(note.count("\n") + 1 for note in marks)
    marks.append(curve.note)
    ax.plot([step], [height], transform=ax.get_xaxis_transform(), marker="X", markersize=10,
            color=curve.colour, clip_on=False, zorder=5)
    ax.annotate(curve.note, (step, height), xycoords=("data", "axes fraction"), xytext=(8, 0),
                textcoords="offset points", va="center", fontsize=8, color=curve.colour,
                bbox={"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none",
                      "alpha": 0.8})


def _title(c: Comparison) -> str:
    rank = "" if c.plot_rank is None else f", rank {c.plot_rank}"
    used = [r for r in c.repeats if r.valid]
    if used:
        k = len(used)
        noise = (f"grey band: run-to-run noise from {plural(k, 'repeat run')} of the baseline "
                 f"(at least {pct(c.tolerance)[1:]})")
        if k < 3:
            noise += f"; a weak band: a rerun of the same job leaves it at ~1 step in {k + 1}"
    else:
        noise = "no repeat runs given: no noise band, verdicts unqualified"
    return f"{plural(len(c.runs), 'run')} against the baseline {c.baseline.label}{rank}\n{noise}"


def _wrapped(text: str, width_px: int) -> str:
    """``text`` wrapped to the axes' width (~8 pixels a character at 11 points)."""
    width = max(40, int(width_px * 0.85 / 8))
    return "\n".join(textwrap.fill(line, width) for line in text.splitlines())


def _plain_log_ticks(ax: Any) -> None:
    """Log-scale ticks as plain numbers (``3``, ``6``, ``10``), not ``6x10^0``."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    plain = FuncFormatter(lambda v, _pos: f"{v:g}")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 3.0, 5.0)))
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda _v, _pos: ""))


def _difference_limits(ax: Any, drawn: list[Curve], band: tuple | None) -> bool:
    """Fit the main panel to the runs and the band; False when no run has a finite difference."""
    finite = [[v for v in cv.values if math.isfinite(v)] for cv in drawn if cv.role == "run"]
    if not any(len(f) > 1 for f in finite):  # one point (step 1, +0 %) is no curve either
        return False
    values = [v for f in finite for v in f]
    if band is not None:
        values += [v for v in band[1] + band[2] if math.isfinite(v)]
    low, high = min(values + [0.0]), max(values + [0.0])
    pad = (high - low) * 0.12 or 0.5
    ax.set_ylim(low - pad, high + pad)
    return True


def figure_bytes(c: Comparison, fmt: str, size: tuple[int, int] = (1200, 1100),
                 log_y: bool = False) -> bytes:
    """The picture of ``c`` as ``png`` or ``svg`` bytes, ``size`` pixels (at 100 dpi)."""
    fig = figure(c, size, log_y)
    buffer = io.BytesIO()
    # No metadata: the same logs give the same bytes (the docs' pictures are committed).
    metadata: dict[str, Any] = {"Software": None} if fmt == "png" else {"Date": None}
    fig.savefig(buffer, format=fmt, dpi=DPI, metadata=metadata)
    return buffer.getvalue()


def figure(c: Comparison, size: tuple[int, int] = (1200, 1100), log_y: bool = False) -> Any:
    """The picture of ``c`` as a matplotlib ``Figure`` (its axes in :data:`PANELS` order)."""
    require_matplotlib()
    # A bare Figure, not pyplot: no GUI backend, no global state, nothing to close; savefig
    # picks the Agg (png) or SVG renderer by format.
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(size[0] / DPI, size[1] / DPI), dpi=DPI)
    axes = fig.subplots(3, 1, sharex=True, gridspec_kw={"height_ratios": [4, 2, 2]})
    ax_rel, ax_loss, ax_gn = axes
    by_panel = dict(zip(PANELS, axes, strict=True))
    all_bands = bands(c)
    all_curves = curves(c)
    drawn_rel = [cv for cv in all_curves if cv.panel == "difference"]
    has_difference = _difference_limits(ax_rel, drawn_rel, all_bands.get("difference"))
    for panel, (steps, low, high) in all_bands.items():
        if panel == "difference" and not has_difference:
            continue  # an empty grey block says nothing
        by_panel[panel].fill_between(steps, low, high, color=BAND_COLOUR, linewidth=0, zorder=0,
                                     label="noise band" if panel == "difference" else None)
    ax_rel.axhline(0, color=BASE_COLOUR, linewidth=1)
    if not has_difference:
        ax_rel.text(0.5, 0.3, "no loss difference to draw beyond one step: "
                    + "; ".join(f"{rc.run.label}: {rc.verdict}" for rc in c.runs),
                    transform=ax_rel.transAxes, ha="center", va="center", fontsize=10,
                    color="#444444", wrap=True)
    # One note per step where some run first leaves the band (its ring is on the run's line).
    for step in sorted({cv.first_outside for cv in drawn_rel if cv.first_outside is not None}):
        ax_rel.annotate(f"first outside the band: step {step}", (step, 0.03),
                        xycoords=("data", "axes fraction"), xytext=(6, 0),
                        textcoords="offset points", fontsize=8, color="#333333")
        ax_rel.axvline(step, color="#999999", linestyle=":", linewidth=1, zorder=1)
    labelled: set[str] = set()
    marks: dict[str, list[str]] = {panel: [] for panel in PANELS}
    for curve in all_curves:
        # One legend entry per label, from whichever panel draws it first.
        legend = curve.label not in labelled
        labelled.add(curve.label)
        _draw(by_panel[curve.panel], curve, legend, marks[curve.panel])
    if log_y:
        ax_loss.set_yscale("log")
        _plain_log_ticks(ax_loss)
    ax_rel.set_ylabel("loss difference to\nthe baseline (%)")
    ax_loss.set_ylabel("training loss" + ("\n(log scale)" if log_y else ""))
    ax_gn.set_ylabel("grad norm")
    ax_gn.set_xlabel("training step")
    ax_gn.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
    for ax in axes:
        ax.grid(True, color="#eeeeee", linewidth=0.8)
    fig.align_ylabels(axes)
    title = _wrapped(_title(c), size[0])
    handles, labels = [], []
    for ax in axes:
        h, lab = ax.get_legend_handles_labels()
        handles += h
        labels += lab
    # Above the panels, between the title and the main panel: it covers no data or mark.
    rows = len(labels)
    title_px = 17 * (title.count("\n") + 1)
    legend_px = 20 * rows + 12
    fig.suptitle(title, fontsize=11, y=1 - 10 / size[1], va="top")
    fig.legend(handles, labels, loc="upper left", fontsize=9, frameon=False,
               bbox_to_anchor=(MARGIN_LEFT / size[0], 1 - (14 + title_px) / size[1]))
    # Fixed margins (in pixels), not tight_layout: the axes sit in the same place whatever
    # the data, so two pictures of one comparison line up.
    top = 24 + title_px + legend_px
    fig.subplots_adjust(left=MARGIN_LEFT / size[0], right=1 - 20 / size[0],
                        bottom=55 / size[1], top=1 - top / size[1], hspace=0.15)
    return fig


def plot(c: Comparison, path: str | Path, size: tuple[int, int] = (1200, 1100),
         log_y: bool = False) -> None:
    """Draw ``c`` to ``path`` (``.png`` or ``.svg``), atomically; MissingMatplotlib or OSError."""
    path = Path(path)
    data = figure_bytes(c, path.suffix.lower().lstrip("."), size, log_y)
    write_atomic(path, data)
