"""The audit's text report and picture (``titan-rocm audit``, ``--plot``, the training log)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from titan_rocm import audit_message
from titan_rocm.files import write_atomic

OUTSIDE = ("embedding", "head")


def _num(value: Any) -> str:
    return value if isinstance(value, str) else f"{value:.3g}"


def _key(value: Any) -> float:
    return float("inf") if isinstance(value, str) and value != "nan" else (
        -1.0 if value == "nan" else float(value))


def label(segment: str | None) -> str:
    """``block 3`` for a block's key, the outside segments' names as they are."""
    if segment is None:
        return "none"
    return segment if segment in OUTSIDE or " " in segment else f"block {segment}"


def format_report(result: dict[str, Any], top: int = 10, step: int | None = None) -> str:
    """The text verdict of :meth:`AuditResult.to_dict`. Every line starts with the audit's name or
    two spaces, so no log reader takes one for a metric."""
    lines = [
        f"{audit_message.verdict_line(result['verdict'], step)} ({result['tokens']} "
        f"tokens, {result['world_size']} rank(s); job {result['job_dtype']}, reference "
        f"{result['reference']}; block by block, teacher-forced)",
        *_part_lines(result.get("part")),
        *_first_wrong_lines(result),
        *_loss_lines(result["loss"]),
        _threshold_line(result["settings"]),
        *_segment_lines(result["segments"], step),
        *_tensor_lines(result["tensors"], top),
        *_cost_lines(result),
    ]
    return "\n".join(lines)


def _part_lines(part: dict[str, Any] | None) -> list[str]:
    if not part:
        return []
    what = [f"block{'s' if len(part['blocks']) > 1 else ''} "
            f"{', '.join(part['blocks'])}"] if part["blocks"] else []
    what += ["the embedding, the head and the end-to-end loss"] if part["outside"] else []
    return [f"  part {part['part']} of {part['of']} (numerics_audit_spread): "
            f"{' and '.join(what)}"]


def _first_wrong_lines(result: dict[str, Any]) -> list[str]:
    first = result.get("first_wrong") or {}
    tensors = result["tensors"]
    lines = []
    for direction in ("forward", "backward"):
        seg = first.get(direction)
        if seg is None:
            continue
        module = (result.get("first_wrong_module") or {}).get(direction)
        worst = max((t for t in tensors if t["segment"] == seg and t["flagged"]
                     and t["direction"] == direction
                     and (module is None or t.get("module") == module)),
                    key=lambda t: _key(t["score"]), default=None)
        why = f": {worst['name']}: {worst['reason']}" if worst else ""
        inside = f", {module}" if module else ""
        lines.append(f"  first wrong in the {direction}: {label(seg)}{inside}{why}")
    return lines


def _loss_lines(loss: dict[str, Any] | None) -> list[str]:
    if loss is None:
        return []
    return [f"  end-to-end loss: job {_num(loss['job'])}, eager {_num(loss['eager'])}, "
            f"reference {_num(loss['reference'])}; relative error job "
            f"{_num(loss['err_job'])}, eager {_num(loss['err_eager'])}"
            + ("  FLAGGED" if loss["flagged"] else "")]


def _threshold_line(s: dict[str, Any]) -> str:
    inside = ""
    if "child_fudge" in s:  # an audit's JSON from before the children's own multipliers has none
        inside = (f"; inside a block {s['child_fudge']:g} x for parameter gradients, "
                  f"{s['child_activation_fudge']:g} x for outputs and input gradients")
    return (f"  threshold: error > {s['fudge']:g} x eager error "
            f"({s.get('activation_fudge', s['fudge']):g} x for block outputs and input "
            f"gradients{inside}) + {s['floor_eps']:g} float32 eps, "
            f"or > {s['outlier_max']:.2%} of elements beyond {s['outlier_k']:g} x the eager "
            f"error's {s['outlier_quantile']:g} quantile")


def _segment_lines(segs: list[dict[str, Any]], step: int | None) -> list[str]:
    shown = segs if step is None else [
        g for g in segs if g["forward"]["flagged"] or g["backward"]["flagged"]]
    lines = []
    if shown:
        lines += ["", f"  {'segment':<12} {'scope':<9} {'forward':<18} {'backward':<18} "
                      "workarounds"]
        for g in shown:
            lines.append(f"  {label(g['segment']):<12} {g['scope'] or '-':<9} "
                         f"{_direction(g['forward']):<18} {_direction(g['backward']):<18} "
                         f"{', '.join(g['workarounds']) or '-'}")
    if step is not None and len(shown) < len(segs):
        lines.append(f"  ({len(segs) - len(shown)} segment(s) within the thresholds)")
    return lines


def _tensor_lines(tensors: list[dict[str, Any]], top: int) -> list[str]:
    rows = sorted(tensors, key=lambda t: (not t["flagged"], -_key(t["score"])))
    lines = ["", f"  {'tensor':<44} {'dir':<4} {'err_job':>9} {'err_eager':>9} "
                 f"{'ratio':>8} {'outliers':>9}"]
    for t in rows[:top]:
        lines.append(
            f"  {t['name'][:44]:<44} {_DIRECTION[t['direction']]:<4} {_num(t['err_job']):>9} "
            f"{_num(t['err_eager']):>9} {_num(t['ratio']):>8} "
            f"{_num(t['outlier_fraction']):>9}"
            + ("  FLAGGED: " + t["reason"] if t["flagged"] else ""))
    if len(rows) > top:
        lines.append(f"  ... {len(rows) - top} more (--json lists every tensor)")
    return lines


def _cost_lines(result: dict[str, Any]) -> list[str]:
    memory = result.get("peak_memory_bytes")
    parts = ", ".join(f"{k.replace('_', ' ')} {v:.2f} s" for k, v in result["time_s"].items())
    return ["", f"  time: {parts}" + (f"; peak memory {memory / 2**30:.2f} GiB" if memory
                                      else ""),
            *(f"  note: {note}" for note in result.get("notes") or [])]


_DIRECTION = {"forward": "fwd", "backward": "bwd"}


def _direction(row: dict[str, Any]) -> str:
    flagged = row["flagged"]
    worst = _num(row["worst_score"])
    return f"WRONG ({len(flagged)}) {worst}" if flagged else f"ok {worst}"


def plot(result: dict[str, Any], path: str) -> None:
    """Each tensor's score on a log scale, in forward order, flagged ones in red; written atomically
    (PNG, or SVG by the suffix)."""
    from titan_rocm.logs.plot import require_matplotlib

    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    tensors = result["tensors"]
    scores = [min(max(_key(t["score"]), 1e-6), 1e12) for t in tensors]
    fig = Figure(figsize=(max(8, len(tensors) * 0.1), 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    colours = ["#d62728" if t["flagged"] else
               ("#1f77b4" if t["direction"] == "backward" else "#2ca02c") for t in tensors]
    ax.scatter(range(len(tensors)), scores, c=colours, s=12)
    ax.set_yscale("log")
    ax.axhline(1.0, color="black", linestyle="--", label="threshold")
    last = None
    for i, t in enumerate(tensors):
        if t["segment"] != last:
            ax.axvline(i - 0.5, color="#d9d9d9", linewidth=0.8)
            ax.text(i, ax.get_ylim()[1], label(t["segment"]), fontsize=7, va="top",
                    rotation=90)
            last = t["segment"]
    ax.set_xlabel("tensor (forward order; green: forward outputs, blue: gradients, red: "
                  "flagged)")
    ax.set_ylabel("error / threshold")
    ax.set_title(f"numerics audit: {result['verdict']} ({result['tokens']} tokens)")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    buffer = io.BytesIO()
    fmt = "svg" if Path(path).suffix.lower() == ".svg" else "png"
    fig.savefig(buffer, format=fmt)
    write_atomic(Path(path), buffer.getvalue())
