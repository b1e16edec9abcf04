"""Check 2: ``Trainer.__init__``'s ``[experimental] custom_import``."""

from __future__ import annotations

from typing import Any

from titan_rocm.adapters.common import StartupError
from titan_rocm.adapters.common import one_line as _one_line
from titan_rocm.adapters.tt022.preflight.parse_args import _import


def check_custom_import(job_config: Any) -> None:
    """Import ``custom_import`` as ``Trainer.__init__`` does first; raises StartupError."""
    name = job_config.experimental.custom_import
    if not name:
        return
    try:
        _import(name)
    except Exception as exc:
        raise StartupError(
            f"[experimental] custom_import = {name!r} cannot be imported ({_one_line(exc)}); "
            "TorchTitan 0.2.2 imports it first thing at start-up"
        ) from None
