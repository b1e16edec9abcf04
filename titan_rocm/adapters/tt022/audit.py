"""``titan-rocm audit`` on a TorchTitan 0.2.2 job (docs/numerics-audit.md): its own trainer
built with nothing written, its first micro-batch audited."""

from __future__ import annotations

import importlib
from functools import partial

from titan_rocm.adapters.common import (
    AuditRequest,
    StartupError,
    audit_built_with,
    audit_job,
    one_line,
    switch_off,
)
from titan_rocm.adapters.tt022.converters.converter import JOB_ATTR
from titan_rocm.numerics.result import AuditError, AuditResult
from titan_rocm.numerics.stats import AuditSettings
from titan_rocm.workarounds.numerics_audit.seams_tt022 import Kit, global_valid_tokens

PROG = "titan-rocm audit"
TRAINER = "torchtitan.train:Trainer"
CPU_TRAINERS = {
    "cpu": "titan_rocm.adapters.tt022.cpu_trainer:CpuTrainer",
    "cpu-tiny": "titan_rocm.adapters.tt022.cpu_trainer:TinyCpuTrainer",
}
"""For a machine without a GPU: the job's own model, or its architecture at two blocks of 64."""
ZERO_FLAGS = ("--module", "--config")
"""Refused here with the sentence naming 0.2.2's."""


def trainer_class(spec: str) -> type:
    """The class ``MODULE:CLASS`` (or a name of :data:`CPU_TRAINERS`) names (AuditError)."""
    module_name, sep, class_name = CPU_TRAINERS.get(spec, spec).partition(":")
    if not sep or not module_name or not class_name:
        raise AuditError(f"--trainer {spec!r} is not MODULE:CLASS (e.g. {TRAINER}) nor one "
                         f"of {', '.join(CPU_TRAINERS)}")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure is the user's module
        raise AuditError(f"--trainer {spec!r}: cannot import {module_name} "
                         f"({one_line(exc)})") from None
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type):
        raise AuditError(f"--trainer {spec!r}: {module_name} has no class {class_name}")
    return cls


WRITERS = (("checkpoint", "enable"), ("metrics", "enable_tensorboard"),
           ("metrics", "enable_wandb"), ("profiling", "enable_profiling"),
           ("profiling", "enable_memory_snapshot"), ("metrics", "save_tb_folder"))
"""So that nothing of the job is written: no checkpoint, metrics files, profiles or snapshots."""


def audit(request: AuditRequest) -> AuditResult:
    """Audit one micro-batch of the 0.2.2 job ``request`` describes (AuditError)."""
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
    switch_off(job_config, WRITERS)
    import titan_rocm  # noqa: F401 - registers the converters

    return audit_job(request, lambda: cls(job_config), settings, audit_built,
                     no_gpu_hint="; or try it on this CPU: --trainer cpu (the job's model) "
                     "or --trainer cpu-tiny (its architecture, two blocks of 64)")


audit_built = partial(
    audit_built_with, job=lambda trainer: trainer.model_parts[0].__dict__.get(JOB_ATTR),
    kit=lambda trainer, labels: Kit(trainer, global_valid_tokens(trainer, labels)))
