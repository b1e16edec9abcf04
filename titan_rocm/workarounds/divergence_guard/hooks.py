"""What both generations' guard seams share: the active monitor and the grad-norm wrapper.

``clip_grad_norm_`` is looked up at each call in 0.2.2 and 0.3.0 and returns the norm already
reduced over every parallel dimension, so wrapping it is enough."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from titan_rocm import patches
from titan_rocm.workarounds.divergence_guard.monitor import Monitor

NAME = "divergence_guard"
"""Who the guard's patches are ``by``."""
_active: Monitor | None = None


def active() -> Monitor | None:
    """The monitor the wrappers report to (None: wrappers pass through)."""
    return _active


def activate(monitor: Monitor) -> None:
    """Make ``monitor`` the one the wrappers report to (the newest job's)."""
    global _active
    _active = monitor


def _wrap_clip(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    @functools.wraps(original)
    def clip_grad_norm_(*args: Any, **kwargs: Any) -> torch.Tensor:
        total_norm = original(*args, **kwargs)
        monitor = _active
        if monitor is not None and isinstance(total_norm, torch.Tensor):
            monitor.on_grad_norm(total_norm)
        return total_norm

    return clip_grad_norm_


def install_grad_norm(monitor: Monitor, scope: patches.Scope | None = None) -> None:
    """Make ``monitor`` the active one and wrap ``clip_grad_norm_`` (once per process)."""
    import torchtitan.distributed.utils as dist_utils

    activate(monitor)
    (scope or patches.current()).patch(dist_utils, "clip_grad_norm_", _wrap_clip, by=NAME)


def uninstall() -> None:
    """Restore every wrapper of the guard and deactivate the monitor (tests)."""
    global _active
    _active = None
    patches.restore(by=NAME)
