"""``[torchrun ...] python tests/tt030/tt030_main.py --module tt030_stop_job --config NAME
[flags]``: TorchTitan 0.3.0's own ``torchtitan.train.main`` on CPU, in a process of its own,
with the harness's stand-ins (tests/tt030/tt030_harness.py: the device type, the memory
monitor, ``set_pg_timeouts``) and, when ``TITAN_ROCM_DEBUG_CORRUPT`` is set, titan-rocm's
test fault installed on the built model before training (as tests/support/audit_trainer.py
does for 0.2.2). Nothing else stands in: ``main`` builds the trainer, trains, closes, and the
process exits as a real run does. Tests only."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

if __name__ == "__main__":
    sys.path[:0] = [str(HERE), str(HERE.parents[1])]
    from tt030_harness import force_cpu_device_type

    force_cpu_device_type()

    import torchtitan.components.metrics as metrics
    import torchtitan.distributed.utils as dist_utils
    from torchtitan.train import main
    from torchtitan.trainer import Trainer

    from tests.support.cpu_support import CpuMemoryMonitor, default_rank_env
    from titan_rocm.testing import corrupt

    default_rank_env()
    metrics.build_device_memory_monitor = CpuMemoryMonitor
    dist_utils.set_pg_timeouts = lambda *args, **kwargs: None
    train = Trainer.train

    def train_with_fault(self: Any) -> Any:
        corrupt.install(self.model_parts)  # TITAN_ROCM_DEBUG_CORRUPT's fault, if set
        return train(self)

    Trainer.train = train_with_fault  # type: ignore[method-assign]
    main()
