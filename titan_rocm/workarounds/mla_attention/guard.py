"""Route other callers of aiter's ``_flash_attn_backward`` the same way.

Code that uses aiter's flash attention directly (``aiter.flash_attn_func``, Primus-Turbo's
aiter backend) reaches ``aiter.ops.mha._flash_attn_backward``, which ``FlashAttnFunc``
looks up as a module global at backward time. :func:`install` replaces that global with a
wrapper taking the same parameters: for calls that :func:`~.routing.route_backward` sends
to CK it calls ``mha_bwd`` itself (into the caller's ``dq``/``dk``/``dv``, returning
``softmax_d`` as aiter does); every other call goes to aiter's original unchanged.

aiter is never imported here: if ``aiter.ops.mha`` is already loaded it is patched now,
otherwise a one-shot import hook patches it right after it first loads, before anyone can
``from aiter.ops.mha import _flash_attn_backward``. Callers that bound the name earlier, or
that call ``torch.ops.aiter._flash_attn_backward`` directly, are not covered.
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from titan_rocm import platform
from titan_rocm._after_import import AfterImport
from titan_rocm.workarounds.mla_attention import aiter_api
from titan_rocm.workarounds.mla_attention.route_log import log_route_once
from titan_rocm.workarounds.mla_attention.routing import CK, BackwardCall, route_backward

TARGET_MODULE = aiter_api.MHA_MODULE
TARGET_ATTR = "_flash_attn_backward"
ORIGINAL_ATTR = "__titan_rocm_original__"

_lock = threading.Lock()


def is_guarded(fn: Any) -> bool:
    """``fn`` is a titan-rocm guard wrapper."""
    return hasattr(fn, ORIGINAL_ATTR)


def guarded_backward(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap aiter's ``_flash_attn_backward`` so this shape on gfx942 goes to CK."""
    params = aiter_api.parameters(original, TARGET_ATTR)
    if params:
        names = [name for name, _ in params]
    else:
        names = list(aiter_api.CANONICAL_PARAMETERS[TARGET_ATTR])

    def guarded(*args: Any, **kwargs: Any) -> Any:
        if len(args) > len(names):
            return original(*args, **kwargs)
        values = dict(zip(names, args, strict=False))  # fewer args: defaults
        values.update(kwargs)
        try:
            q, k, v = values["q"], values["k"], values["v"]
            call = BackwardCall(
                arch=platform.current().gfx_arch,
                hdim_q=int(q.shape[-1]),
                hdim_k=int(k.shape[-1]),
                hdim_v=int(v.shape[-1]),
                dropout_p=float(values.get("dropout_p", 0.0)),
                has_bias=values.get("bias") is not None,
                has_alibi=values.get("alibi_slopes") is not None,
                layout="bshd",
                dtype=str(q.dtype),
                deterministic=bool(values.get("deterministic", False)),
            )
        except (KeyError, ValueError, AttributeError, TypeError):
            # Not a call this guard can reason about (e.g. an fp8 dtype): aiter decides.
            return original(*args, **kwargs)
        route = route_backward(call)
        if not _tracing_with_dynamo():
            log_route_once("guard", call, route)
        if route.backend != CK:
            return original(*args, **kwargs)
        return aiter_api.ck_backward(values)

    functools.update_wrapper(guarded, original)
    try:
        guarded.__signature__ = inspect.signature(original)  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        pass
    setattr(guarded, ORIGINAL_ATTR, original)
    return guarded


def _tracing_with_dynamo() -> bool:
    # Dynamo cannot trace logging calls; AOT tracing (fake tensors) and eager can.
    try:
        import torch

        return bool(torch.compiler.is_dynamo_compiling())
    except (ImportError, AttributeError):
        return False


def patch(module: ModuleType) -> bool:
    """Replace ``module._flash_attn_backward`` with the guard; False if already guarded."""
    with _lock:
        current = getattr(module, TARGET_ATTR, None)
        if current is None:
            raise AttributeError(
                f"{module.__name__} has no {TARGET_ATTR}; this aiter version is not supported "
                "by rocm.mla_ck_backward's guard"
            )
        if is_guarded(current):
            return False
        setattr(module, TARGET_ATTR, guarded_backward(current))
        return True


def unpatch(module: ModuleType) -> bool:
    """Put aiter's original back; False if it was not guarded."""
    with _lock:
        current = getattr(module, TARGET_ATTR, None)
        if not is_guarded(current):
            return False
        setattr(module, TARGET_ATTR, getattr(current, ORIGINAL_ATTR))
        return True


_hook = AfterImport(TARGET_MODULE, patch)


def install() -> str:
    """Guard aiter's backward now if aiter.ops.mha is loaded, else when it loads.

    Returns ``"patched"``, ``"already patched"`` or ``"deferred until aiter.ops.mha loads"``.
    """
    module = sys.modules.get(TARGET_MODULE)
    if module is not None:
        return "patched" if patch(module) else "already patched"
    _hook.arm()
    return f"deferred until {TARGET_MODULE} loads"


def uninstall() -> None:
    """Remove the import hook and any patch (tests)."""
    _hook.remove()
    module = sys.modules.get(TARGET_MODULE)
    if module is not None:
        unpatch(module)


def hook_pending() -> bool:
    """The import hook is waiting for aiter.ops.mha."""
    return _hook.waiting
