"""``titan-rocm audit`` on a TorchTitan 0.2.2 job (docs/numerics-audit.md).

Parses the job as ``torchtitan.train`` does (its ``ConfigManager``, titan-rocm's ``[rocm]``
section), builds the job's own trainer (``torchtitan.train:Trainer`` or ``--trainer``) with
nothing of the job written (no checkpoint, TensorBoard, W&B or profiles), takes the first
micro-batch of its dataloader, and audits it with 0.2.2's step
(:class:`~titan_rocm.workarounds.numerics_audit.seams_tt022.Kit`).
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from titan_rocm.adapters.common import (
    AuditRequest,
    LaunchError,
    StartupError,
    build_trainer,
    first_batch,
    one_line,
    single_process_environment,
)
from titan_rocm.adapters.tt022.converters.converter import JOB_ATTR
from titan_rocm.numerics.audit import AuditError, AuditResult, audit_micro_batch
from titan_rocm.numerics.audit import refuse_unsupported as refuse
from titan_rocm.numerics.stats import AuditSettings
from titan_rocm.settings import RocmSettings
from titan_rocm.workarounds.numerics_audit.seams_tt022 import Kit, global_valid_tokens

PROG = "titan-rocm audit"
TRAINER = "torchtitan.train:Trainer"
"""The trainer built when ``--trainer`` is not given."""
ZERO_FLAGS = ("--module", "--config")
"""TorchTitan 0.3.0's job flags, refused here with the sentence naming 0.2.2's."""


def trainer_class(spec: str) -> type:
    """The class ``MODULE:CLASS`` names.

    Raises:
        AuditError: not MODULE:CLASS, the module does not import, or it has no such class.
    """
    module_name, sep, class_name = spec.partition(":")
    if not sep or not module_name or not class_name:
        raise AuditError(f"--trainer {spec!r} is not MODULE:CLASS (e.g. {TRAINER})")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure is the user's module
        raise AuditError(f"--trainer {spec!r}: cannot import {module_name} "
                         f"({one_line(exc)})") from None
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type):
        raise AuditError(f"--trainer {spec!r}: {module_name} has no class {class_name}")
    return cls


def quiet_job(job_config: Any) -> None:
    """Nothing of the job is written: no checkpoint, metrics files, profiles or snapshots."""
    for section, key in (("checkpoint", "enable"), ("metrics", "enable_tensorboard"),
                         ("metrics", "enable_wandb"), ("profiling", "enable_profiling"),
                         ("profiling", "enable_memory_snapshot"), ("metrics", "save_tb_folder")):
        obj = getattr(job_config, section, None)
        if obj is not None and isinstance(getattr(obj, key, None), bool):
            setattr(obj, key, False)


def audit(request: AuditRequest) -> AuditResult:
    """Audit one micro-batch of the 0.2.2 job ``request`` describes.

    Raises:
        AuditError: bad input or the audit cannot run (one sentence).
    """
    from titan_rocm.adapters.tt022.config import settings_from
    from titan_rocm.adapters.tt022.preflight import parse_config

    for arg in request.passthrough:
        if arg.partition("=")[0] in ZERO_FLAGS:
            raise AuditError(f"{arg.partition('=')[0]} is TorchTitan 0.3.0's; torchtitan "
                             "0.2.2 is installed: audit a 0.2.2 job with --job.config_file "
                             "X.toml")
    passthrough = list(request.passthrough)
    if request.config_file is not None:
        passthrough = ["--job.config_file", request.config_file, *passthrough]
    try:
        job_config = parse_config(passthrough, launcher="titan-rocm", prog=PROG)
        settings = settings_from(job_config)
        AuditSettings.of(settings)
    except (StartupError, ValueError) as exc:
        raise AuditError(str(exc)) from None
    cls = trainer_class(request.trainer or TRAINER)
    quiet_job(job_config)
    try:
        single_process_environment()
        import titan_rocm  # noqa: F401 - registers the converters

        trainer = build_trainer(lambda: cls(job_config))
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
    job = trainer.model_parts[0].__dict__.get(JOB_ATTR)
    facts = job.audit_facts(trainer.model_parts) if job is not None else None
    return audit_micro_batch(
        trainer.model_parts, torch.device(getattr(trainer, "device", "cpu")),
        lambda labels: Kit(trainer, global_valid_tokens(trainer, labels)), input_dict, labels,
        AuditSettings.of(settings), facts, tokens, chunks, settings.numerics_audit_reference)
