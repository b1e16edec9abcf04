"""TorchTitan 0.2.2's real ``Trainer.train()`` and ``train_step`` on CPU, with a tiny llama3:
the package's CPU trainer (``titan-rocm audit --trainer cpu-tiny``) unparallelised.

``Trainer.__init__`` is CUDA-bound (``torch.device("cuda:N")``, NCCL, a CUDA memory
monitor), so :class:`CpuTrainer` replaces only ``__init__``: it assembles the same real
components in the same order (model on meta, model converters, ``MetricsProcessor``, loss
function from the train spec, optimizers, LR schedulers, the post-optimizer hook,
``CheckpointManager``) on CPU with a gloo process group. Everything after that is
TorchTitan's own code: ``train()``, ``train_step()``, ``forward_backward_step()``,
``clip_grad_norm_``, ``MetricsProcessor.log``, ``CheckpointManager.save`` and ``main()``.

CPU stand-ins (nothing else is replaced): a memory monitor reporting this process's peak
RSS (``torch.cuda`` memory stats do not exist on CPU), a synthetic token loader, no AMP,
model not wrapped for data parallelism, and ``set_pg_timeouts`` (a CUDA barrier) skipped.

Run as a program, it is ``torchtitan.train.main(CpuTrainer)``: the exit code is TorchTitan's::

    python tests/support/cpu_trainer.py --model.converters rocm.divergence_guard --training.steps 12
    torchrun --nproc_per_node 2 tests/support/cpu_trainer.py ...     # two ranks over gloo
"""

from __future__ import annotations

if __package__ in (None, ""):  # run as a script: tests.support imports need the repo root
    import sys as _sys
    from pathlib import Path as _Path

    _sys.path.insert(0, str(_Path(__file__).resolve().parents[2]))

import sys
from typing import Any

from titan_rocm.adapters.tt022.cpu_trainer import (  # noqa: F401 - the tests' names
    TINY,
    SyntheticLoader,
    TinyCpuTrainer,
    cpu_patches,
)


class CpuTrainer(TinyCpuTrainer):
    """The package's tiny CPU trainer (titan_rocm/adapters/tt022/cpu_trainer.py), plain data
    parallel over every rank and not parallelised: what the guard, teardown and tuner tests
    train (tests/support/audit_trainer.py keeps the job's own parallelisation)."""

    def parallel_dims_for(self, job_config: Any, world: int) -> Any:
        from torchtitan.distributed import ParallelDims

        return ParallelDims(dp_replicate=world, dp_shard=1, cp=1, tp=1, pp=1, ep=1, etp=1,
                            world_size=world)

    def parallelize(self, model: Any) -> None:
        """Not parallelised, not compiled (a subclass compiles what it needs)."""


BASE_ARGS: list[str] = [
    "--job.custom_config_module", "titan_rocm.config",
    "--model.name", "llama3", "--model.flavor", "debugmodel",
    "--training.local_batch_size", "2", "--training.seq_len", "32",
    "--metrics.log_freq", "10", "--training.steps", "12",
    "--lr_scheduler.warmup_steps", "2", "--checkpoint.no-enable",
]


def job_config(args: list[str]) -> Any:
    """A TorchTitan JobConfig (with titan-rocm's ``[rocm]`` section) from CLI-style args."""
    from torchtitan.config import ConfigManager

    return ConfigManager().parse_args(BASE_ARGS + list(args))


if __name__ == "__main__":
    from torchtitan.config import ConfigManager
    from torchtitan.train import main

    import titan_rocm  # noqa: F401 - registers the rocm converters

    # ConfigManager.parse_args binds sys.argv[1:] as its default when torchtitan is first
    # imported (above), so hand main() a manager that parses the harness defaults too.
    _parse = ConfigManager.parse_args
    ConfigManager.parse_args = lambda self, args=None: _parse(  # type: ignore[method-assign]
        self, BASE_ARGS + sys.argv[1:] if args is None else args
    )
    main(CpuTrainer)
