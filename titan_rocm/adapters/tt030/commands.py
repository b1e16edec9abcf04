"""What the command line asks of TorchTitan 0.3.0's adapter (:class:`titan_rocm.adapters.Adapter`).

Torch-free at import, so ``titan-rocm plan`` refuses a bad job before torch loads."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from titan_rocm.adapters.common import AuditRequest, CollectRequest, PlanRequest
from titan_rocm.adapters.tt030.job_args import refuse_config_file

if TYPE_CHECKING:
    from titan_rocm.numerics.result import AuditResult


def refuse_other_flags(args: Sequence[str]) -> None:
    """Nothing: :func:`check_job_args` refuses 0.2.2's flag after the world-size and ``--arch``
    flags."""


def check_job_args(args: Sequence[str]) -> None:
    """Refuse 0.2.2's ``--job.config_file``: a 0.3.0 job is ``--module M --config F``."""
    refuse_config_file(args)


def torchtitan_help(args: Sequence[str]) -> int:
    """TorchTitan 0.3.0's own help for the job (its flags depend on the config class); without
    ``--module``/``--config``, how to name one."""
    from titan_rocm.adapters.common import flag_value

    if flag_value(args, ("--module",)) is None:
        print("TorchTitan 0.3.0's flags depend on the job's config: run "
              "`titan-rocm plan --module M --config F --help-torchtitan`")
        return 0
    from titan_rocm.adapters.tt030.plan import torchtitan_help as job_help

    return job_help(args, prog="titan-rocm plan")


def plan(request: PlanRequest) -> dict[str, Any]:
    """0.3.0 has no launcher to check: ``request.launcher`` is not read."""
    from titan_rocm.adapters.tt030.plan import make_plan

    return make_plan(
        request.args, arch=request.arch, world_size=request.world_size, nnodes=request.nnodes,
        nproc_per_node=request.nproc_per_node, aiter=request.aiter,
        primus_turbo=request.primus_turbo)


def audit(request: AuditRequest) -> AuditResult:
    from titan_rocm.adapters.tt030.audit import audit as audit_job

    return audit_job(request)


def tune_collect(request: CollectRequest) -> int:
    """``--trainer`` is refused: the config builds its own trainer."""
    from titan_rocm.adapters.tt030.tune import collect

    return collect(request)
