"""The picture of ``titan-rocm compare --plot``: loss curves on one axis with the noise band
shaded, grad norms below, the relative loss difference to the baseline below that, and a
marker at each run's first non-finite step.

matplotlib is an optional extra (``pip install 'titan-rocm[plot]'``), imported only here and
only when a picture is asked for; it draws headless (Agg), and the file is written through a
temporary file and a rename, so an interrupted run never leaves half a picture.
"""

from __future__ import annotations

import io
import math
import textwrap
from pathlib import Path
from typing import Any

from titan_rocm.gemm_tables.capture_safe import write_atomic
from titan_rocm.logs.compare import (
    CompareError,
    Comparison,
    Run,
    Series,
    pct,
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
    """Import matplotlib with the headless Agg backend, or raise :class:`MissingMatplotlib`."""
    try:
        import matplotlib
    except ImportError as exc:
        raise MissingMatplotlib(
            "--plot needs matplotlib, which is not installed; install it with: "
            "pip install 'titan-rocm[plot]' (or pip install matplotlib)."
        ) from exc
    matplotlib.use("Agg", force=True)


def _xy(values: dict[int, float]) -> tuple[list[int], list[float]]:
    steps = sorted(values)
    return steps, [v if math.isfinite(v) else math.nan for v in (values[s] for s in steps)]


def _label(run: Run, verdict: str) -> str:
    return f"{run.label}: {verdict}"


def _shade_band(ax: Any, base: dict[int, float], band: dict[int, float] | None,
                label: str | None) -> None:
    if not band:
        return
    steps = [s for s in sorted(base) if s in band and math.isfinite(base[s])]
    if not steps:
        return
    lo = [base[s] - abs(base[s]) * band[s] for s in steps]
    hi = [base[s] + abs(base[s]) * band[s] for s in steps]
    ax.fill_between(steps, lo, hi, color=BAND_COLOUR, linewidth=0, label=label, zorder=0)


def _mark_nonfinite(ax: Any, series: Series, colour: str, label: str) -> None:
    step = series.first_nonfinite()
    if step is None:
        return
    ax.axvline(step, color=colour, linestyle=":", linewidth=1.2)
    ax.plot([step], [0.97], transform=ax.get_xaxis_transform(), marker="X", markersize=10,
            color=colour, clip_on=False, zorder=5)
    ax.annotate(f"{label}: first non-finite\nvalue at step {step}", (step, 0.97),
                xycoords=("data", "axes fraction"), xytext=(6, -4),
                textcoords="offset points", va="top", fontsize=8, color=colour)


def _title(c: Comparison) -> str:
    others = ", ".join(rc.run.label for rc in c.runs)
    used = [r for r in c.repeats if r.valid]
    rank = "" if c.plot_rank is None else f", rank {c.plot_rank}"
    if used:
        k = len(used)
        noise = (f"grey band: run-to-run noise from {k} repeat run(s) of the baseline "
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
    import matplotlib.pyplot as plt

    rank = c.plot_rank
    base = c.baseline.series(rank)
    fig, (ax_loss, ax_gn, ax_rel) = plt.subplots(
        3, 1, sharex=True, figsize=(size[0] / DPI, size[1] / DPI), dpi=DPI,
        gridspec_kw={"height_ratios": [3, 2, 2]},
    )
    try:
        used = [r for r in c.repeats if r.valid]
        repeats = [s for r in used if (s := repeat_series(r, rank)) is not None]
        band_label = "noise band" if used else None
        _shade_band(ax_loss, base.loss, c.bands.get("loss"), band_label)
        _shade_band(ax_gn, base.grad_norm, c.bands.get("grad_norm"), band_label)
        for i, s in enumerate(repeats):
            label = "repeat of the baseline" if i == 0 else None
            for ax, metric in ((ax_loss, "loss"), (ax_gn, "grad_norm")):
                ax.plot(*_xy(s.values(metric)), color=REPEAT_COLOUR, linewidth=1,
                        linestyle="--", label=label if ax is ax_loss else None)
            ax_rel.plot(*_xy(relative(base.loss, s.loss)), color=REPEAT_REL_COLOUR, linewidth=1,
                        linestyle="--", zorder=2)
        base_label = f"{c.baseline.label} (baseline)"
        ax_loss.plot(*_xy(base.loss), color=BASE_COLOUR, linewidth=1.6, marker="o",
                     markersize=3, label=base_label)
        ax_gn.plot(*_xy(base.grad_norm), color=BASE_COLOUR, linewidth=1.6, marker="o",
                   markersize=3)
        _mark_nonfinite(ax_loss, base, BASE_COLOUR, c.baseline.label)
        band = c.bands.get("loss")
        if band:
            steps = sorted(band)
            ax_rel.fill_between(steps, [-100 * band[s] for s in steps],
                                [100 * band[s] for s in steps], color=BAND_COLOUR, linewidth=0,
                                zorder=0)
        ax_rel.axhline(0, color=BASE_COLOUR, linewidth=1)
        for i, rc in enumerate(c.runs):
            colour = RUN_COLOURS[i % len(RUN_COLOURS)]
            run_rank = next((r.rank for r in rc.ranks if r.base_rank == rank), None)
            series = rc.run.series(run_rank if rc.ranks else rank)
            label = _label(rc.run, rc.verdict)
            ax_loss.plot(*_xy(series.loss), color=colour, linewidth=1.4, marker="o",
                         markersize=3, label=label)
            ax_gn.plot(*_xy(series.grad_norm), color=colour, linewidth=1.4, marker="o",
                       markersize=3)
            rel = relative(base.loss, series.loss)
            steps = sorted(rel)
            ax_rel.plot(steps, [100 * rel[s] for s in steps], color=colour, linewidth=1.4,
                        marker="o", markersize=3)
            _mark_nonfinite(ax_loss, series, colour, rc.run.label)
            _mark_nonfinite(ax_gn, series, colour, rc.run.label)
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
    finally:
        plt.close(fig)


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
