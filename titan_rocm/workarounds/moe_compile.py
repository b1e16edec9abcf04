"""Mixed compile: dense TransformerBlocks compiled whole (fullgraph), MoE blocks left eager.

TorchTitan 0.2.2 compiles per block in ``apply_compile``, called by the model's
``parallelize_fn`` after activation checkpointing and before FSDP. llama3's compiles every
block with ``fullgraph=True``; llama4's (imported *by name* by qwen3 and deepseek_v3)
compiles the children of MoE blocks except ``experts`` and wraps the grouped-MM function in
``torch.compile``. Those compiled MoE pieces (data-dependent token counts, graph breaks
around FSDP hooks, a compiled grouped-MM with dynamic shapes) are what titan-rocm keeps out
of Inductor on ROCm, so this workaround replaces ``apply_compile`` in the globals of the
current model's ``parallelize_fn`` -- the dictionary that function really reads -- with one
that:

- compiles each dense block whole, ``torch.compile(block, backend=<[compile] backend>,
  fullgraph=True)`` (an activation-checkpoint wrapper is compiled with its block, as stock);
- leaves each block with ``moe_enabled`` fully eager: its ``forward`` is wrapped in
  ``torch.compiler.disable`` so nothing traces it, and counted (:data:`EAGER_FORWARD_CALLS`);
- is idempotent: pipeline parallelism calls it once per stage, and a block already compiled
  or already made eager is left alone.

:func:`block_decision` decides per block; both the compile and ``titan-rocm plan`` use it.
"""

from __future__ import annotations

import inspect
import types
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
from torch._dynamo.eval_frame import OptimizedModule
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
from torchtitan.tools.logging import logger

from titan_rocm.converters.base import Context, Workaround

FULLGRAPH = "fullgraph"
EAGER_MOE = "eager (MoE)"

PATCHED_ATTR = "titan_rocm_mixed_compile"
"""Set on the replacement ``apply_compile``; its value is the function it replaced."""
EAGER_ATTR = "_titan_rocm_eager_layer"
"""Set on an MoE block made eager (the module itself): its layer id."""

EAGER_FORWARD_CALLS: Counter[str] = Counter()
"""How many times each MoE block's eager forward ran, by layer id (all models in the process)."""


def wrapper_chain(block: nn.Module) -> list[nn.Module]:
    """``block`` and the modules inside its compile (``OptimizedModule``) and AC
    (``CheckpointWrapper``) wrappers, outermost first; the last is the TransformerBlock."""
    chain = [block]
    while True:
        if isinstance(block, OptimizedModule):
            block = block._orig_mod
        elif isinstance(block, CheckpointWrapper):
            block = block._checkpoint_wrapped_module
        else:
            return chain
        chain.append(block)


def unwrap_block(block: nn.Module) -> nn.Module:
    """The TransformerBlock inside compile and AC wrappers."""
    return wrapper_chain(block)[-1]


def is_compiled(block: nn.Module) -> bool:
    """``block`` is, or wraps, a ``torch.compile``d module."""
    return any(isinstance(m, OptimizedModule) for m in wrapper_chain(block))


def block_decision(block: nn.Module) -> str:
    """``"fullgraph"`` for a dense block, ``"eager (MoE)"`` for a block with ``moe_enabled``."""
    return EAGER_MOE if getattr(unwrap_block(block), "moe_enabled", False) else FULLGRAPH


def plan_blocks(model: nn.Module) -> dict[str, str]:
    """:func:`block_decision` of every block in ``model.layers``, by layer id."""
    layers = getattr(model, "layers", None)
    if layers is None:
        return {}
    return {layer_id: block_decision(block) for layer_id, block in layers.named_children()}


def has_moe_blocks(model: nn.Module) -> bool:
    """Some block of ``model.layers`` has ``moe_enabled``."""
    return EAGER_MOE in plan_blocks(model).values()


@torch.compiler.disable
def _eager_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """The forward of an MoE block made eager: counted, then the class's own forward."""
    # Counted before the block runs: code inside it (the experts) can see it is in one.
    EAGER_FORWARD_CALLS[self.__dict__[EAGER_ATTR]] += 1
    return type(self).forward(self, *args, **kwargs)


def eager_layer_id(block: nn.Module) -> str | None:
    """The layer id of ``block`` (or a module in its wrapper chain) made eager, else None."""
    for module in wrapper_chain(block):
        layer_id = module.__dict__.get(EAGER_ATTR)
        if layer_id is not None:
            return layer_id
    return None


def make_eager(block: nn.Module, layer_id: str) -> bool:
    """Keep ``block`` out of every trace and count its forwards; False if already done.

    Wraps the outermost module (the AC wrapper, when there is one) so the checkpointed
    region stays eager as a whole; FSDP's hooks still run, they live in ``__call__``. The
    instance's ``forward`` is a bound method, so ``copy.deepcopy`` rebinds it to the copy.
    """
    if eager_layer_id(block) is not None:
        return False
    block.__dict__[EAGER_ATTR] = layer_id
    # Instance attribute: nn.Module.__call__ calls self.forward.
    block.forward = types.MethodType(_eager_forward, block)
    return True


def compile_blocks(model: nn.Module, backend: str) -> dict[str, str]:
    """Compile dense blocks of ``model.layers`` fullgraph, make MoE blocks eager (idempotent).

    Returns:
        Per layer id, what was done: the decision, or ``"<decision> (already)"`` when an
        earlier call did it.
    """
    done: dict[str, str] = {}
    for layer_id, block in list(model.layers.named_children()):
        decision = block_decision(block)
        if decision == FULLGRAPH:
            if is_compiled(block):
                done[layer_id] = f"{decision} (already)"
                continue
            compiled = torch.compile(block, backend=backend, fullgraph=True)
            model.layers.register_module(layer_id, compiled)
            done[layer_id] = decision
        else:
            done[layer_id] = decision if make_eager(block, layer_id) else f"{decision} (already)"
    return done


def make_mixed_apply_compile(original: Callable[..., Any]) -> Callable[..., None]:
    """A drop-in replacement for TorchTitan's ``apply_compile`` ``original``.

    Accepts both stock signatures: llama3's ``(model, compile_config)`` and llama4's
    ``(model, compile_config, ep_enabled)``.
    """
    takes_ep = "ep_enabled" in inspect.signature(original).parameters

    def apply_compile(model: nn.Module, compile_config: Any, *args: Any, **kwargs: Any) -> None:
        """titan-rocm mixed compile: dense blocks fullgraph, MoE blocks eager."""
        if takes_ep:
            # As the stock llama4 function: lets Dynamo capture .item() as unbacked symbols.
            torch._dynamo.config.capture_scalar_outputs = True
        done = compile_blocks(model, compile_config.backend)
        dense = sum(1 for d in done.values() if d.startswith(FULLGRAPH))
        logger.info(
            f"titan-rocm: compiled {dense} dense TransformerBlocks with fullgraph "
            f"(backend {compile_config.backend!r}); {len(done) - dense} MoE blocks stay eager"
        )

    setattr(apply_compile, PATCHED_ATTR, original)
    return apply_compile


def patch_apply_compile(parallelize_fn: Callable[..., Any]) -> str:
    """Replace ``apply_compile`` in ``parallelize_fn.__globals__`` (idempotent).

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
    if not hasattr(current, PATCHED_ATTR):
        module_globals["apply_compile"] = make_mixed_apply_compile(current)
    return where


def restore_apply_compile(parallelize_fn: Callable[..., Any]) -> bool:
    """Undo :func:`patch_apply_compile`; False if it was not patched."""
    module_globals = parallelize_fn.__globals__
    current = module_globals.get("apply_compile")
    if current is None or not hasattr(current, PATCHED_ATTR):
        return False
    module_globals["apply_compile"] = getattr(current, PATCHED_ATTR)
    return True


def eager_forward_calls() -> dict[str, int]:
    """:data:`EAGER_FORWARD_CALLS` as a plain dict (layer id -> eager forwards)."""
    return dict(EAGER_FORWARD_CALLS)


class MoEEagerCompile(Workaround):
    """Replaces the model's ``apply_compile``: dense blocks fullgraph, MoE blocks eager."""

    name = "moe_eager_compile"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self._patched: str | None = None
        self._logged_counts = False

    def _parallelize_fn(self) -> Callable[..., Any]:
        from torchtitan.protocols.train_spec import get_train_spec

        return get_train_spec(self.ctx.job_config.model.name).parallelize_fn

    def check(self, model: nn.Module) -> str | None:
        if not self.ctx.compile_enabled:
            return (
                "compile disabled ([compile] enable = false or \"model\" not in "
                "[compile] components)"
            )
        if getattr(model, "layers", None) is None:
            return "model has no .layers of TransformerBlocks"
        if not has_moe_blocks(model):
            return "model has no MoE blocks"
        try:
            parallelize_fn = self._parallelize_fn()
        except ValueError as exc:
            return f"no TorchTitan train spec for this model: {exc}"
        if "apply_compile" not in parallelize_fn.__globals__:
            return (
                f"{parallelize_fn.__module__} has no apply_compile to replace "
                "(its parallelize_fn compiles no blocks)"
            )
        return None

    def apply(self, model: nn.Module) -> None:
        self._patched = patch_apply_compile(self._parallelize_fn())
        logger.info(f"titan-rocm: replaced {self._patched} (dense fullgraph, MoE eager)")

    def post_optimizer_hook(self, model_parts: list[nn.Module]) -> None:
        # One line after the first step proves from the run log that MoE blocks ran eager.
        if not self._logged_counts:
            self._logged_counts = True
            logger.info(
                f"titan-rocm: eager MoE block forwards after step 1: {eager_forward_calls()}"
            )

    def plan(self, model: nn.Module) -> dict[str, Any]:
        if self._patched is None:
            return {}
        return {"blocks": plan_blocks(model), "patched": self._patched}
