"""How a 0.2.2 job is started (the launcher decides who registers titan-rocm).

Part of :mod:`titan_rocm.adapters.tt022.preflight` (one module per TorchTitan check it
mirrors, so a check TorchTitan drops can be dropped here alone)."""

from __future__ import annotations

from titan_rocm.adapters.common import DEFAULT_LAUNCHER, LAUNCHERS

__all__ = ["DEFAULT_LAUNCHER", "LAUNCHERS", "LAUNCH_LINES"]

LAUNCH_LINES = {
    "torchtitan": "torchrun -m torchtitan.train",
    "titan-rocm": "python -m titan_rocm.train",
}
