"""The CPU test trainer (tests/support/cpu_trainer.py) with its model compiled, for ``tune
collect``."""

from __future__ import annotations

from typing import Any

import torch

from tests.support.cpu_trainer import CpuTrainer


class CompiledCpuTrainer(CpuTrainer):
    """CpuTrainer whose model runs under ``torch.compile`` (TorchTitan's parallelize_fn is
    what compiles on a GPU; the CPU harness does not call it)."""

    def __init__(self, job_config: Any) -> None:
        super().__init__(job_config)
        self.model_parts = [torch.compile(m) for m in self.model_parts]
