"""CPU stand-ins shared by the TorchTitan 0.2.2 and 0.3.0 test harnesses (no TorchTitan import).

Both trainers start a process group from torchrun's environment; the memory monitor that
stands in for TorchTitan's CUDA one is the package's (``titan_rocm.adapters.common``).
"""

from __future__ import annotations

import os
import socket

from titan_rocm.adapters.common import CpuMemoryMonitor  # noqa: F401 - the harnesses' name


def default_rank_env() -> None:
    """torchrun's variables for a one-rank job where torchrun did not set them."""
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "0")  # one rank: its store binds a port the OS picks


def free_port() -> int:
    """A TCP port nobody listens on now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
