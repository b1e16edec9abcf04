"""TorchTitan 0.3.0's seam of the mixed compile: MoE blocks marked on the meta model, taken out
of the stock compile by the adapter after ``parallelize_fn`` (:mod:`.tt030`)."""

from __future__ import annotations

from typing import Any

import torch.nn as nn

from titan_rocm.log import log
from titan_rocm.workarounds.moe_eager_compile import tt030


class Seam:
    """:class:`~.workaround.MixedCompileSeam` for TorchTitan 0.3.0."""

    combine_unsupported = ("TorchTitan 0.3.0 combines in its token dispatcher, not in "
                           "MoE.forward")

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def apply(self, model: nn.Module, scope: str) -> str:
        """Mark the MoE blocks; return what stands for the seam (:data:`.tt030.SEAM`)."""
        marked = tt030.mark_moe_blocks(model, scope, self.ctx.compile.backend)
        log.info("titan-rocm: MoE blocks %s will run %s (%s)", ", ".join(marked),
                 "eager" if scope == "block" else "with their MoE module eager", tt030.SEAM)
        return tt030.SEAM
