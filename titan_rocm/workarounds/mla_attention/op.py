"""The MLA flash attention as two ``torch.library`` custom ops with autograd.

``titan_rocm::mla_flash_attn_fwd`` runs aiter's flash attention forward;
``titan_rocm::mla_flash_attn_bwd`` runs the backward that :func:`~.routing.route_backward`
picks for each call: aiter's CK ``mha_bwd`` directly (v never padded) or aiter's own
``_flash_attn_backward``. Being custom ops with fake (meta) implementations, both are opaque
nodes to torch.compile, and selective activation checkpointing can name the forward op
(:data:`FORWARD_OP`) to save its outputs instead of recomputing it.

Tensors are ``bshd`` (batch, seqlen, heads, head dim), aiter's layout.
"""

from __future__ import annotations

import torch
from torch import Tensor

from titan_rocm import platform
from titan_rocm.workarounds.mla_attention import aiter_api
from titan_rocm.workarounds.mla_attention.route_log import log_route_once
from titan_rocm.workarounds.mla_attention.routing import CK, BackwardCall, route_backward


@torch.library.custom_op("titan_rocm::mla_flash_attn_fwd", mutates_args=())
def mla_flash_attn_fwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    dropout_p: float,
    softmax_scale: float,
    causal: bool,
    deterministic: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """aiter flash attention forward: ``(out, softmax_lse, rng_state)``.

    ``deterministic`` is only recorded for the backward (the forward is deterministic).
    """
    del deterministic
    return aiter_api.flash_forward(q, k, v, dropout_p, softmax_scale, causal)


@mla_flash_attn_fwd.register_fake
def _fwd_fake(q, k, v, dropout_p, softmax_scale, causal, deterministic):
    batch, seqlen_q, heads, _ = q.shape
    out = q.new_empty((batch, seqlen_q, heads, v.shape[-1]))
    lse = q.new_empty((batch, heads, seqlen_q), dtype=torch.float32)
    rng_state = q.new_empty((2,), dtype=torch.int64)
    return out, lse, rng_state


def backward_call(q: Tensor, k: Tensor, v: Tensor, **flags: object) -> BackwardCall:
    """The routing input for a batch-mode (``bshd``) backward of these tensors."""
    return BackwardCall(
        arch=platform.current().gfx_arch,
        hdim_q=int(q.shape[-1]),
        hdim_k=int(k.shape[-1]),
        hdim_v=int(v.shape[-1]),
        layout="bshd",
        dtype=str(q.dtype),
        **flags,  # type: ignore[arg-type]
    )


@torch.library.custom_op("titan_rocm::mla_flash_attn_bwd", mutates_args=())
def mla_flash_attn_bwd(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    softmax_lse: Tensor,
    rng_state: Tensor,
    dropout_p: float,
    softmax_scale: float,
    causal: bool,
    deterministic: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """The routed backward: ``(dq, dk, dv)`` with the shapes of ``q``, ``k``, ``v``."""
    call = backward_call(q, k, v, dropout_p=float(dropout_p), deterministic=bool(deterministic))
    route = route_backward(call)
    log_route_once("op", call, route)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    values = {
        "dout": dout,
        "q": q,
        "k": k,
        "v": v,
        "out": out,
        "softmax_lse": softmax_lse,
        "dq": dq,
        "dk": dk,
        "dv": dv,
        "dropout_p": float(dropout_p),
        "softmax_scale": float(softmax_scale),
        "causal": bool(causal),
        "deterministic": bool(deterministic),
        "rng_state": rng_state,
    }
    if route.backend == CK:
        aiter_api.ck_backward(values)
    else:
        aiter_api.aiter_backward(values)
    return dq, dk, dv


@mla_flash_attn_bwd.register_fake
def _bwd_fake(dout, q, k, v, out, softmax_lse, rng_state, dropout_p, softmax_scale, causal,
              deterministic):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, dropout_p, softmax_scale, causal, deterministic = inputs
    out, softmax_lse, rng_state = output
    ctx.save_for_backward(q, k, v, out, softmax_lse, rng_state)
    ctx.dropout_p = dropout_p
    ctx.softmax_scale = softmax_scale
    ctx.causal = causal
    ctx.deterministic = deterministic


def _backward(ctx, dout, _dlse, _drng):
    q, k, v, out, softmax_lse, rng_state = ctx.saved_tensors
    dq, dk, dv = mla_flash_attn_bwd(
        dout,
        q,
        k,
        v,
        out,
        softmax_lse,
        rng_state,
        ctx.dropout_p,
        ctx.softmax_scale,
        ctx.causal,
        ctx.deterministic,
    )
    return dq, dk, dv, None, None, None, None


mla_flash_attn_fwd.register_autograd(_backward, setup_context=_setup_context)

FORWARD_OP = torch.ops.titan_rocm.mla_flash_attn_fwd.default
"""The forward OpOverload, for op-level SAC save lists."""
BACKWARD_OP = torch.ops.titan_rocm.mla_flash_attn_bwd.default


def mla_flash_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    softmax_scale: float,
    causal: bool = True,
    dropout_p: float = 0.0,
) -> Tensor:
    """Flash attention over ``bshd`` tensors with the routed backward; returns ``out``."""
    out, _lse, _rng = torch.ops.titan_rocm.mla_flash_attn_fwd(
        q,
        k,
        v,
        float(dropout_p),
        float(softmax_scale),
        bool(causal),
        torch.are_deterministic_algorithms_enabled(),
    )
    return out
