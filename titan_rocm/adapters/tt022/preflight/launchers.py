"""How a 0.2.2 job is started (the launcher decides who registers titan-rocm)."""

from __future__ import annotations

from titan_rocm.adapters.common import DEFAULT_LAUNCHER, LAUNCHERS

__all__ = ["DEFAULT_LAUNCHER", "LAUNCHERS", "LAUNCH_LINES"]

LAUNCH_LINES = {
    "torchtitan": "torchrun -m torchtitan.train",
    "titan-rocm": "python -m titan_rocm.train",
}
