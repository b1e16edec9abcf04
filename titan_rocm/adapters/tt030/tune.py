"""``titan-rocm tune collect`` on a TorchTitan 0.3.0 job (docs/validated-tuning.md). The problems
file is 0.2.2's, so ``tune run``/``table`` and ``gemm_lookup_table`` read it alike."""

from __future__ import annotations

import dataclasses
from typing import Any

from titan_rocm.adapters.common import (
    CONFIG_FILE_FLAGS,
    CollectRequest,
    LaunchError,
    PlanError,
    flag_value,
    module_and_config,
    one_process,
)
from titan_rocm.adapters.tt030.job import OVERRIDE_ENTRY
from titan_rocm.settings import RocmSettings
from titan_rocm.tuner.collect import NO_GEMM, CollectError, no_device, record, train

NOT_ATTACHED = (
    "titan-rocm is not attached to this job, so its training never reads [rocm] "
    "gemm_lookup_table (and its GEMMs are not the ones a job with titan-rocm lowers): collect "
    "the job you train, with --module titan_rocm.torchtitan.configs, a config function that "
    f"returns rocm(cfg), or --override.imports {OVERRIDE_ENTRY}"
)


def collect(request: CollectRequest) -> int:
    """Record the GEMM problems of one step of the 0.3.0 job (CollectError, one sentence)."""
    args = list(request.passthrough)
    if request.trainer is not None:
        raise CollectError(f"--trainer {request.trainer!r} is TorchTitan 0.2.2's; on 0.3.0 "
                           "the config function's Trainer.Config builds its own trainer")
    if flag_value(args, CONFIG_FILE_FLAGS) is not None:
        raise CollectError("--job.config_file is TorchTitan 0.2.2's; torchtitan 0.3.0 is "
                           "installed: collect a 0.3.0 job with --module M --config F")
    module, name = module_and_config(args)
    if module is None or name is None:
        raise CollectError("name the job to collect: --module M --config F (a TorchTitan "
                           "0.3.0 config function, e.g. --module titan_rocm.torchtitan.configs "
                           "--config llama3_8b)")
    from torch._utils import _get_available_device_type

    # TorchTitan 0.3.0 takes this probe's answer, else "cuda" (torchtitan/tools/utils.py), and
    # fails in Trainer.__init__ on a machine without one: a sentence here instead.
    if _get_available_device_type() is None:
        raise CollectError(no_device("TorchTitan 0.3.0's trainer"))
    from titan_rocm.adapters.tt030.plan import parse_job, settings_of

    try:
        config = parse_job(args)
        settings, attached = settings_of(config)
    except PlanError as exc:
        raise CollectError(str(exc)) from None
    if attached is None:
        raise CollectError(NOT_ATTACHED)
    if not config.compile.enable or "model" not in config.compile.components:
        raise CollectError(NO_GEMM)
    settings = one_step(config, settings)
    try:
        one_process("titan-rocm tune")
    except LaunchError as exc:
        raise CollectError(str(exc)) from None
    from torchtitan.tools.logging import init_logger

    init_logger()
    spec = config.model_spec
    job = {"config_file": f"--module {module} --config {name}", "module": module,
           "config": name, "model": spec.name, "flavor": spec.flavor, "args": args}
    return record(lambda: train(config.build), job, settings, request.output)


def one_step(config: Any, settings: RocmSettings) -> RocmSettings:
    """Make ``config`` the collect step, wherever its titan-rocm settings come from (``rocm(cfg)``
    or the override entry's JSON); return the settings it runs with."""
    config.training.steps = 1
    config.checkpoint.enable = False
    step = dataclasses.replace(settings, gemm_lookup="off")
    if isinstance(getattr(config, "rocm", None), RocmSettings):
        config.rocm = step
    else:
        config.override.imports = [_without_table(entry) for entry in config.override.imports]
    return step


def _without_table(entry: Any) -> Any:
    target, kwargs = (entry, {}) if isinstance(entry, str) else entry
    if target != OVERRIDE_ENTRY:
        return entry
    return (target, {**dict(kwargs), "gemm_lookup": "off"})
