"""Facts about a model's TransformerBlocks that several workarounds share, below them all so none
reads another's internals."""

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
MOE_CHILD = "moe"
"""The MoE child of an MoE TransformerBlock: ``self.moe`` in every TorchTitan 0.2.2 MoE model."""

EAGER_ATTR = "_titan_rocm_eager_layer"
"""Set on a module made eager: the block's layer id."""

EAGER_FORWARD_CALLS: Counter[str] = Counter()
"""Eager MoE forwards by layer id, all models in the process: one per micro-batch,
activation-checkpoint recomputation not counted."""


def wrapper_chain(block: nn.Module) -> list[nn.Module]:
    """``block`` and the modules inside its compile and AC wrappers, outermost first."""
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
    """``module.compile()`` was called (TorchTitan 0.3.0 compiles blocks in place, so the
    module stays itself)."""
    return getattr(module, "_compiled_call_impl", None) is not None


def is_compiled(block: nn.Module) -> bool:
    """``block`` is, or wraps, a ``torch.compile``d module (wrapped, or compiled in place)."""
    return any(isinstance(m, OptimizedModule) or compiled_in_place(m) for m in wrapper_chain(block))


def is_moe_block(block: nn.Module) -> bool:
    """The TransformerBlock inside ``block``'s wrappers has ``moe_enabled``."""
    return bool(getattr(unwrap_block(block), "moe_enabled", False))


def split_children(block: nn.Module) -> tuple[list[str], list[str]] | None:
    """(children to compile, children to keep eager) of an MoE block under the ``moe`` scope;
    None when it has no :data:`MOE_CHILD` (it then stays eager whole)."""
    names = [name for name, _ in unwrap_block(block).named_children()]
    if MOE_CHILD not in names:
        return None
    return [n for n in names if n != MOE_CHILD], [MOE_CHILD]


def split_text(compiled: list[str], eager: list[str]) -> str:
    """E.g. ``attention, ... fullgraph; moe eager`` (plan, log)."""
    return f"{', '.join(compiled)} {FULLGRAPH}; {', '.join(eager)} eager"


def block_decision(block: nn.Module, scope: str = "block") -> str:
    """What the mixed compile does with ``block`` under ``scope``, in the words plan and the
    log show (``"fullgraph"``, ``"eager (MoE)"``, a :func:`split_text`)."""
    if not is_moe_block(block):
        return FULLGRAPH
    if scope == "block":
        return EAGER_MOE
    split = split_children(block)
    if split is None:
        return f"{EAGER_MOE}: no {MOE_CHILD!r} child to split"
    return split_text(*split)


def plan_blocks(model: nn.Module, scope: str = "block") -> dict[str, str]:
    """:func:`block_decision` of every block in ``model.layers``, by layer id."""
    layers = getattr(model, "layers", None)
    if layers is None:
        return {}
    return {layer_id: block_decision(block, scope) for layer_id, block in layers.named_children()}


def has_moe_blocks(model: nn.Module) -> bool:
    """Some block of ``model.layers`` has ``moe_enabled``."""
    layers = getattr(model, "layers", None)
    return layers is not None and any(is_moe_block(b) for b in layers.children())


@torch.compiler.disable
def _eager_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    # Counted before the module runs: code inside it (the experts) can see it is in one.
    # Not during backward: that is activation-checkpoint recomputation (the moe scope's MoE
    # module sits inside the checkpointed block; the block scope wraps the checkpoint
    # wrapper itself, whose forward recomputation never calls), so both scopes count alike.
    if torch._C._current_graph_task_id() == -1:
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

    Pass the AC wrapper when there is one, so the checkpointed region stays eager whole."""
    if eager_layer_id(block) is not None:
        return False
    block.__dict__[EAGER_ATTR] = layer_id
    # Instance attribute: nn.Module.__call__ calls self.forward.
    block.forward = types.MethodType(_eager_forward, block)
    return True


KEEP_EAGER_ATTR = "_titan_rocm_keep_eager"
"""Set on a block that must run eager whatever compiles it: ``(why, backend)``; a backend
keeps only the MoE module eager and compiles the other children with it (the ``moe`` scope)."""


def mark_eager(block: nn.Module, why: str, split_backend: str | None = None) -> None:
    """Ask that ``block`` run eager once its framework compiled the model in place (0.3.0: the
    adapter calls :func:`realize_eager_marks`); the first mark is kept."""
    unwrap_block(block).__dict__.setdefault(KEEP_EAGER_ATTR, (why, split_backend))


def eager_mark(block: nn.Module) -> str | None:
    """How a marked ``block`` will run, and why; None when it is not marked."""
    mark = unwrap_block(block).__dict__.get(KEEP_EAGER_ATTR)
    if mark is None:
        return None
    why, backend = mark
    split = split_children(block) if backend is not None else None
    return f"{split_text(*split)} ({why})" if split else f"eager ({why})"


def realize_eager_marks(model: nn.Module) -> dict[str, str]:
    """Take every marked block out of its compile; per layer id, its mark. Idempotent, since
    pipeline parallelism parallelizes once per stage."""
    done: dict[str, str] = {}
    layers = getattr(model, "layers", None)
    if layers is None:
        return done
    for layer_id, block in layers.named_children():
        text = eager_mark(block)
        if text is None:
            continue
        for module in wrapper_chain(block):
            if compiled_in_place(module):
                module._compiled_call_impl = None
        backend = unwrap_block(block).__dict__[KEEP_EAGER_ATTR][1]
        split = split_children(block) if backend is not None else None
        if split is None:
            fresh = make_eager(block, layer_id)
        else:
            inner = unwrap_block(block)
            fresh = False
            for name in split[0]:
                child = getattr(inner, name)
                if not compiled_in_place(child):
                    child.compile(backend=backend, fullgraph=True)
                    fresh = True
            fresh = make_eager(getattr(inner, MOE_CHILD), layer_id) or fresh
        done[layer_id] = text if fresh else f"{text} (already)"
    return done


def eager_forward_calls() -> dict[str, int]:
    """:data:`EAGER_FORWARD_CALLS` as a plain dict (layer id -> eager forwards)."""
    return dict(EAGER_FORWARD_CALLS)
