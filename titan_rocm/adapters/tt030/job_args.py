"""TorchTitan 0.3.0's job flags read without torch."""

from __future__ import annotations

from collections.abc import Sequence

from titan_rocm.adapters.common import CONFIG_FILE_FLAGS, JobArgsError


def refuse_config_file(args: Sequence[str]) -> None:
    """Refuse 0.2.2's ``--job.config_file`` (JobArgsError naming ``--module M --config F``)."""
    if any(arg.partition("=")[0] in CONFIG_FILE_FLAGS for arg in args):
        raise JobArgsError(
            "--job.config_file is TorchTitan 0.2.2's; torchtitan 0.3.0 is installed: "
            "plan a 0.3.0 job with --module M --config F")
