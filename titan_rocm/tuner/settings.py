"""Apply a job's codegen workarounds in the tuner's processes, so the minesweeper compiles the
kernels training will; here the tuner acts as an adapter."""

from __future__ import annotations

from typing import Any

import torch.nn as nn

from titan_rocm.log import log
from titan_rocm.settings import check_section
from titan_rocm.workarounds.base import CompileSettings, Context
from titan_rocm.workarounds.job import JobWorkarounds
from titan_rocm.workarounds.registry import workaround_classes

FRAMEWORK = "titan-rocm tune"


def codegen_workarounds() -> tuple[str, ...]:
    """The workarounds that change compiled code process-wide (``Workaround.codegen``)."""
    return tuple(name for name, cls in workaround_classes().items() if cls.codegen)


def apply_codegen_settings(settings: dict[str, Any]) -> list[str]:
    """Apply the :func:`codegen_workarounds` whose gate holds; return their names. ValueError
    for an invalid ``[rocm]`` value or an ``on`` workaround that cannot apply."""
    ctx = Context(settings=check_section(dict(settings)),
                  compile=CompileSettings(enable=True, components=("model",)),
                  framework=FRAMEWORK)
    names = codegen_workarounds()
    job = JobWorkarounds(ctx, names)
    job.require()
    model = nn.Module()  # these workarounds act on the process, not on a model
    applied = []
    for name in names:
        decision = job.apply(name, model, FRAMEWORK)
        log.info("%s", decision.line)
        if decision.applied:
            applied.append(name)
    return applied
