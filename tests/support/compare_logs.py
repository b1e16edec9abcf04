"""Synthetic TorchTitan logs with known loss curves, for the compare tests."""

from __future__ import annotations

import math
import random
from pathlib import Path

STEPS = [1, *range(10, 101, 10)]


def curve(step: int) -> float:
    """A loss curve like a real one: from 12 down towards 3."""
    return 3.0 + 9.0 * math.exp(-step / 25)


def tt_log(path: Path, losses: dict[int, float | str], rank: int | None = None,
           tps: float = 50_000.0, tail: list[str] | None = None,
           grad_norms: dict[int, float | str] | None = None) -> Path:
    """Write a TorchTitan log with these losses (and grad norm 1 + loss / 10 unless given)."""
    prefix = f"[rank{rank}]:" if rank is not None else ""
    lines = [f"{prefix}[titan] 2026-11-30 04:36:49 - root - INFO - Training starts at step 1"]
    for step, loss in losses.items():
        gn = (grad_norms or {}).get(step, 1 + (loss / 10 if isinstance(loss, float) else 0))
        value = f"{loss:.5f}" if isinstance(loss, float) else loss
        gn_text = f"{gn:.4f}" if isinstance(gn, float) else gn
        lines.append(
            f"{prefix}[titan] 2026-11-30 04:37:04 - root - INFO - step: {step:2d}  "
            f"loss: {value}  grad_norm: {gn_text}  memory: 37.73GiB(26.99%)  "
            f"tps: {tps + step:,.0f}  tflops: 474.90  mfu: 48.02%")
    lines += tail or []
    path.write_text("\n".join(lines) + "\n")
    return path


def noisy(seed: int, scale: float) -> dict[int, float]:
    """The curve with relative noise of up to ``scale`` (step 1 exact, as on a GPU)."""
    rng = random.Random(seed)
    return {s: curve(s) * (1 + (rng.uniform(-scale, scale) if s > 1 else 0)) for s in STEPS}


BASE = {s: curve(s) for s in STEPS}


def log_maker(folder: Path):
    """A function that writes named logs in ``folder``: make(name, losses, **kw) -> path."""

    def make(name: str, losses: dict[int, float | str], **kw) -> Path:
        return tt_log(folder / f"{name}.log", losses, **kw)

    return make


def repeats(logs, n: int = 3, scale: float = 0.01) -> list[str]:
    """``--noise`` and ``n`` repeat logs of BASE with relative noise up to ``scale``."""
    return ["--noise", *(str(logs(f"repeat{i}", noisy(100 + i, scale))) for i in range(n))]
