"""``titan-rocm-train`` as one process, on CPU, with TorchTitan 0.2.2's real trainer.

``python tests/support/cpu_single_process.py ARGS...`` is ``titan-rocm-train ARGS...`` with
TorchTitan's device pointed at the CPU: ``torchtitan.tools.utils.device_type`` is ``"cpu"``
(so the process group is gloo, the model lives in host memory), its memory monitor reads
nothing and the CUDA barrier of ``set_pg_timeouts`` is skipped. Nothing else changes: the
launcher sets the single-rank environment, TorchTitan reads ``LOCAL_RANK``, initialises the
process group from ``MASTER_ADDR``/``MASTER_PORT`` and trains.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any


class _NoMemoryMonitor:
    device_name = "CPU (titan-rocm single-process test)"

    def get_peak_stats(self) -> Any:
        from torchtitan.components.metrics import DeviceMemStats

        return DeviceMemStats(0, 0.0, 0, 0.0, 0, 0)

    def reset_peak_stats(self) -> None:
        """Nothing to reset."""


def _cpu_device(module: ModuleType) -> None:
    import torch

    module.device_type, module.device_module = "cpu", torch.cpu


def _cpu_memory(module: ModuleType) -> None:
    module.build_device_memory_monitor = _NoMemoryMonitor


def _no_cuda_barrier(module: ModuleType) -> None:
    # set_pg_timeouts runs a barrier with device_ids (CUDA only) after the first step.
    module.set_pg_timeouts = lambda *_args, **_kwargs: None


if __name__ == "__main__":
    from titan_rocm._after_import import AfterImport
    from titan_rocm.adapters.tt022.train import main

    AfterImport("torchtitan.tools.utils", _cpu_device).arm()
    AfterImport("torchtitan.components.metrics", _cpu_memory).arm()
    AfterImport("torchtitan.distributed.utils", _no_cuda_barrier).arm()
    main(sys.argv[1:])
