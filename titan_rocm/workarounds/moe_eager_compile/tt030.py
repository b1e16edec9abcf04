"""TorchTitan 0.3.0's seam for the mixed compile: stock compile, then MoE blocks back to eager.

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
expert dispatch of an MoE block then run outside every Inductor graph, as on 0.2.2.
"""

from __future__ import annotations

import torch.nn as nn

from titan_rocm.workarounds.moe_blocks import EAGER_MOE, block_decision, mark_eager

SEAM = (
    "torchtitan.distributed.compile.apply_compile compiles every block in place; MoE blocks "
    "are taken out of it after parallelize_fn (torchtitan 0.3.0)"
)
"""What :func:`mark_moe_blocks` stands for, for the log and the plan."""


def mark_moe_blocks(model: nn.Module) -> list[str]:
    """Mark every MoE block of ``model.layers`` to run eager; return their layer ids."""
    marked = []
    for layer_id, block in model.layers.named_children():
        if block_decision(block) == EAGER_MOE:
            mark_eager(block, "rocm.moe_eager_compile")
            marked.append(layer_id)
    return marked
