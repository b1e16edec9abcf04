"""``titan-rocm tune collect`` on a TorchTitan 0.2.2 job (docs/validated-tuning.md): one step of
its trainer, with no checkpoint and ``rocm.gemm_lookup`` off, under
:func:`titan_rocm.tuner.collect.record`."""

from __future__ import annotations

from titan_rocm.adapters.common import (
    CollectRequest,
    JobArgsError,
    LaunchError,
    StartupError,
    one_process,
)
from titan_rocm.adapters.tt022.config import settings_from
from titan_rocm.adapters.tt022.job_args import load_toml
from titan_rocm.tuner.collect import (
    NO_GEMM,
    CollectError,
    has_accelerator,
    no_device,
    record,
    train,
)

PROG = "titan-rocm tune collect"
"""tyro's box says ``For full helptext, run <it> --help``: a command that exists."""
TRAINER = "torchtitan.train:Trainer"
"""It puts the model on CUDA/ROCm (``device_module.set_device``, 0.2.2 ``torchtitan/train.py``)."""
STEP_FLAGS: tuple[str, ...] = (
    "--training.steps", "1", "--checkpoint.no-enable", "--rocm.gemm_lookup", "off",
)
OTHER_FLAGS = ("--module", "--config")


def collect(request: CollectRequest) -> int:
    """Record the GEMM problems of one step of the 0.2.2 job (CollectError, one sentence)."""
    args = list(request.passthrough)
    for arg in args:
        if arg.partition("=")[0] in OTHER_FLAGS:
            raise CollectError(f"{arg.partition('=')[0]} is TorchTitan 0.3.0's; torchtitan "
                               "0.2.2 is installed: collect a 0.2.2 job with "
                               "--job.config_file X.toml")
    trainer = request.trainer or TRAINER
    try:
        load_toml(args)  # a missing or unreadable TOML before torch loads
    except JobArgsError as exc:
        raise CollectError(str(exc)) from None
    if request.trainer is None and not has_accelerator():  # a sentence before TorchTitan loads
        raise CollectError(no_device("TorchTitan's trainer", ", or name a trainer class "
                                     "that runs on CPU with --trainer MODULE:CLASS"))
    from titan_rocm.adapters.tt022.audit import trainer_class
    from titan_rocm.adapters.tt022.preflight import parse_config
    from titan_rocm.numerics.result import AuditError

    try:
        job_config = parse_config([*args, *STEP_FLAGS], launcher="titan-rocm", prog=PROG)
        settings = settings_from(job_config)
    except (StartupError, ValueError) as exc:
        raise CollectError(str(exc)) from None
    if not job_config.compile.enable or "model" not in job_config.compile.components:
        raise CollectError(NO_GEMM)
    try:
        cls = trainer_class(trainer)
        # Without torchrun: one process, as titan-rocm-train (TorchTitan reads LOCAL_RANK).
        one_process("titan-rocm tune")
    except (AuditError, LaunchError) as exc:
        raise CollectError(str(exc)) from None
    from torchtitan.tools.logging import init_logger

    import titan_rocm  # noqa: F401 - registers the converters

    init_logger()
    job = {"config_file": job_config.job.config_file, "model": job_config.model.name,
           "flavor": job_config.model.flavor, "args": args}
    return record(lambda: train(lambda: cls(job_config)), job, settings, request.output)
