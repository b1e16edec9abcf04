"""``titan-rocm audit`` on a TorchTitan 0.3.0 job (docs/numerics-audit.md).

Parses the job as ``python -m torchtitan.train`` does (TorchTitan's own ``ConfigManager``:
``--module M --config F`` and the config class's tyro flags), builds the config's own
trainer (``config.build()``) with nothing of the job written, takes the first micro-batch of
its dataloader, and audits it with 0.3.0's step
(:class:`~titan_rocm.workarounds.numerics_audit.seams_tt030.Kit`: ``post_dataloading_process``
then ``_forward_backward_body``, never a CUDA graph's replay).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from titan_rocm.adapters.common import (
    AuditRequest,
    PlanError,
    audit_built_with,
    audit_job,
    switch_off,
)
from titan_rocm.adapters.tt030.plan import parse_job
from titan_rocm.numerics.result import AuditError, AuditResult
from titan_rocm.numerics.stats import AuditSettings
from titan_rocm.settings import coerce
from titan_rocm.workarounds.numerics_audit.seams_tt030 import Kit, global_valid_tokens

WRITERS = (("checkpoint", "enable"), ("metrics", "enable_tensorboard"),
           ("metrics", "enable_wandb"), ("profiler", "enable_profiling"),
           ("profiler", "enable_memory_snapshot"), ("debug", "enable_structured_logging"),
           ("checkpoint", "create_seed_checkpoint"))
"""What the audit switches off so that nothing of the job is written: no checkpoint,
TensorBoard, W&B, profiles, snapshots or structured logs (0.3.0's config names)."""


def audit(request: AuditRequest) -> AuditResult:
    """Audit one micro-batch of the 0.3.0 job ``request`` describes.

    Raises:
        AuditError: bad input or the audit cannot run (one sentence).
    """
    if request.config_file is not None:
        raise AuditError("--job.config_file is TorchTitan 0.2.2's; torchtitan 0.3.0 is "
                         "installed: audit a 0.3.0 job with --module M --config F")
    if request.trainer is not None:
        raise AuditError(f"--trainer {request.trainer!r} is TorchTitan 0.2.2's; on 0.3.0 the "
                         "config function's Trainer.Config builds its own trainer")
    try:
        config = parse_job(list(request.passthrough))
        settings = coerce(getattr(config, "rocm", None))
        AuditSettings.of(settings)
    except (PlanError, ValueError) as exc:
        raise AuditError(str(exc)) from None
    switch_off(config, WRITERS)
    return audit_job(request, config.build, settings, audit_built)


def _job(trainer: Any) -> Any:
    """The trainer's workaround job (None when titan-rocm did not build it)."""
    return getattr(getattr(trainer, "_rocm", None), "workarounds", None)


audit_built = partial(
    audit_built_with, job=_job,
    kit=lambda trainer, labels: Kit(trainer, global_valid_tokens(trainer, labels)))
"""``audit_built(trainer, settings, input_dict, labels, tokens=None, chunks=None)``: audit one
micro-batch of a built 0.3.0 trainer (:func:`~titan_rocm.adapters.common.audit_built_with`)."""
