"""TorchTitan 0.3.0's seam of the mixed compile: stock compile, then MoE blocks back to eager.

0.3.0's ``torchtitan/distributed/compile.py:apply_compile(model, *, compile_config,
parallel_dims)`` compiles every child of ``model.layers`` in place with ``fullgraph=True``
(``nn.Module.compile``: no ``OptimizedModule``, the module keeps a ``_compiled_call_impl``),
MoE blocks included, inside each model's ``parallelize_fn`` (after activation checkpointing,
before FSDP). Its dense-block compile is already what the mixed strategy wants (the job's
backend, fullgraph, plus async TP and regional Inductor for ``aot_eager``), so nothing
replaces it here: each MoE block is marked (:func:`~titan_rocm.workarounds.moe_blocks.mark_eager`)
on the meta model, and the 0.3.0 adapter, once the stock ``parallelize_fn`` has run, takes
the marked blocks out of their compile and makes them eager
(:func:`~titan_rocm.workarounds.moe_blocks.realize_eager_marks`): the FSDP hooks and the
expert dispatch of an MoE block then run outside every Inductor graph, as on 0.2.2. Under
``moe_eager_scope = "moe"`` the block's other children (attention, norms) are then compiled
in place, ``fullgraph=True``, inside the AC wrapper, and only the MoE module runs eager.
"""

from __future__ import annotations

from typing import Any

import torch.nn as nn

from titan_rocm.log import log
from titan_rocm.workarounds.moe_blocks import is_moe_block, mark_eager

SEAM = (
    "torchtitan.distributed.compile.apply_compile compiles every block in place; MoE blocks "
    "are taken out of it after parallelize_fn (torchtitan 0.3.0)"
)
"""What :func:`mark_moe_blocks` stands for, for the log and the plan."""


def mark_moe_blocks(model: nn.Module, scope: str = "block", backend: str = "inductor"
                    ) -> list[str]:
    """Mark every MoE block of ``model.layers`` to run eager (``scope`` ``block``) or with only
    its MoE module eager, its other children compiled with ``backend`` (``moe``); return their
    layer ids."""
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
