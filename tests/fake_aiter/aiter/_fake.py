"""Test controls of the fake aiter: the simulated device and the record of kernel calls."""

from __future__ import annotations

from typing import Any

DEVICE_ARCH = "gfx942"
"""gcnArchName target of the pretend device (what the kernels would really run on)."""

CALLS: list[tuple[str, dict[str, Any]]] = []
"""(kernel name, details) for every kernel-level call, in order."""


def record(name: str, **details: Any) -> None:
    CALLS.append((name, details))


def names() -> list[str]:
    """The kernel names called so far."""
    return [name for name, _ in CALLS]


def reset(device_arch: str = "gfx942") -> None:
    """Forget recorded calls and set the pretend device arch."""
    global DEVICE_ARCH
    CALLS.clear()
    DEVICE_ARCH = device_arch
