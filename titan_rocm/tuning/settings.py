"""Apply a job's titan-rocm settings that change how code compiles, in the tuner's processes.

The minesweeper must compile the same kernels training will: the workarounds that act on
Inductor or Triton process-wide (not on the model) are applied there too, through their own
gates, from the ``[rocm]`` settings recorded by ``tune collect``.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

from titan_rocm.log import log

CODEGEN_WORKAROUNDS: tuple[str, ...] = ("precision_casts", "triton_war")
"""Workarounds that change compiled code for the whole process, with no model needed."""


def apply_codegen_settings(settings: dict[str, Any]) -> list[str]:
    """Apply :data:`CODEGEN_WORKAROUNDS` whose gate holds under ``settings``; return their names.

    Raises:
        ValueError: a ``[rocm]`` value is not valid, or a workaround set ``on`` cannot apply.
    """
    from titan_rocm import platform
    from titan_rocm.config import RocmSettings, check_section
    from titan_rocm.converters.base import Context
    from titan_rocm.workarounds import workaround_class

    known = {k: v for k, v in settings.items() if k in RocmSettings.__dataclass_fields__}
    check_section(known)
    job = SimpleNamespace(compile=SimpleNamespace(enable=True, components=["model"]))
    ctx = Context(job, None, RocmSettings(**known), platform.current())
    applied = []
    for name in CODEGEN_WORKAROUNDS:
        workaround = workaround_class(name)(ctx)
        if workaround.mode == "on":
            workaround.require()
        reason = workaround.gate(None)  # type: ignore[arg-type]
        if reason is None:
            workaround.apply(None)  # type: ignore[arg-type]
            applied.append(name)
        else:
            log.log(logging.INFO, "titan-rocm: tune: %s not applied: %s", name, reason)
    return applied
