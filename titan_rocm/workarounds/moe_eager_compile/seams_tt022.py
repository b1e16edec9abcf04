"""TorchTitan 0.2.2's seam of the mixed compile: the model's ``apply_compile``, replaced in the
module globals its ``parallelize_fn`` reads (:func:`~.workaround.patch_apply_compile`)."""

from __future__ import annotations

from typing import Any

import torch.nn as nn

from titan_rocm.log import log
from titan_rocm.workarounds.moe_eager_compile.workaround import patch_apply_compile


class Seam:
    """:class:`~.workaround.MixedCompileSeam` for TorchTitan 0.2.2."""

    combine_unsupported = None

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def apply(self, model: nn.Module, scope: str) -> str:
        """Replace ``apply_compile``; return its name."""
        where = patch_apply_compile(self.ctx.parallelize_fn, scope)
        log.info("titan-rocm: replaced %s (dense fullgraph, MoE eager; moe_eager_scope = %r)",
                 where, scope)
        return where
