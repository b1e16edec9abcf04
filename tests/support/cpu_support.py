"""CPU stand-ins shared by the TorchTitan 0.2.2 and 0.3.0 test harnesses (no TorchTitan import).

Both trainers read device memory through TorchTitan's CUDA ``DeviceMemoryMonitor`` and start
a process group from torchrun's environment; on a CPU test machine these stand in.
"""

from __future__ import annotations

import os
import resource
import socket
from typing import Any


class CpuMemoryMonitor:
    """Stand-in for TorchTitan's CUDA ``DeviceMemoryMonitor``: peak RSS of this process."""

    device_name = "CPU (titan-rocm test harness)"
    device_capacity_gib = 0.0

    def get_peak_stats(self) -> Any:
        from torchtitan.components.metrics import DeviceMemStats

        gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # KiB -> GiB
        return DeviceMemStats(gib, 0.0, gib, 0.0, 0, 0)

    def reset_peak_stats(self) -> None:
        """Peak RSS cannot be reset; nothing to do."""


def default_rank_env() -> None:
    """torchrun's variables for a one-rank job where torchrun did not set them."""
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        os.environ["MASTER_PORT"] = str(free_port())


def free_port() -> int:
    """A TCP port nobody listens on now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
