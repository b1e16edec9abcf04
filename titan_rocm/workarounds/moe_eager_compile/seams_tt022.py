"""TorchTitan 0.2.2's seam of the mixed compile: ``apply_compile`` replaced in the globals
``parallelize_fn`` reads (docs/moe-eager-compile.md). Idempotent: PP calls it per stage."""

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
PATCHED_ATTR = "titan_rocm_mixed_compile"
"""Set on the replacement ``apply_compile``: the function it replaced."""
SCOPE_ATTR = "titan_rocm_moe_eager_scope"
"""Set on the replacement ``apply_compile``: the ``moe_eager_scope`` it applies."""


def compile_blocks(model: nn.Module, backend: str, scope: str = "block") -> dict[str, str]:
    """Compile dense blocks fullgraph, MoE blocks by ``scope``; per layer id, the decision."""
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
    """The ``moe`` scope on one block; False if done before. Children compile inside the AC wrapper,
    so recomputation reruns their graphs without a retrace."""
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
    """A drop-in for ``original``, with either stock signature (llama3's, llama4's)."""
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
    """Replace ``apply_compile`` in ``parallelize_fn.__globals__``; return the name replaced.

    Idempotent; ValueError when that module has no ``apply_compile``."""
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
    """TorchTitan's own ``apply_compile``; None where the model compiles no blocks."""
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
