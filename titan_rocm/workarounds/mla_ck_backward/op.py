"""The MLA flash attention as ``torch.library`` custom ops with autograd, dense and varlen, each
direction calling what :mod:`.routing` picks.

Custom ops are opaque to torch.compile, and op SAC can name the forward ops (:data:`FORWARD_OPS`) to
save."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from titan_rocm import platform
from titan_rocm.workarounds.mla_ck_backward import aiter_api
from titan_rocm.workarounds.mla_ck_backward.aiter_releases import installed_markers
from titan_rocm.workarounds.mla_ck_backward.route_log import log_route_once
from titan_rocm.workarounds.mla_ck_backward.routing import (
    BACKWARD,
    FORWARD,
    AttentionCall,
    Route,
    route_backward,
    route_forward,
)


def attention_call(q: Tensor, k: Tensor, v: Tensor, layout: str, **flags: object) -> AttentionCall:
    """The routing input for these tensors on this platform (real arch, aiter's answer)."""
    facts = platform.current()
    aiter = facts.aiter
    return AttentionCall(
        arch=facts.gfx_arch,
        hdim_q=int(q.shape[-1]),
        hdim_k=int(k.shape[-1]),
        hdim_v=int(v.shape[-1]),
        layout=layout,
        dtype=str(q.dtype),
        aiter_gfx=aiter.gfx if aiter is not None else None,
        aiter_version=aiter.version if aiter is not None else None,
        aiter_markers=installed_markers(facts),
        **flags,  # type: ignore[arg-type]
    )


def _routed(direction: str, call: AttentionCall) -> Route:
    route = route_forward(call) if direction == FORWARD else route_backward(call)
    log_route_once("op", direction, call, route)
    return route


def _forward(layout: str, q: Tensor, k: Tensor, v: Tensor, dropout_p: float,
             softmax_scale: float, causal: bool, deterministic: bool,
             **spans: object) -> tuple[Tensor, Tensor, Tensor]:
    """Either forward op's body; ``deterministic`` is only recorded for the backward."""
    call = attention_call(q, k, v, layout, dropout_p=float(dropout_p), causal=bool(causal),
                          deterministic=bool(deterministic))
    route = _routed(FORWARD, call)
    return aiter_api.forward(route.function, {
        "q": q, "k": k, "v": v, **spans, "dropout_p": float(dropout_p),
        "softmax_scale": float(softmax_scale), "causal": bool(causal),
    })


def _backward_op(layout: str, dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                 softmax_lse: Tensor, rng_state: Tensor, dropout_p: float,
                 softmax_scale: float, causal: bool, deterministic: bool,
                 **spans: object) -> tuple[Tensor, Tensor, Tensor]:
    """Either backward op's body: ``(dq, dk, dv)`` laid out as ``q``, ``k``, ``v``."""
    call = attention_call(q, k, v, layout, dropout_p=float(dropout_p), causal=bool(causal),
                          deterministic=bool(deterministic))
    route = _routed(BACKWARD, call)
    given = (q, k, v)
    if route.contiguous:
        # Before dq/dk/dv are allocated like q/k/v: the gate reads their contiguity too.
        dout, q, k, v, out = (t.contiguous() for t in (dout, q, k, v, out))
    values = {
        "dout": dout, "q": q, "k": k, "v": v, "out": out, "softmax_lse": softmax_lse,
        "dq": torch.empty_like(q), "dk": torch.empty_like(k), "dv": torch.empty_like(v),
        "dropout_p": float(dropout_p), "softmax_scale": float(softmax_scale),
        "causal": bool(causal), "deterministic": bool(deterministic), "rng_state": rng_state,
        **spans,
    }
    aiter_api.backward(route.function, values)
    dq, dk, dv = (_laid_out_like(values[name], t)
                  for name, t in zip(("dq", "dk", "dv"), given, strict=True))
    return dq, dk, dv


def _laid_out_like(grad: Tensor, t: Tensor) -> Tensor:
    """``grad`` with the strides of ``torch.empty_like(t)``, which the fake implementation
    returns (a copy only where a route's contiguous tensors changed them)."""
    strides = torch.empty_like(t, device="meta").stride()
    if grad.stride() == strides:
        return grad
    return torch.empty_like(t).copy_(grad)


def _fake_forward(q: Tensor, v: Tensor, lse_shape: tuple[int, ...]) -> tuple[Tensor, ...]:
    out = q.new_empty((*q.shape[:-1], v.shape[-1]))
    lse = q.new_empty(lse_shape, dtype=torch.float32)
    return out, lse, q.new_empty((2,), dtype=torch.int64)


def _fake_backward(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _autograd(backward_op: Any) -> tuple[Callable[..., Any], Callable[..., None]]:
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, ...]) -> None:
        q, k, v, *rest = inputs
        ctx.save_for_backward(q, k, v, *output, *(x for x in rest if isinstance(x, Tensor)))
        ctx.flags = tuple(x for x in rest if not isinstance(x, Tensor))
        ctx.inputs = len(inputs)

    def backward(ctx: Any, dout: Tensor, _dlse: Tensor, _drng: Tensor) -> tuple[Any, ...]:
        grads = backward_op(dout, *ctx.saved_tensors, *ctx.flags)
        return (*grads, *(None,) * (ctx.inputs - 3))

    return backward, setup_context


# ---- dense (bshd) --------------------------------------------------------------------------


@torch.library.custom_op("titan_rocm::mla_flash_attn_fwd", mutates_args=())
def mla_flash_attn_fwd(q: Tensor, k: Tensor, v: Tensor, dropout_p: float,
                       softmax_scale: float, causal: bool,
                       deterministic: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Routed flash attention forward: ``(out, softmax_lse, rng_state)``."""
    return _forward("bshd", q, k, v, dropout_p, softmax_scale, causal, deterministic)


@mla_flash_attn_fwd.register_fake
def _fwd_fake(q, k, v, dropout_p, softmax_scale, causal, deterministic):
    batch, seqlen_q, heads, _ = q.shape
    return _fake_forward(q, v, (batch, heads, seqlen_q))


@torch.library.custom_op("titan_rocm::mla_flash_attn_bwd", mutates_args=())
def mla_flash_attn_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                       softmax_lse: Tensor, rng_state: Tensor, dropout_p: float,
                       softmax_scale: float, causal: bool,
                       deterministic: bool) -> tuple[Tensor, Tensor, Tensor]:
    """The routed backward: ``(dq, dk, dv)`` with the shapes of ``q``, ``k``, ``v``."""
    return _backward_op("bshd", dout, q, k, v, out, softmax_lse, rng_state, dropout_p,
                        softmax_scale, causal, deterministic)


@mla_flash_attn_bwd.register_fake
def _bwd_fake(dout, q, k, v, out, softmax_lse, rng_state, dropout_p, softmax_scale, causal,
              deterministic):
    return _fake_backward(q, k, v)


# ---- varlen (thd) --------------------------------------------------------------------------


@torch.library.custom_op("titan_rocm::mla_varlen_attn_fwd", mutates_args=())
def mla_varlen_attn_fwd(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor,
                        cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int,
                        dropout_p: float, softmax_scale: float, causal: bool,
                        deterministic: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Routed varlen forward over ``thd`` tensors: ``(out, softmax_lse (heads, total), rng)``."""
    return _forward("thd", q, k, v, dropout_p, softmax_scale, causal, deterministic,
                    **_spans(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k))


def _spans(cu_q: Tensor, cu_k: Tensor, max_q: int, max_k: int) -> dict[str, object]:
    return {"cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k, "max_seqlen_q": int(max_q),
            "max_seqlen_k": int(max_k)}


@mla_varlen_attn_fwd.register_fake
def _varlen_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                     softmax_scale, causal, deterministic):
    total, heads, _ = q.shape
    return _fake_forward(q, v, (heads, total))


@torch.library.custom_op("titan_rocm::mla_varlen_attn_bwd", mutates_args=())
def mla_varlen_attn_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                        softmax_lse: Tensor, rng_state: Tensor, cu_seqlens_q: Tensor,
                        cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int,
                        dropout_p: float, softmax_scale: float, causal: bool,
                        deterministic: bool) -> tuple[Tensor, Tensor, Tensor]:
    """The routed varlen backward: ``(dq, dk, dv)`` with the shapes of ``q``, ``k``, ``v``."""
    return _backward_op("thd", dout, q, k, v, out, softmax_lse, rng_state, dropout_p,
                        softmax_scale, causal, deterministic,
                        **_spans(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k))


@mla_varlen_attn_bwd.register_fake
def _varlen_bwd_fake(dout, q, k, v, out, softmax_lse, rng_state, cu_seqlens_q, cu_seqlens_k,
                     max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal, deterministic):
    return _fake_backward(q, k, v)


for _fwd, _bwd in ((mla_flash_attn_fwd, mla_flash_attn_bwd),
                   (mla_varlen_attn_fwd, mla_varlen_attn_bwd)):
    _backward_fn, _setup = _autograd(_bwd)
    _fwd.register_autograd(_backward_fn, setup_context=_setup)

FORWARD_OP = torch.ops.titan_rocm.mla_flash_attn_fwd.default
"""The dense forward OpOverload."""
BACKWARD_OP = torch.ops.titan_rocm.mla_flash_attn_bwd.default
VARLEN_FORWARD_OP = torch.ops.titan_rocm.mla_varlen_attn_fwd.default
"""The varlen forward OpOverload."""
VARLEN_BACKWARD_OP = torch.ops.titan_rocm.mla_varlen_attn_bwd.default
FORWARD_OPS = (FORWARD_OP, VARLEN_FORWARD_OP)
"""The forward OpOverloads, for op-level SAC save lists."""


def mla_flash_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    softmax_scale: float,
    causal: bool = True,
    dropout_p: float = 0.0,
) -> Tensor:
    """Flash attention over ``bshd`` tensors, both directions routed; returns ``out``."""
    out, _lse, _rng = torch.ops.titan_rocm.mla_flash_attn_fwd(
        q, k, v, float(dropout_p), float(softmax_scale), bool(causal),
        torch.are_deterministic_algorithms_enabled(),
    )
    return out


def mla_varlen_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens: Tensor,
    max_seqlen: int,
    softmax_scale: float,
    causal: bool = True,
    dropout_p: float = 0.0,
) -> Tensor:
    """Attention within each packed sequence of ``thd`` tensors (``cu_seqlens``: int32 starts,
    then the total); both directions routed; returns ``out`` (total, heads, v head dim)."""
    out, _lse, _rng = torch.ops.titan_rocm.mla_varlen_attn_fwd(
        q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, float(dropout_p),
        float(softmax_scale), bool(causal), torch.are_deterministic_algorithms_enabled(),
    )
    return out
