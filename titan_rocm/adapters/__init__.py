"""The TorchTitan adapters, one folder per generation. The command line asks the installed
generation's adapter (:func:`installed`) and holds no generation branch of its own: each
folder's ``commands`` module implements :class:`Adapter` (``tests/unit/test_architecture.py``).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

if TYPE_CHECKING:
    from titan_rocm.adapters.common import AuditRequest, CollectRequest, PlanRequest
    from titan_rocm.numerics.result import AuditResult

FOLDERS: dict[str, str] = {"0.2": "tt022", "0.3": "tt030"}
"""TorchTitan generation (its API shape) -> its adapter folder."""

COMMANDS = "commands"
"""The module of each adapter folder that implements :class:`Adapter`."""


class Adapter(Protocol):
    """What the command line asks of a TorchTitan generation's adapter. Importing it costs
    no torch: its functions import what they need, so a refusal comes back at once."""

    def refuse_other_flags(self, args: Sequence[str]) -> None:
        """Refuse the other generation's job flags, before the job's flags are read.

        Raises:
            titan_rocm.adapters.common.JobArgsError: the sentence naming this generation's.
        """

    def check_job_args(self, args: Sequence[str]) -> None:
        """The torch-free checks of the job's flags and files, made before torch loads.

        Raises:
            titan_rocm.adapters.common.JobArgsError: the reason, as the full plan gives it.
        """

    def torchtitan_help(self, args: Sequence[str]) -> int:
        """Print TorchTitan's own flags for the job in ``args`` (0.3.0's depend on its config
        function); return the exit code.

        Raises:
            titan_rocm.adapters.common.StartupError: the job's config cannot be loaded.
        """

    def plan(self, request: PlanRequest) -> dict[str, Any]:
        """What the job would get from titan-rocm (``titan-rocm plan``'s dict).

        Raises:
            titan_rocm.adapters.common.StartupError: the job would stop at start-up, or
                cannot be planned.
        """

    def audit(self, request: AuditRequest) -> AuditResult:
        """Parse the job, build its own trainer and audit its first micro-batch.

        Raises:
            titan_rocm.numerics.result.AuditError: bad input or the audit cannot run.
        """

    def tune_collect(self, request: CollectRequest) -> int:
        """Record the GEMM problems of one step of the job's own trainer (``titan-rocm tune
        collect``); return the exit code.

        Raises:
            titan_rocm.tuner.collect.CollectError: bad input, or the job cannot be collected.
        """


class NoAdapter(RuntimeError):
    """No adapter fits the installed TorchTitan (the message is one sentence)."""


def installed() -> Adapter:
    """The installed TorchTitan's adapter (its folder's ``commands`` module).

    Raises:
        NoAdapter: TorchTitan is missing, or its API is neither generation's.
    """
    from titan_rocm import torchtitan_version

    found = torchtitan_version.detect()
    folder = FOLDERS.get(found.shape or "")
    if folder is None:
        raise NoAdapter(found.unsupported() or (
            f"{found.describe()} is installed; {torchtitan_version.SUPPORTED} (pip install "
            "torchtitan==0.2.2 or torchtitan==0.3.0)"))
    return cast(Adapter, importlib.import_module(f"titan_rocm.adapters.{folder}.{COMMANDS}"))
