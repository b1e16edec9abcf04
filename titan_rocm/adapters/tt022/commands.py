"""What the command line asks of TorchTitan 0.2.2's adapter (:class:`titan_rocm.adapters.Adapter`).

Torch-free at import, so ``titan-rocm plan`` refuses a bad job before torch loads."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from titan_rocm.adapters.common import AuditRequest, CollectRequest, JobArgsError, PlanRequest

if TYPE_CHECKING:
    from titan_rocm.numerics.result import AuditResult

OTHER_FLAGS: tuple[str, ...] = ("--module", "--config")


def refuse_other_flags(args: Sequence[str]) -> None:
    """Refuse 0.3.0's ``--module``/``--config``: a 0.2.2 job is a TOML file."""
    named = sorted({a.partition("=")[0] for a in args} & set(OTHER_FLAGS))
    if named:
        raise JobArgsError(
            f"{' and '.join(named)} are TorchTitan 0.3.0's flags (a config function); "
            "this environment has TorchTitan 0.2.2, whose jobs are TOML files: plan one "
            "with --job.config_file FILE")


def check_job_args(args: Sequence[str]) -> None:
    """The job's TOML file reads as TOML (missing, unreadable or oversized ones refused)."""
    from titan_rocm.adapters.tt022.job_args import load_toml

    load_toml(args)


def torchtitan_help(args: Sequence[str]) -> int:
    """TorchTitan 0.2.2's own help, with titan-rocm's config module (so ``--rocm.*`` shows); the
    same for every job."""
    from torchtitan.config import ConfigManager

    from titan_rocm.adapters.common import prog_name
    from titan_rocm.adapters.tt022.config import CONFIG_MODULE

    with prog_name("titan-rocm plan"):
        try:
            ConfigManager().parse_args(["--job.custom_config_module", CONFIG_MODULE, "--help"])
        except SystemExit as exc:
            return int(exc.code or 0)
    return 0


def plan(request: PlanRequest) -> dict[str, Any]:
    from titan_rocm.adapters.tt022.plan import make_plan

    return make_plan(
        request.args, arch=request.arch, world_size=request.world_size, nnodes=request.nnodes,
        nproc_per_node=request.nproc_per_node, launcher=request.launcher,
        aiter=request.aiter, primus_turbo=request.primus_turbo)


def audit(request: AuditRequest) -> AuditResult:
    from titan_rocm.adapters.tt022.audit import audit as audit_job

    return audit_job(request)


def tune_collect(request: CollectRequest) -> int:
    from titan_rocm.adapters.tt022.tune import collect

    return collect(request)
