"""Route other callers of aiter's ``_flash_attn_backward`` the same way (docs/mla-ck-backward.md).

Primus-Turbo binds the name at its own import
(``primus_turbo/pytorch/kernels/attention/attention_aiter_impl.py``, AMD-AGI/Primus-Turbo 03513570),
so module globals holding the original are re-bound too. Not covered: the torch op called directly,
or the original held anywhere but a module global."""

from __future__ import annotations

import functools
import inspect
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from titan_rocm import patches
from titan_rocm._after_import import AfterImport
from titan_rocm.workarounds.mla_ck_backward import aiter_api, op
from titan_rocm.workarounds.mla_ck_backward.route_log import log_route_once
from titan_rocm.workarounds.mla_ck_backward.routing import BACKWARD, CK, route_backward

TARGET_MODULE = aiter_api.MHA_MODULE
TARGET_ATTR = "_flash_attn_backward"
ORIGINAL_ATTR = "__titan_rocm_original__"
NOT_COVERED = (
    "torch.ops.aiter._flash_attn_backward called directly; aiter's original held anywhere but "
    "a module global (closure, attribute, default argument)"
)
"""What the guard cannot reach, for plans and logs."""

NAME = "mla_ck_backward.guard"
"""Who the guard's patches are ``by``."""

_lock = threading.Lock()
_scope: patches.Scope | None = None
"""The scope :func:`install` ran in: it holds a patch the import hook makes later."""


def is_guarded(fn: Any) -> bool:
    """``fn`` is a titan-rocm guard wrapper."""
    return hasattr(fn, ORIGINAL_ATTR)


def guarded_backward(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap aiter's ``_flash_attn_backward`` so q/k 192, v 128 where the arch lacks an
    fmha_v3 kernel for it goes to CK."""
    params = aiter_api.parameters(original, TARGET_ATTR)
    names = [name for name, _ in params or ()]

    def guarded(*args: Any, **kwargs: Any) -> Any:
        if not names or len(args) > len(names):  # parameters unknown: aiter decides
            return original(*args, **kwargs)
        values = dict(zip(names, args, strict=False))  # fewer args: defaults
        values.update(kwargs)
        try:
            q, k, v = values["q"], values["k"], values["v"]
            call = op.attention_call(
                q, k, v, "bshd",
                dropout_p=float(values.get("dropout_p", 0.0)),
                has_bias=values.get("bias") is not None,
                has_alibi=values.get("alibi_slopes") is not None,
                causal=bool(values.get("causal", True)),
                deterministic=bool(values.get("deterministic", False)),
            )
        except (KeyError, ValueError, AttributeError, TypeError):
            # Not a call this guard can reason about (e.g. an fp8 dtype): aiter decides.
            return original(*args, **kwargs)
        route = route_backward(call)
        if not _tracing_with_dynamo():
            log_route_once("guard", BACKWARD, call, route)
        if route.backend != CK:
            return original(*args, **kwargs)
        return aiter_api.backward(route.function, values)

    functools.update_wrapper(guarded, original)
    try:
        guarded.__signature__ = inspect.signature(original)  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        pass
    setattr(guarded, ORIGINAL_ATTR, original)
    return guarded


def _tracing_with_dynamo() -> bool:
    # Dynamo cannot trace logging calls; AOT tracing (fake tensors) and eager can.
    return bool(torch.compiler.is_dynamo_compiling())


def patch(module: ModuleType) -> bool:
    """Replace ``module._flash_attn_backward`` with the guard, and re-bind aiter's original
    wherever an imported module holds it as a global; False if already guarded."""
    with _lock:
        current = getattr(module, TARGET_ATTR, None)
        if current is None:
            raise AttributeError(
                f"{module.__name__} has no {TARGET_ATTR}; this aiter version is not supported "
                "by rocm.mla_ck_backward's guard"
            )
        held = _scope or patches.current()
        if patches.find(module, TARGET_ATTR, NAME) is not None:
            for p in patches.installed(NAME):  # this job holds them too
                held.patch(p.owner, p.name, p.make, by=NAME)
            return False
        if is_guarded(current):  # guarded by another copy of titan-rocm
            return False
        guarded = held.patch(module, TARGET_ATTR, guarded_backward, by=NAME).value
        _rebind_importers(current, guarded, module, held)
        return True


def _rebind_importers(original: Any, guarded: Any, aiter_module: ModuleType,
                      held: patches.Scope) -> None:
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if module is aiter_module or not isinstance(namespace, dict):
            continue
        for attr, value in list(namespace.items()):
            if value is original:
                held.patch(namespace, attr, lambda _original: guarded, by=NAME)


def rebound() -> list[str]:
    """``module.attribute`` of every global outside aiter the guard re-bound."""
    return [p.where for p in patches.installed(NAME) if isinstance(p.owner, dict)]


def unpatch(module: ModuleType) -> bool:
    """Put aiter's original back wherever it was; False if it was not guarded."""
    with _lock:
        guarded = patches.find(module, TARGET_ATTR, NAME) is not None
        patches.restore(by=NAME)
        return guarded


_hook = AfterImport(TARGET_MODULE, patch)


def install() -> str:
    """Guard aiter's backward now if aiter.ops.mha is loaded, else when it loads; returns what it
    did."""
    global _scope
    _scope = patches.current()
    module = sys.modules.get(TARGET_MODULE)
    if module is not None:
        if not patch(module):
            return "already patched"
        elsewhere = rebound()
        return "patched" + (f"; re-bound in {', '.join(elsewhere)}" if elsewhere else "")
    _hook.arm()
    return f"deferred until {TARGET_MODULE} loads"


def uninstall() -> None:
    """Remove the import hook and any patch, whoever holds it (tests)."""
    global _scope
    _hook.remove()
    _scope = None
    with _lock:
        patches.restore(by=NAME)


def hook_pending() -> bool:
    """The import hook is waiting for aiter.ops.mha."""
    return _hook.waiting
