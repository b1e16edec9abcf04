"""TorchTitan 0.3.0's seam of the mixed compile: stock compile, then MoE blocks back to eager.

0.3.0's ``apply_compile`` already compiles dense blocks as wanted, so MoE blocks are only marked and
taken out after ``parallelize_fn``."""

from __future__ import annotations

from typing import Any

import torch.nn as nn

from titan_rocm.log import log
from titan_rocm.workarounds.moe_blocks import is_moe_block, mark_eager

SEAM = (
    "torchtitan.distributed.compile.apply_compile compiles every block in place; MoE blocks "
    "are taken out of it after parallelize_fn (torchtitan 0.3.0)"
)


def mark_moe_blocks(model: nn.Module, scope: str = "block", backend: str = "inductor"
                    ) -> list[str]:
    """Mark every MoE block of ``model.layers`` eager by ``scope``; return their layer ids."""
    marked = []
    for layer_id, block in model.layers.named_children():
        if is_moe_block(block):
            mark_eager(block, "rocm.moe_eager_compile", backend if scope == "moe" else None)
            marked.append(layer_id)
    return marked


class Seam:
    """:class:`~.workaround.MixedCompileSeam` for TorchTitan 0.3.0."""

    combine_unsupported = ("TorchTitan 0.3.0 combines in its token dispatcher, not in "
                           "MoE.forward")

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def apply(self, model: nn.Module, scope: str) -> str:
        """Mark the MoE blocks; return what stands for the seam (:data:`.SEAM`)."""
        marked = mark_moe_blocks(model, scope, self.ctx.compile.backend)
        log.info("titan-rocm: MoE blocks %s will run %s (%s)", ", ".join(marked),
                 "eager" if scope == "block" else "with their MoE module eager", SEAM)
        return SEAM
