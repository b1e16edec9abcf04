"""The TorchTitan adapters, one folder per generation; the command line holds no generation
branch of its own (each folder's ``commands`` module implements :class:`Adapter`)."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

if TYPE_CHECKING:
    from titan_rocm.adapters.common import AuditRequest, CollectRequest, PlanRequest
    from titan_rocm.numerics.result import AuditResult

FOLDERS: dict[str, str] = {"0.2": "tt022", "0.3": "tt030"}

COMMANDS = "commands"


class Adapter(Protocol):
    """What the command line asks of a generation's adapter. Importing it costs no torch, so a
    refusal comes back at once."""

    def refuse_other_flags(self, args: Sequence[str]) -> None:
        """Refuse the other generation's job flags (JobArgsError naming this generation's)."""

    def check_job_args(self, args: Sequence[str]) -> None:
        """The torch-free checks of the job's flags and files, made before torch loads
        (JobArgsError)."""

    def torchtitan_help(self, args: Sequence[str]) -> int:
        """Print TorchTitan's own flags for the job; return the exit code (StartupError)."""

    def plan(self, request: PlanRequest) -> dict[str, Any]:
        """What the job would get from titan-rocm (``titan-rocm plan``'s dict; StartupError)."""

    def audit(self, request: AuditRequest) -> AuditResult:
        """Parse the job, build its own trainer and audit its first micro-batch (AuditError)."""

    def tune_collect(self, request: CollectRequest) -> int:
        """``titan-rocm tune collect`` on the job's own trainer; return the exit code
        (CollectError)."""


class NoAdapter(RuntimeError):
    """No adapter fits the installed TorchTitan (the message is one sentence)."""


def installed() -> Adapter:
    """The installed TorchTitan's adapter (NoAdapter when missing or of neither generation's
    API)."""
    from titan_rocm import torchtitan_version

    found = torchtitan_version.detect()
    folder = FOLDERS.get(found.shape or "")
    if folder is None:
        raise NoAdapter(found.unsupported() or (
            f"{found.describe()} is installed; {torchtitan_version.SUPPORTED} (pip install "
            "torchtitan==0.2.2 or torchtitan==0.3.0)"))
    return cast(Adapter, importlib.import_module(f"titan_rocm.adapters.{folder}.{COMMANDS}"))
