"""The audit's text table and picture (``titan-rocm audit``, ``--plot``)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from titan_rocm.files import write_atomic


def _num(value: Any) -> str:
    return value if isinstance(value, str) else f"{value:.3g}"


def format_report(result: dict[str, Any], top: int = 10) -> str:
    """The text verdict: one line per flagged block (worst first), the worst parameters,
    the loss, cost. ``result`` is :meth:`AuditResult.to_dict`."""
    s = result["settings"]
    loss = result["loss"]
    lines = [
        f"numerics audit: {result['verdict'].upper()} ({result['tokens']} tokens, "
        f"{result['world_size']} rank(s); job {result['job_dtype']}, eager "
        f"{result['job_dtype']}, reference {result['reference_dtype']})",
        f"threshold: err_job > {s['fudge']:g} x max(err_eager, {s['floor_eps']:g} eps), or "
        f"> {s['outlier_max']:.2%} of elements beyond {s['outlier_k']:g} x the eager error's "
        f"{s['outlier_quantile']:g} quantile",
        f"loss: job {_num(loss['job'])}  eager {_num(loss['eager'])}  reference "
        f"{_num(loss['reference'])}  err_job {_num(loss['err_job'])}  err_eager "
        f"{_num(loss['err_eager'])}{'  FLAGGED' if loss['flagged'] else ''}",
    ]
    flagged_blocks = [b for b in result["blocks"] if b["flagged"]]
    if flagged_blocks:
        lines.append("")
        if result.get("origin"):
            lines.append(f"first wrong in the backward: {_block(result['origin'])} (errors made "
                         "in a block's backward reach every earlier block's gradients)")
        for b in flagged_blocks:
            how = {"compiled": " (compiled", "eager": " (eager", "mixed": " (partly compiled",
                   None: ""}[b["scope"]]
            shaped = f"; shaped by {', '.join(b['workarounds'])}" if b["workarounds"] else ""
            how = f"{how}{shaped})" if how else ""
            lines.append(f"  {_block(b['block'])}{how}: backward wrong for {len(b['flagged'])} "
                         f"gradient(s), worst ratio {b['worst_ratio']:.3g}: "
                         f"{', '.join(b['flagged'][:6])}{' ...' if len(b['flagged']) > 6 else ''}")
    rows = sorted(result["parameters"], key=lambda p: (not p["flagged"], -_key(p["ratio"])))
    lines += ["", f"{'parameter':<48} {'compiled':>8} {'err_job':>9} {'err_eager':>9} "
              f"{'ratio':>8} {'outliers':>9} {'max_abs':>9}"]
    for p in rows[:top]:
        lines.append(
            f"{p['name'][:48]:<48} {('yes' if p['compiled'] else 'no'):>8} "
            f"{_num(p['err_job']):>9} {_num(p['err_eager']):>9} {_num(p['ratio']):>8} "
            f"{_num(p['outlier_fraction']):>9} {_num(p['max_abs']):>9}"
            + ("  FLAGGED: " + p["reason"] if p["flagged"] else ""))
    if len(rows) > top:
        lines.append(f"... {len(rows) - top} more (--json lists every parameter)")
    t = result["time_s"]
    memory = result["peak_memory_bytes"]
    lines += ["", f"time: job {t['job']:.2f} s, eager {t['eager']:.2f} s, reference "
              f"{t['reference']:.2f} s, total {t['total']:.2f} s"
              + (f"; peak memory {memory / 2**30:.2f} GiB" if memory else "")]
    lines += [f"note: {note}" for note in result.get("notes") or []]
    return "\n".join(lines)


def _block(block: str) -> str:
    """``block 3`` for a layer id, the outside-blocks label as it is."""
    from titan_rocm.numerics.audit import OUTSIDE

    return block if block == OUTSIDE else f"block {block}"


def _key(value: Any) -> float:
    return float("inf") if isinstance(value, str) else float(value)


def plot(result: dict[str, Any], path: str) -> None:
    """Per-parameter ratio ``err_job / max(err_eager, floor)`` on a log scale, in model
    order, with the ``fudge`` threshold line; flagged parameters in red, block boundaries
    marked. Written atomically (PNG, or SVG by the suffix)."""
    from titan_rocm.logs.plot import require_matplotlib

    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    params = result["parameters"]
    ratios = [max(_key(p["ratio"]), 1e-6) if p["ratio"] != "nan" else 1e-6 for p in params]
    fig = Figure(figsize=(max(8, len(params) * 0.12), 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    xs = range(len(params))
    colours = ["#d62728" if p["flagged"] else "#1f77b4" for p in params]
    ax.scatter(xs, [min(r, 1e12) for r in ratios], c=colours, s=14)
    ax.set_yscale("log")
    ax.axhline(result["settings"]["fudge"], color="black", linestyle="--",
               label=f"threshold (fudge {result['settings']['fudge']:g})")
    last = None
    for i, p in enumerate(params):
        if p["block"] != last:
            ax.axvline(i - 0.5, color="#d9d9d9", linewidth=0.8)
            ax.text(i, ax.get_ylim()[1], "" if p["block"] is None else f"block {p['block']}",
                    fontsize=7, va="top", rotation=90)
            last = p["block"]
    ax.set_xlabel("parameter (model order; red: flagged)")
    ax.set_ylabel("err_job / max(err_eager, floor)")
    ax.set_title(f"numerics audit: {result['verdict']} ({result['tokens']} tokens)")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    buffer = io.BytesIO()
    fmt = "svg" if Path(path).suffix.lower() == ".svg" else "png"
    fig.savefig(buffer, format=fmt)
    write_atomic(Path(path), buffer.getvalue())
