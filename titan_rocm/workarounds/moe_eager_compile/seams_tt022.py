"""TorchTitan 0.2.2's seam of the mixed compile: the model's ``apply_compile``, replaced in the
module globals its ``parallelize_fn`` reads.

TorchTitan 0.2.2 compiles per block in ``apply_compile``, called by the model's
``parallelize_fn`` after activation checkpointing and before FSDP. llama3's compiles every
block with ``fullgraph=True``; llama4's (imported *by name* by qwen3 and deepseek_v3)
compiles the children of MoE blocks, and the children of their MoE module except
``experts``, and wraps the grouped-MM function in ``torch.compile``. Those compiled MoE
pieces (data-dependent token counts, a compiled grouped-MM with dynamic shapes) are what
titan-rocm keeps out of Inductor on ROCm, so the seam replaces ``apply_compile`` in the
globals of the current model's ``parallelize_fn`` -- the dictionary that function really
reads, a patch of :mod:`titan_rocm.patches` -- with one that:

- compiles each dense block whole, ``torch.compile(block, backend=<[compile] backend>,
  fullgraph=True)`` (an activation-checkpoint wrapper is compiled with its block, as stock);
- in each block with ``moe_enabled``, by ``[rocm] moe_eager_scope``:

  - ``block``: compiles nothing; the block's ``forward`` (its AC wrapper's, when it has one)
    is wrapped in ``torch.compiler.disable`` so nothing traces it;
  - ``moe``: compiles each child except the MoE module (attention and the two norms), each
    ``fullgraph=True``, exactly where stock compiles them (inside the AC wrapper, under the
    block's FSDP hooks); the MoE module's ``forward`` is wrapped in
    ``torch.compiler.disable``. FSDP's hooks (on the block and, with EP, on the experts), EP's
    dispatch/combine (on the experts), the router, token permutation and grouped GEMM are
    then in no graph;

  either way the eager part's forwards are counted
  (:data:`~titan_rocm.workarounds.moe_blocks.EAGER_FORWARD_CALLS`);
- is idempotent: pipeline parallelism calls it once per stage, and a block (or child)
  already compiled, or already made eager, is left alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
from torch._dynamo.eval_frame import OptimizedModule

from titan_rocm import patches
from titan_rocm.log import log
from titan_rocm.workarounds.moe_blocks import (
    FULLGRAPH,
    MOE_CHILD,
    block_decision,
    is_compiled,
    is_moe_block,
    make_eager,
    split_children,
    unwrap_block,
)

NAME = "moe_eager_compile"
"""Who the seam's patches are ``by``."""
PATCHED_ATTR = "titan_rocm_mixed_compile"
"""Set on the replacement ``apply_compile``; its value is the function it replaced."""
SCOPE_ATTR = "titan_rocm_moe_eager_scope"
"""Set on the replacement ``apply_compile``: the ``moe_eager_scope`` it applies."""


def compile_blocks(model: nn.Module, backend: str, scope: str = "block") -> dict[str, str]:
    """Compile dense blocks of ``model.layers`` fullgraph; MoE blocks by ``scope`` (idempotent).

    ``scope`` ``"block"`` makes each MoE block eager whole; ``"moe"`` compiles its children
    but the MoE module fullgraph and makes the MoE module eager (:func:`split_children`).

    Returns:
        Per layer id, what was done: the decision, or ``"<decision> (already)"`` when an
        earlier call did it.
    """
    done: dict[str, str] = {}
    for layer_id, block in list(model.layers.named_children()):
        decision = block_decision(block, scope)
        split = split_children(block) if scope == "moe" and is_moe_block(block) else None
        if not is_moe_block(block):
            if is_compiled(block):
                done[layer_id] = f"{decision} (already)"
                continue
            compiled = torch.compile(block, backend=backend, fullgraph=True)
            model.layers.register_module(layer_id, compiled)
            done[layer_id] = decision
        elif split is not None:
            fresh = _split_block(unwrap_block(block), split[0], layer_id, backend)
            done[layer_id] = decision if fresh else f"{decision} (already)"
        else:
            done[layer_id] = decision if make_eager(block, layer_id) else f"{decision} (already)"
    return done


def _split_block(inner: nn.Module, compiled: list[str], layer_id: str, backend: str) -> bool:
    """The ``moe`` scope on one TransformerBlock (inside any AC wrapper); False if done before.

    The children are compiled inside the checkpointed region, where stock compiles them:
    the AC wrapper checkpoints the whole block, and recomputation in the backward runs the
    compiled children's forward graphs again (no retrace) around the eager MoE module.
    """
    fresh = False
    for name in compiled:
        child = getattr(inner, name)
        if not isinstance(child, OptimizedModule):
            inner.register_module(
                name, torch.compile(child, backend=backend, fullgraph=True)
            )
            fresh = True
    return make_eager(getattr(inner, MOE_CHILD), layer_id) or fresh


def make_mixed_apply_compile(
    original: Callable[..., Any], scope: str = "block"
) -> Callable[..., None]:
    """A drop-in replacement for TorchTitan's ``apply_compile`` ``original``.

    Accepts both stock signatures: llama3's ``(model, compile_config)`` and llama4's
    ``(model, compile_config, ep_enabled)``.
    """
    def apply_compile(model: nn.Module, compile_config: Any, *args: Any, **kwargs: Any) -> None:
        """titan-rocm mixed compile: dense blocks fullgraph, MoE blocks eager (by scope)."""
        # capture_scalar_outputs is left as it is: stock llama4 turns it on for the MoE pieces
        # it compiles (.item() as unbacked symbols), none of which the mixed compile compiles;
        # AMD-AGI/Primus's dense-only compile (PR #962, merged) leaves it off as well.
        done = compile_blocks(model, compile_config.backend, scope)
        dense = sum(1 for d in done.values() if d.startswith(FULLGRAPH))
        if scope == "moe":
            log.info(
                "titan-rocm: compiled %d dense TransformerBlocks with fullgraph (backend %r); "
                "in %d MoE blocks only the MoE module stays eager (moe_eager_scope = \"moe\"): "
                "%s", dense, compile_config.backend, len(done) - dense,
                sorted({d for d in done.values() if not d.startswith(FULLGRAPH)}),
            )
        else:
            log.info(
                "titan-rocm: compiled %d dense TransformerBlocks with fullgraph (backend %r); "
                "%d MoE blocks stay eager", dense, compile_config.backend, len(done) - dense,
            )

    setattr(apply_compile, PATCHED_ATTR, original)
    setattr(apply_compile, SCOPE_ATTR, scope)
    return apply_compile


def patch_apply_compile(parallelize_fn: Callable[..., Any], scope: str = "block") -> str:
    """Replace ``apply_compile`` in ``parallelize_fn.__globals__`` (idempotent).

    A replacement made for another scope (an earlier job in this process) is replaced
    again, from the same stock function.

    Returns:
        ``"<module>.apply_compile"``, the name replaced.

    Raises:
        ValueError: that module has no ``apply_compile``.
    """
    module_globals = parallelize_fn.__globals__
    where = f"{module_globals.get('__name__', '?')}.apply_compile"
    if module_globals.get("apply_compile") is None:
        raise ValueError(f"{where} does not exist: nothing to replace")
    current = patches.find(module_globals, "apply_compile", NAME)
    patches.patch(module_globals, "apply_compile",
                  lambda stock: make_mixed_apply_compile(stock, scope), by=NAME,
                  refresh=current is not None and getattr(current.value, SCOPE_ATTR) != scope)
    return where


def stock_apply_compile(parallelize_fn: Callable[..., Any]) -> Callable[..., Any] | None:
    """TorchTitan's own ``apply_compile`` that ``parallelize_fn`` reads (patched or not); None
    where its module has none (its model compiles no blocks)."""
    module_globals = parallelize_fn.__globals__
    if "apply_compile" not in module_globals:
        return None
    return patches.original(module_globals, "apply_compile")


def restore_apply_compile(parallelize_fn: Callable[..., Any]) -> bool:
    """Undo :func:`patch_apply_compile`, whoever holds it; False if it was not patched."""
    patch = patches.find(parallelize_fn.__globals__, "apply_compile", NAME)
    if patch is None:
        return False
    patch.restore()
    return True


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
