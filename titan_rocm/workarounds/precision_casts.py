"""Inductor ``emulate_precision_casts``: keep eager BF16 truncation in compiled graphs
(docs/precision-casts.md).

The env var only counts when Inductor's config is first imported, usually already done, so the
config is set itself (a :mod:`titan_rocm.patches` setting), before anything compiles."""

from __future__ import annotations

import os
from typing import Any

import torch._inductor.config as inductor_config
import torch.nn as nn

from titan_rocm import patches
from titan_rocm.log import log
from titan_rocm.workarounds.base import Workaround

EMULATE_ENV = "TORCHINDUCTOR_EMULATE_PRECISION_CASTS"
"""Inductor's variable for the same setting (read when its config module is first imported)."""


def user_disabled() -> str | None:
    """Where the user explicitly turned emulate_precision_casts off, or None."""
    env = os.environ.get(EMULATE_ENV)
    if env is not None and env != "1":
        return f"{EMULATE_ENV}={env}"
    is_default = getattr(inductor_config, "_is_default", None)
    if (
        is_default is not None
        and not is_default("emulate_precision_casts")
        and not inductor_config.emulate_precision_casts
    ):
        return "torch._inductor.config.emulate_precision_casts = False"
    return None


class PrecisionCasts(Workaround):
    """Sets ``torch._inductor.config.emulate_precision_casts = True`` until the job closes."""

    name = "precision_casts"
    codegen = True
    audit_shapes = "compiled"

    @staticmethod
    def plan_line(details: dict[str, Any]) -> str:
        return "Inductor's emulate_precision_casts on: compiled BF16 rounds as eager does"

    def check(self, model: nn.Module) -> str | None:
        if not self.ctx.compile.enable:
            return "compile disabled ([compile] enable = false): nothing for Inductor to compile"
        explicit = user_disabled()
        if explicit:
            return f"left as the user set it ({explicit})"
        return None

    def apply(self, model: nn.Module) -> None:
        if not inductor_config.emulate_precision_casts:
            patches.setting(inductor_config, "emulate_precision_casts", True, by=self.name)
            log.info("titan-rocm: set torch._inductor.config.emulate_precision_casts = True")

    def plan(self, model: nn.Module) -> dict[str, Any]:
        return {"emulate_precision_casts": bool(inductor_config.emulate_precision_casts)}
