"""Mixed compile: dense TransformerBlocks compiled whole (fullgraph), MoE blocks eager (or part).

TorchTitan 0.2.2 compiles per block in ``apply_compile``, called by the model's
``parallelize_fn`` after activation checkpointing and before FSDP. llama3's compiles every
block with ``fullgraph=True``; llama4's (imported *by name* by qwen3 and deepseek_v3)
compiles the children of MoE blocks, and the children of their MoE module except
``experts``, and wraps the grouped-MM function in ``torch.compile``. Those compiled MoE
pieces (data-dependent token counts, a compiled grouped-MM with dynamic shapes) are what
titan-rocm keeps out of Inductor on ROCm, so this workaround replaces ``apply_compile`` in
the globals of the current model's ``parallelize_fn`` -- the dictionary that function really
reads -- with one that:

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

:func:`~titan_rocm.workarounds.moe_blocks.block_decision` decides per block; both the
compile and ``titan-rocm plan`` use it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.nn as nn
from torch._dynamo.eval_frame import OptimizedModule

from titan_rocm.log import log, log_once
from titan_rocm.workarounds.base import Context, Workaround
from titan_rocm.workarounds.moe_blocks import (
    FULLGRAPH,
    MOE_CHILD,
    block_decision,
    eager_forward_calls,
    has_moe_blocks,
    is_compiled,
    is_moe_block,
    make_eager,
    plan_blocks,
    split_children,
    unwrap_block,
)
from titan_rocm.workarounds.moe_eager_compile import combine

PATCHED_ATTR = "titan_rocm_mixed_compile"
"""Set on the replacement ``apply_compile``; its value is the function it replaced."""
SCOPE_ATTR = "titan_rocm_moe_eager_scope"
"""Set on the replacement ``apply_compile``: the ``moe_eager_scope`` it applies."""

SCOPE_COST = {
    "block": "0.93 of stock tokens/s",
    "moe": "0.966 of stock tokens/s",
}
"""The mixed strategy's measured cost by scope: deepseek_v3 3.9 B, GPU-bound, one H200
(0.9315 and 0.9656; docs/moe-eager-compile.md, benchmarks/results/2026-11-30-h200-d/
tp-moe-scope)."""
SCOPE_STATUS = {
    "block": "the fix AMD-AGI/Primus PR #962 validated on MI300X",
    "moe": ("unvalidated on ROCm: Primus PR #962 found that compiling even the outer MoE "
            "block with a graph break around MoE.forward still produces the step-1 NaN"),
}
"""What upstream's ROCm evidence says of each scope (docs/moe-eager-compile.md)."""


def scope_summary(scope: str) -> str:
    """``<scope>: <measured cost>; <upstream status>``, one line for the plan."""
    return f"{scope!r}: {SCOPE_COST[scope]} on an H200; {SCOPE_STATUS[scope]}"


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
    current = module_globals.get("apply_compile")
    if current is None:
        raise ValueError(f"{where} does not exist: nothing to replace")
    if getattr(current, SCOPE_ATTR, None) != scope:
        stock = getattr(current, PATCHED_ATTR, current)
        module_globals["apply_compile"] = make_mixed_apply_compile(stock, scope)
    return where


def stock_apply_compile(parallelize_fn: Callable[..., Any]) -> Callable[..., Any] | None:
    """TorchTitan's own ``apply_compile`` that ``parallelize_fn`` reads (patched or not); None
    where its module has none (its model compiles no blocks)."""
    current = parallelize_fn.__globals__.get("apply_compile")
    return getattr(current, PATCHED_ATTR, current)


def restore_apply_compile(parallelize_fn: Callable[..., Any]) -> bool:
    """Undo :func:`patch_apply_compile`; False if it was not patched."""
    module_globals = parallelize_fn.__globals__
    current = module_globals.get("apply_compile")
    if current is None or not hasattr(current, PATCHED_ATTR):
        return False
    module_globals["apply_compile"] = getattr(current, PATCHED_ATTR)
    return True


class MixedCompileSeam(Protocol):
    """How one TorchTitan generation's compile is made mixed (``seams_tt022``/``seams_tt030``)."""

    combine_unsupported: str | None
    """Why ``moe_combine = "bf16"`` cannot apply in this generation (None: it can)."""

    def apply(self, model: nn.Module, scope: str) -> str:
        """Make the MoE blocks (or, by ``scope``, their MoE module) run eager; return what was
        patched, for the plan."""


class MoEEagerCompile(Workaround):
    """Replaces the model's ``apply_compile``: dense blocks fullgraph, MoE blocks eager (by
    ``[rocm] moe_eager_scope``: the whole block, or only its MoE module)."""

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
        """``[rocm] moe_combine = "bf16"``: the MoE modules get Primus's weighted-sum combine."""
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
