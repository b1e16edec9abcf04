"""``titan-rocm audit`` on a TorchTitan 0.3.0 job (docs/numerics-audit.md).

The step is ``post_dataloading_process`` then ``_forward_backward_body``, never a CUDA graph's
replay (which would ignore ``force_eager``)."""

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
"""So that nothing of the job is written (0.3.0's config names)."""


def audit(request: AuditRequest) -> AuditResult:
    """Audit one micro-batch of the 0.3.0 job ``request`` describes (AuditError)."""
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
    return getattr(getattr(trainer, "_rocm", None), "workarounds", None)


audit_built = partial(
    audit_built_with, job=_job,
    kit=lambda trainer, labels: Kit(trainer, global_valid_tokens(trainer, labels)))
