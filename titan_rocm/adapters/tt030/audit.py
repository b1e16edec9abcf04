"""The numerics audit on a built TorchTitan 0.3.0 trainer (docs/numerics-audit.md).

:func:`titan_rocm.numerics.audit.run_passes` does the work; what is 0.3.0's is the step it
runs (``torchtitan/trainer.py``):

- ``post_dataloading_process`` then ``_forward_backward_body``, not ``forward_backward_step``:
  on NVIDIA ``fwd_bwd_fn`` is ``_forward_backward_body`` captured as a CUDA graph by default,
  whose replays would run the compiled kernels under ``set_stance("force_eager")`` too (and a
  capture inside the audit would change the trainer's graph). The body is the same code the
  graph captured: the same compiled kernels, launched one by one.
- ``post_dataloading_process`` adds the micro-batch's labels to ``trainer.ntokens_seen`` (a
  logged metric, saved in checkpoints): each pass puts it back.
- The loss denominator is ``train_step``'s: valid labels (an int64 tensor), summed over the
  batch mesh when data parallel.
"""

from __future__ import annotations

from typing import Any

import torch

from titan_rocm.numerics.audit import (
    AuditResult,
    Step,
    audit_micro_batch,
)
from titan_rocm.numerics.stats import AuditSettings


def global_valid_tokens(trainer: Any, labels: torch.Tensor) -> torch.Tensor:
    """The loss denominator TorchTitan 0.3.0's ``Trainer.train_step`` computes for a step of
    this one micro-batch."""
    from torchtitan.components.loss import IGNORE_INDEX

    local = (labels != IGNORE_INDEX).sum().to(trainer.device)
    dims = trainer.parallel_dims
    if getattr(dims, "dp_enabled", False):
        from torchtitan.distributed import utils as dist_utils

        return dist_utils.dist_sum_tensor(local, dims.get_mesh("batch"))
    return local


def trainer_step(trainer: Any, labels: torch.Tensor) -> Step:
    """TorchTitan 0.3.0's forward and backward of ``trainer`` as a
    :data:`~titan_rocm.numerics.audit.Step` (see the module docstring)."""
    denominator = global_valid_tokens(trainer, labels)

    def step(input_dict: dict[str, torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
        seen = trainer.ntokens_seen
        try:
            inputs, labels, extra = trainer.post_dataloading_process(input_dict, labels)
            return trainer._forward_backward_body(inputs, labels, denominator, extra)
        finally:
            trainer.ntokens_seen = seen

    return step


def audit_030(trainer: Any, input_dict: dict[str, torch.Tensor], labels: torch.Tensor,
              settings: AuditSettings, tokens: int | None = None,
              chunks: int | None = None) -> AuditResult:
    """Audit a built TorchTitan 0.3.0 trainer on one micro-batch
    (:func:`~titan_rocm.numerics.audit.audit_micro_batch` with 0.3.0's step, above).

    Raises:
        AuditError: pipeline parallelism, or the reference would not fit (one sentence).
    """
    return audit_micro_batch(trainer, trainer_step, input_dict, labels, settings, tokens,
                             chunks)


def quiet_job(config: Any) -> None:
    """Nothing of the job is written: no checkpoint, TensorBoard, W&B, profiles, snapshots
    or structured logs (0.3.0's config names)."""
    for section, key in (("checkpoint", "enable"), ("metrics", "enable_tensorboard"),
                         ("metrics", "enable_wandb"), ("profiler", "enable_profiling"),
                         ("profiler", "enable_memory_snapshot"),
                         ("debug", "enable_structured_logging"),
                         ("checkpoint", "create_seed_checkpoint")):
        obj = getattr(config, section, None)
        if obj is not None and isinstance(getattr(obj, key, None), bool):
            setattr(obj, key, False)
