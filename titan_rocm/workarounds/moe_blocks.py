"""Facts about a model's TransformerBlocks that several workarounds share.

Which blocks are MoE blocks, what wraps a block (compile, activation checkpointing), and
which MoE blocks were made eager (and how often each ran) are facts about the *model*: the
mixed compile strategy makes blocks eager, the grouped-MM binding and ``titan-rocm plan``
read the result. They live here, below every workaround, so no workaround reads another's
internals.
"""

from __future__ import annotations

import types
from collections import Counter
from typing import Any

import torch
import torch.nn as nn
from torch._dynamo.eval_frame import OptimizedModule
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

FULLGRAPH = "fullgraph"
EAGER_MOE = "eager (MoE)"

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


def compiled_in_place(module: nn.Module) -> bool:
    """``module.compile()`` was called on ``module`` (TorchTitan 0.3.0 compiles blocks so:
    the module stays itself, ``nn.Module.__call__`` goes through ``_compiled_call_impl``)."""
    return getattr(module, "_compiled_call_impl", None) is not None


def is_compiled(block: nn.Module) -> bool:
    """``block`` is, or wraps, a ``torch.compile``d module (wrapped, or compiled in place)."""
    return any(isinstance(m, OptimizedModule) or compiled_in_place(m) for m in wrapper_chain(block))


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


KEEP_EAGER_ATTR = "_titan_rocm_keep_eager"
"""Set on a TransformerBlock that must run eager whatever compiles it: why (the workaround)."""


def mark_eager(block: nn.Module, why: str) -> None:
    """Ask that ``block`` run eager once its framework has compiled the model.

    For frameworks that compile blocks in place inside the model's parallelize function
    (TorchTitan 0.3.0): a workaround marks blocks before it runs, the adapter calls
    :func:`realize_eager_marks` after it. The first reason given is kept.
    """
    unwrap_block(block).__dict__.setdefault(KEEP_EAGER_ATTR, why)


def eager_mark(block: nn.Module) -> str | None:
    """Why ``block`` (or the TransformerBlock inside its wrappers) was marked eager, or None."""
    return unwrap_block(block).__dict__.get(KEEP_EAGER_ATTR)


def realize_eager_marks(model: nn.Module) -> dict[str, str]:
    """Take every marked block of ``model.layers`` out of its compile and make it eager.

    Clears ``_compiled_call_impl`` on every module of the block's wrapper chain (the AC
    wrapper is what a compile of ``model.layers`` children reaches), then
    :func:`make_eager` on the outermost. Idempotent (pipeline parallelism parallelizes once
    per stage).

    Returns:
        Per marked layer id: why, with ``" (already)"`` when an earlier call did it.
    """
    done: dict[str, str] = {}
    layers = getattr(model, "layers", None)
    if layers is None:
        return done
    for layer_id, block in layers.named_children():
        why = eager_mark(block)
        if why is None:
            continue
        for module in wrapper_chain(block):
            if compiled_in_place(module):
                module._compiled_call_impl = None
        done[layer_id] = why if make_eager(block, layer_id) else f"{why} (already)"
    return done


def eager_forward_calls() -> dict[str, int]:
    """:data:`EAGER_FORWARD_CALLS` as a plain dict (layer id -> eager forwards)."""
    return dict(EAGER_FORWARD_CALLS)
