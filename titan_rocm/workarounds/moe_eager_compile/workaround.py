"""Mixed compile: dense blocks compiled whole, MoE blocks eager (docs/moe-eager-compile.md).

MoE pieces (data-dependent token counts, grouped-MM with dynamic shapes) are what titan-rocm keeps
out of Inductor on ROCm."""

from __future__ import annotations

import json
import logging
from typing import Any, Protocol

import torch.nn as nn

from titan_rocm.log import log, log_once
from titan_rocm.measured import FIGURES
from titan_rocm.workarounds.base import Context, Workaround
from titan_rocm.workarounds.moe_blocks import (
    MOE_CHILD,
    eager_forward_calls,
    has_moe_blocks,
    is_moe_block,
    plan_blocks,
    unwrap_block,
)
from titan_rocm.workarounds.moe_eager_compile import combine

SCOPE_COST = {scope: f"{FIGURES[f'moe_eager_compile.{scope}'].ratio:g} of stock tokens/s"
              for scope in ("block", "moe")}
"""Measured cost by scope, from :data:`titan_rocm.measured.FIGURES` so plan agrees."""
SCOPE_STATUS = {
    "block": "the fix AMD-AGI/Primus PR #962 validated on MI300X",
    "moe": ("unvalidated on ROCm: Primus PR #962 found that compiling even the outer MoE "
            "block with a graph break around MoE.forward still produces the step-1 NaN"),
}
"""What upstream's ROCm evidence says of each scope (docs/moe-eager-compile.md)."""


def scope_summary(scope: str) -> str:
    """``<scope>: <measured cost>; <upstream status>``, one line for the plan."""
    return f"{scope!r}: {SCOPE_COST[scope]} on an H200; {SCOPE_STATUS[scope]}"


class MixedCompileSeam(Protocol):
    """How one TorchTitan generation's compile is made mixed (``seams_tt022``/``seams_tt030``)."""

    combine_unsupported: str | None
    """Why ``moe_combine = "bf16"`` cannot apply in this generation (None: it can)."""

    def apply(self, model: nn.Module, scope: str) -> str:
        """Make the MoE blocks (or their MoE module) run eager; return what was patched."""


class MoEEagerCompile(Workaround):
    """Mixed compile: dense blocks fullgraph, MoE blocks (or their MoE module) eager."""

    name = "moe_eager_compile"
    has_seam = True
    audit_shapes = "listed"

    @staticmethod
    def plan_line(details: dict[str, Any]) -> str:
        scope = details.get("scope")
        what = ("MoE blocks run eager whole" if scope == "block" else
                "MoE blocks: attention and norms compiled, the MoE module eager")
        return f"{what} (moe_eager_scope = {json.dumps(scope)})"
    seam: MixedCompileSeam

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.scope = ctx.settings.moe_eager_scope
        self._patched: str | None = None
        self._logged_counts = False

    def check(self, model: nn.Module) -> str | None:
        if not self.ctx.compile.model:
            return (
                "compile disabled ([compile] enable = false or \"model\" not in "
                "[compile] components)"
            )
        if getattr(model, "layers", None) is None:
            return "model has no .layers of TransformerBlocks"
        if not has_moe_blocks(model):
            return "model has no MoE blocks"
        parallelize_fn = self.ctx.parallelize_fn
        if parallelize_fn is None:
            return f"{self.ctx.framework} gives no parallelize function for this model"
        if "apply_compile" not in parallelize_fn.__globals__:
            return (
                f"{parallelize_fn.__module__} has no apply_compile to replace "
                "(its parallelize_fn compiles no blocks)"
            )
        return None

    def apply(self, model: nn.Module) -> None:
        assert self.ctx.parallelize_fn is not None  # check() made sure
        self._apply_combine(model)
        self._patched = self.seam.apply(model, self.scope)

    def _apply_combine(self, model: nn.Module) -> None:
        if self.ctx.settings.moe_combine != "bf16":
            return
        if self.seam.combine_unsupported is not None:
            log_once("moe_combine.unsupported", logging.WARNING,
                     "titan-rocm: [rocm] moe_combine = \"bf16\" not applied: %s; left as "
                     "TorchTitan does it", self.seam.combine_unsupported)
            return
        swapped = [layer_id for layer_id, block in model.layers.named_children()
                   if is_moe_block(block) and hasattr(unwrap_block(block), MOE_CHILD)
                   and combine.use_bf16_combine(getattr(unwrap_block(block), MOE_CHILD))]
        log.info("titan-rocm: MoE modules of layers %s combine their experts' outputs in bf16 "
                 "(moe_combine = \"bf16\": no fp32 copy)", ", ".join(swapped) or "(none new)")

    def post_optimizer_hook(self, model_parts: list[nn.Module]) -> None:
        # One line after the first step proves from the run log that the MoE part ran eager.
        if not self._logged_counts:
            self._logged_counts = True
            log.info("titan-rocm: eager MoE %s forwards after step 1: %s",
                     "block" if self.scope == "block" else "module", eager_forward_calls())

    def plan(self, model: nn.Module) -> dict[str, Any]:
        if self._patched is None:
            return {}
        other = "moe" if self.scope == "block" else "block"
        combine_note = combine.COMBINES[self.ctx.settings.moe_combine]
        if self.ctx.settings.moe_combine == "bf16" and self.seam.combine_unsupported:
            combine_note = f"not applied: {self.seam.combine_unsupported}"
        return {"scope": self.scope, "cost": scope_summary(self.scope),
                "combine": f"{self.ctx.settings.moe_combine}: {combine_note}",
                "other_scope": f"{scope_summary(other)} (--rocm.moe_eager_scope {other})",
                "blocks": plan_blocks(model, self.scope), "patched": self._patched}

    def audit_blocks(self, model_parts: list[nn.Module]) -> dict[str, str]:
        """How the mixed compile runs each block (fullgraph, eager, ...)."""
        blocks: dict[str, str] = {}
        for part in model_parts:
            blocks.update(plan_blocks(part, self.scope))
        return blocks
