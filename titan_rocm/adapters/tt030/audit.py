"""``titan-rocm audit`` on a TorchTitan 0.3.0 job (docs/numerics-audit.md).

Parses the job as ``python -m torchtitan.train`` does (TorchTitan's own ``ConfigManager``:
``--module M --config F`` and the config class's tyro flags), builds the config's own
trainer (``config.build()``) with nothing of the job written, takes the first micro-batch of
its dataloader, and audits it with 0.3.0's step
(:class:`~titan_rocm.workarounds.numerics_audit.seams_tt030.Kit`: ``post_dataloading_process``
then ``_forward_backward_body``, never a CUDA graph's replay).
"""

from __future__ import annotations

from typing import Any

import torch

from titan_rocm.adapters.common import (
    AuditRequest,
    LaunchError,
    PlanError,
    StartupError,
    build_trainer,
    first_batch,
    single_process_environment,
)
from titan_rocm.adapters.tt030.plan import parse_job
from titan_rocm.numerics.audit import AuditError, AuditResult, audit_micro_batch
from titan_rocm.numerics.audit import refuse_unsupported as refuse
from titan_rocm.numerics.stats import AuditSettings
from titan_rocm.settings import RocmSettings, coerce
from titan_rocm.workarounds.numerics_audit.seams_tt030 import Kit, global_valid_tokens


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
    quiet_job(config)
    try:
        single_process_environment()
        trainer = build_trainer(config.build)
        refuse(getattr(trainer, "parallel_dims", None))
        input_dict, labels = first_batch(trainer)
    except (LaunchError, StartupError) as exc:
        raise AuditError(str(exc)) from None
    if request.before_job is not None:
        request.before_job(trainer.model_parts)
    return audit_built(trainer, settings, input_dict, labels, request.tokens, request.chunks)


def audit_built(trainer: Any, settings: RocmSettings, input_dict: dict[str, torch.Tensor],
                labels: torch.Tensor, tokens: int | None = None,
                chunks: int | None = None) -> AuditResult:
    """Audit one micro-batch of a built trainer (``audit``'s second half; tests and the
    benchmarks audit one trainer many times).

    Raises:
        AuditError: the audit cannot run (one sentence).
    """
    job = getattr(getattr(trainer, "_rocm", None), "workarounds", None)
    facts = job.audit_facts(trainer.model_parts) if job is not None else None
    return audit_micro_batch(
        trainer.model_parts, torch.device(getattr(trainer, "device", "cpu")),
        lambda labels: Kit(trainer, global_valid_tokens(trainer, labels)), input_dict, labels,
        AuditSettings.of(settings), facts, tokens, chunks, settings.numerics_audit_reference)
