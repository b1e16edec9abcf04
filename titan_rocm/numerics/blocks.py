"""Block boundaries: where the audit records and replays, and where the test fault listens.

``model.layers[key]``'s outermost module is the one boundary every configuration shares and
runs outside compiled code; nothing is intercepted while Dynamo traces, so a model compiled
whole has none at run time (:func:`boundaries_seen` stays 0)."""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch
import torch.nn as nn

MARKED_ATTR = "_titan_rocm_block_base"

Call = Callable[[tuple[Any, ...], dict[str, Any]], Any]


class Interceptor(Protocol):
    """Something that acts at each block call (the recorder, a replay's stand-ins, the fault)."""

    def around(self, key: str, module: nn.Module, args: tuple[Any, ...],
               kwargs: dict[str, Any], proceed: Call) -> Any:
        """Return the block's output; ``proceed(args, kwargs)`` runs the rest (the block)."""


class _State:
    def __init__(self) -> None:
        self.stack: list[Interceptor] = []
        self.keys: weakref.WeakKeyDictionary[nn.Module, str] = weakref.WeakKeyDictionary()
        self.seen = 0


_STATE = _State()


def blocks_of(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(key, outermost module)`` of every block of ``model.layers``, in forward order."""
    layers = getattr(model, "layers", None)
    if not isinstance(layers, nn.Module):
        return []
    return list(layers.named_children())


def mark(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Give every block of ``model`` the intercepting ``__call__`` (idempotent); its blocks."""
    found = blocks_of(model)
    for key, block in found:
        cls = type(block)
        if getattr(cls, MARKED_ATTR, None) is None:
            block.__class__ = _marked_class(cls)
        _STATE.keys[block] = key
    return found


def key_of(module: nn.Module) -> str | None:
    """The ``model.layers`` key of a marked block, None otherwise."""
    return _STATE.keys.get(module)


@functools.cache
def _marked_class(base: type) -> type:
    def __call__(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        return _dispatch(self, base.__call__, args, kwargs)

    return type(f"{base.__name__}Block", (base,), {"__call__": __call__, MARKED_ATTR: base})


class _Chain:
    """An object, because a self-naming closure is a reference cycle that would keep the recorder's
    tensors alive until the garbage collector runs."""

    __slots__ = ("call", "key", "module", "stack")

    def __init__(self, stack: list[Interceptor], key: str, module: nn.Module,
                 call: Callable[..., Any]) -> None:
        self.stack, self.key, self.module, self.call = stack, key, module, call

    def __call__(self, i: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if i == len(self.stack):
            return self.call(self.module, *args, **kwargs)
        return self.stack[i].around(self.key, self.module, args, kwargs,
                                    functools.partial(self, i + 1))


def _dispatch(module: nn.Module, call: Callable[..., Any], args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> Any:
    key = _STATE.keys.get(module)
    if key is None or not _STATE.stack or torch.compiler.is_compiling():
        return call(module, *args, **kwargs)
    _STATE.seen += 1
    return _Chain(list(_STATE.stack), key, module, call)(0, args, kwargs)


def call_block(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run a block without any interceptor (a replay calls the block itself)."""
    base = getattr(type(module), MARKED_ATTR, None) or type(module)
    return base.__call__(module, *args, **kwargs)


@contextlib.contextmanager
def intercepting(interceptor: Interceptor) -> Iterator[None]:
    """Push ``interceptor`` on the stack for the block calls inside (outermost first)."""
    _STATE.stack.append(interceptor)
    try:
        yield
    finally:
        _STATE.stack.remove(interceptor)


def push(interceptor: Interceptor) -> None:
    """Push ``interceptor`` until :func:`remove` (a fault that lives as long as the process)."""
    _STATE.stack.append(interceptor)


def remove(interceptor: Interceptor) -> None:
    """Take ``interceptor`` off the stack (no-op if it is not on it)."""
    if interceptor in _STATE.stack:
        _STATE.stack.remove(interceptor)


def boundaries_seen() -> int:
    """How many intercepted block calls this process made (a whole-model compile makes none)."""
    return _STATE.seen


def grad_tensors(tree: Any) -> list[torch.Tensor]:
    """The tensors of ``tree`` (any nesting) that require grad."""
    leaves = torch.utils._pytree.tree_leaves(tree)
    return [t for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad]


def call_intercepted(key: str, module: nn.Module, call: Callable[..., Any],
                     args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``call(module, *args, **kwargs)`` through the interceptors on the stack, as block ``key``
    (a replay of compiled code the test fault must see as that block)."""
    if not _STATE.stack:
        return call(module, *args, **kwargs)
    return _Chain(list(_STATE.stack), key, module, call)(0, args, kwargs)
