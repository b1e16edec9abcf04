"""The picture of ``titan-rocm compare --plot``: loss curves on one axis with the noise band
shaded, grad norms below, the relative loss difference to the baseline below that, and a
marker at each run's first non-finite step.

matplotlib is an optional extra (``pip install 'titan-rocm[plot]'``), imported only here and
only when a picture is asked for; it draws headless (a bare Figure rendered by Agg or SVG, no
pyplot), and the file is written through a temporary file and a rename, so an interrupted run
never leaves half a picture.
"""

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


PANELS: tuple[str, ...] = ("loss", "grad_norm", "difference")


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
    """Marked on the panel: the run's first step with a non-finite loss or grad norm."""


def _curve(panel: str, role: str, name: str, label: str, colour: str,
           values: dict[int, float], first_nonfinite: int | None = None) -> Curve:
    steps = tuple(sorted(values))
    return Curve(panel, role, name, label, colour, steps,
                 tuple(v if math.isfinite(v) else math.nan for v in (values[s] for s in steps)),
                 first_nonfinite)


def curves(c: Comparison) -> list[Curve]:
    """Every line the picture of ``c`` draws, repeats first (underneath), then the baseline,
    then each run, on the baseline rank :attr:`Comparison.plot_rank`."""
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
    name, label = c.baseline.label, f"baseline: {c.baseline.label}"
    bad = base.first_nonfinite()
    out.append(_curve("loss", "baseline", name, label, BASE_COLOUR, base.loss, bad))
    out.append(_curve("grad_norm", "baseline", name, label, BASE_COLOUR, base.grad_norm, bad))
    for i, rc in enumerate(c.runs):
        colour = RUN_COLOURS[i % len(RUN_COLOURS)]
        run_rank = next((r.rank for r in rc.ranks if r.base_rank == rank), None)
        series = rc.run.series(run_rank if rc.ranks else rank)
        name, label = rc.run.label, f"{rc.run.label}: {rc.verdict}"
        bad = series.first_nonfinite()
        out.append(_curve("loss", "run", name, label, colour, series.loss, bad))
        out.append(_curve("grad_norm", "run", name, label, colour, series.grad_norm, bad))
        rel = relative(base.loss, series.loss)
        out.append(_curve("difference", "run", name, label, colour,
                          {t: 100 * v for t, v in rel.items()}))
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


def _draw(ax: Any, curve: Curve, legend: bool) -> None:
    """Draw one curve (in the legend if ``legend``) and the marker at its first non-finite
    step."""
    style: dict[str, Any] = (
        {"linewidth": 1, "linestyle": "--", "zorder": 2} if curve.role == "repeat"
        else {"linewidth": 1.6 if curve.role == "baseline" else 1.4, "marker": "o",
              "markersize": 3, "zorder": 3}
    )
    ax.plot(curve.steps, curve.values, color=curve.colour,
            label=curve.label if legend else None, **style)
    step = curve.first_nonfinite
    if step is None:
        return
    ax.axvline(step, color=curve.colour, linestyle=":", linewidth=1.2)
    ax.plot([step], [0.97], transform=ax.get_xaxis_transform(), marker="X", markersize=10,
            color=curve.colour, clip_on=False, zorder=5)
    ax.annotate(f"{curve.name}: first non-finite\nvalue at step {step}", (step, 0.97),
                xycoords=("data", "axes fraction"), xytext=(6, -4),
                textcoords="offset points", va="top", fontsize=8, color=curve.colour)


def _title(c: Comparison) -> str:
    others = ", ".join(rc.run.label for rc in c.runs)
    used = [r for r in c.repeats if r.valid]
    rank = "" if c.plot_rank is None else f", rank {c.plot_rank}"
    if used:
        k = len(used)
        noise = (f"grey band: run-to-run noise from {plural(k, 'repeat run')} of the baseline "
                 f"(at least {pct(c.tolerance)[1:]})")
        if k < 3:
            noise += f"; a weak band: a rerun of the same job leaves it at ~1 step in {k + 1}"
    else:
        noise = "no repeat runs given: no noise band, verdicts unqualified"
    return f"{others} against the baseline {c.baseline.label}{rank}\n{noise}"


def _wrapped(text: str, width_px: int) -> str:
    """``text`` wrapped to the axes' width (85 % of the figure; ~8 pixels a character at
    11 points)."""
    width = max(40, int(width_px * 0.85 / 8))
    return "\n".join(textwrap.fill(line, width) for line in text.splitlines())


def figure_bytes(c: Comparison, fmt: str, size: tuple[int, int] = (1200, 1100),
                 log_y: bool = False) -> bytes:
    """The picture of ``c`` as ``png`` or ``svg`` bytes, ``size`` pixels (at 100 dpi)."""
    require_matplotlib()
    # A bare Figure, not pyplot: no GUI backend, no global state, nothing to close; savefig
    # picks the Agg (png) or SVG renderer by format.
    from matplotlib.figure import Figure

    fig = Figure(figsize=(size[0] / DPI, size[1] / DPI), dpi=DPI)
    axes = fig.subplots(3, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2, 2]})
    ax_loss, ax_gn, ax_rel = axes
    by_panel = dict(zip(PANELS, axes, strict=True))
    for panel, (steps, low, high) in bands(c).items():
        by_panel[panel].fill_between(steps, low, high, color=BAND_COLOUR, linewidth=0,
                                     zorder=0, label="noise band" if panel == "loss" else None)
    ax_rel.axhline(0, color=BASE_COLOUR, linewidth=1)
    labelled: set[str] = set()
    for curve in curves(c):
        legend = curve.panel == "loss" and curve.label not in labelled  # legend: loss panel
        labelled.add(curve.label)
        _draw(by_panel[curve.panel], curve, legend)
    if log_y:
        ax_loss.set_yscale("log")
    ax_loss.set_ylabel("training loss" + (" (log scale)" if log_y else ""))
    title = _wrapped(_title(c), size[0])
    ax_loss.set_title(title, fontsize=11)
    ax_loss.legend(fontsize=9, loc="upper right")
    ax_gn.set_ylabel("grad norm")
    ax_rel.set_ylabel("loss difference to\nthe baseline (%)")
    ax_rel.set_xlabel("training step")
    for ax in (ax_loss, ax_gn, ax_rel):
        ax.grid(True, color="#eeeeee", linewidth=0.8)
    fig.align_ylabels((ax_loss, ax_gn, ax_rel))
    # Fixed margins (in pixels), not tight_layout: the axes sit in the same place whatever
    # the data, so two pictures of one comparison line up.
    top = 20 + 17 * (title.count("\n") + 1)
    fig.subplots_adjust(left=MARGIN_LEFT / size[0], right=1 - 20 / size[0],
                        bottom=55 / size[1], top=1 - top / size[1], hspace=0.15)
    buffer = io.BytesIO()
    # No metadata: the same logs give the same bytes (the docs' pictures are committed).
    metadata: dict[str, Any] = {"Software": None} if fmt == "png" else {"Date": None}
    fig.savefig(buffer, format=fmt, dpi=DPI, metadata=metadata)
    return buffer.getvalue()


def plot(c: Comparison, path: str | Path, size: tuple[int, int] = (1200, 1100),
         log_y: bool = False) -> None:
    """Draw ``c`` to ``path`` (``.png`` or ``.svg``), atomically.

    Raises:
        MissingMatplotlib: matplotlib is not installed.
        OSError: the file cannot be written.
    """
    path = Path(path)
    data = figure_bytes(c, path.suffix.lower().lstrip("."), size, log_y)
    write_atomic(path, data)
