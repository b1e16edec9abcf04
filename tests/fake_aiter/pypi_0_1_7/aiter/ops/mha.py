"""Fake ``aiter.ops.mha`` of PyPI amd-aiter 0.1.7.post2.dev18 (= tag v0.1.7.post2, 169acef).

Names, parameter lists, wrapper shapes and dispatch gates as in that release's
``aiter/ops/mha.py``: kernels are ``@compile_ops`` declarations (``torch.ops.aiter`` ops behind
``(*args, **kwargs)`` wrappers); ``_flash_attn_backward`` is a ``@torch_compile_guard`` wrapper
with every tensor marked mutated; ``_flash_attn_forward`` and the varlen dispatchers are plain
functions. Gates (read in that file):

- ``_flash_attn_forward``: fmha_v3 for ``hdim_v == 128`` and ``hdim_q == 128`` or
  (``get_gfx() == "gfx950"`` and ``hdim_q == 192``), bf16, no dropout/bias/alibi/window,
  no ``cu_seqlens``, and ``seqlen_q > 128``; else CK ``mha_fwd``.
- ``can_impl_fmha_v3_bwd``: ``get_gfx() == "gfx942"``, ``hdim_q == hdim_v``, 64..192, no
  dropout/bias/alibi, not deterministic, and one of the stride cases (modelled: ``psskddv``/
  ``pssk`` with fp32 atomics; ``np``/``pddv`` need ``seqlen_q == seqlen_k``, a multiple of 64).
- ``_flash_attn_backward``'s gfx950 closure: ``64 < hdim_q <= 128``, or ``hdim_q == 192`` and
  ``hdim_v == 128`` **without a mask** (``nmask``); fmha_v3 when either accepts and
  ``seqlen_q > 16``; else CK ``mha_bwd``.
- ``_flash_attn_varlen_forward``: the forward gate without a seqlen threshold (and no padded
  ``cu_seqlens``); ``_flash_attn_varlen_backward``: ``hdim_q == hdim_v`` on gfx942 and gfx950.

``can_impl_fmha_v3_bwd`` and the varlen backward's gates are the same in both releases and live
in ``fake_aiter_support``; this module imports them under aiter's names.
"""

from __future__ import annotations

import torch
from fake_aiter_support import (
    can_impl_fmha_v3_bwd,
    compile_ops,
    make_kernel,
    maybe_contiguous,
    sliding_window,
    varlen_v3_backward,
)
from torch import Generator, Tensor

from aiter.jit.utils.chip_info import get_gfx
from aiter.jit.utils.torch_guard import torch_compile_guard

_kernel = make_kernel("0.1.7")


@compile_ops(_kernel)
def mha_fwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    dropout_p: float,
    softmax_scale: float,
    is_causal: bool,
    window_size_left: int,
    window_size_right: int,
    return_softmax_lse: bool,
    return_dropout_randval: bool,
    cu_seqlens_q: Tensor | None = None,
    cu_seqlens_kv: Tensor | None = None,
    out: Tensor | None = None,
    bias: Tensor | None = None,
    alibi_slopes: Tensor | None = None,
    gen: Generator | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]: ...


@compile_ops(_kernel)
def fmha_v3_fwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    dropout_p: float,
    softmax_scale: float,
    is_causal: bool,
    window_size_left: int,
    window_size_right: int,
    return_softmax_lse: bool,
    return_dropout_randval: bool,
    how_v3_bf16_cvt: int,
    out: Tensor | None = None,
    bias: Tensor | None = None,
    alibi_slopes: Tensor | None = None,
    gen: Generator | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]: ...


@compile_ops(_kernel)
def mha_varlen_fwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor | None,
    max_seqlen_q: int,
    max_seqlen_k: int,
    min_seqlen_q: int,
    dropout_p: float,
    softmax_scale: float,
    logits_soft_cap: float,
    zero_tensors: bool,
    is_causal: bool,
    window_size_left: int,
    window_size_right: int,
    return_softmax_lse: bool,
    return_dropout_randval: bool,
    out: Tensor | None = None,
    block_table: Tensor | None = None,
    bias: Tensor | None = None,
    alibi_slopes: Tensor | None = None,
    gen: Generator | None = None,
    cu_seqlens_q_padded: Tensor | None = None,
    cu_seqlens_k_padded: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]: ...


@compile_ops(_kernel)
def fmha_v3_varlen_fwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor | None,
    max_seqlen_q: int,
    max_seqlen_k: int,
    min_seqlen_q: int,
    dropout_p: float,
    softmax_scale: float,
    logits_soft_cap: float,
    zero_tensors: bool,
    is_causal: bool,
    window_size_left: int,
    window_size_right: int,
    return_softmax_lse: bool,
    return_dropout_randval: bool,
    how_v3_bf16_cvt: int,
    out: Tensor | None = None,
    block_table: Tensor | None = None,
    bias: Tensor | None = None,
    alibi_slopes: Tensor | None = None,
    gen: Generator | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]: ...


@compile_ops(_kernel)
def mha_bwd(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    softmax_lse: Tensor,
    dropout_p: float,
    softmax_scale: float,
    is_causal: bool,
    window_size_left: int,
    window_size_right: int,
    deterministic: bool,
    dq: Tensor | None = None,
    dk: Tensor | None = None,
    dv: Tensor | None = None,
    dbias: Tensor | None = None,
    bias: Tensor | None = None,
    alibi_slopes: Tensor | None = None,
    rng_state: Tensor | None = None,
    gen: Generator | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]: ...


@compile_ops(_kernel)
def fmha_v3_bwd(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    softmax_lse: Tensor,
    dropout_p: float,
    softmax_scale: float,
    is_causal: bool,
    window_size_left: int,
    window_size_right: int,
    deterministic: bool,
    is_v3_atomic_fp32: bool,
    how_v3_bf16_cvt: int,
    dq: Tensor | None = None,
    dk: Tensor | None = None,
    dv: Tensor | None = None,
    alibi_slopes: Tensor | None = None,
    rng_state: Tensor | None = None,
    gen: Generator | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]: ...


@compile_ops(_kernel)
def mha_varlen_bwd(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    softmax_lse: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float,
    softmax_scale: float,
    zero_tensors: bool,
    is_causal: bool,
    window_size_left: int,
    window_size_right: int,
    deterministic: bool,
    dq: Tensor | None = None,
    dk: Tensor | None = None,
    dv: Tensor | None = None,
    alibi_slopes: Tensor | None = None,
    rng_state: Tensor | None = None,
    gen: Generator | None = None,
    cu_seqlens_q_padded: Tensor | None = None,
    cu_seqlens_k_padded: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]: ...


@compile_ops(_kernel)
def fmha_v3_varlen_bwd(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    softmax_lse: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float,
    softmax_scale: float,
    zero_tensors: bool,
    is_causal: bool,
    window_size_left: int,
    window_size_right: int,
    deterministic: bool,
    is_v3_atomic_fp32: bool,
    how_v3_bf16_cvt: int,
    dq: Tensor | None = None,
    dk: Tensor | None = None,
    dv: Tensor | None = None,
    alibi_slopes: Tensor | None = None,
    rng_state: Tensor | None = None,
    gen: Generator | None = None,
    cu_seqlens_q_padded: Tensor | None = None,
    cu_seqlens_k_padded: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]: ...


def _v3_forward_ok(q, v, dropout_p, bias, alibi_slopes, swa) -> bool:
    hdim_q, hdim_v = q.shape[-1], v.shape[-1]
    return (alibi_slopes is None and bias is None and dropout_p == 0.0 and hdim_v == 128
            and (hdim_q == 128 or (get_gfx() == "gfx950" and hdim_q == 192))
            and q.shape[-2] % v.shape[-2] == 0 and not swa and q.dtype == torch.bfloat16)


def _flash_attn_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    dropout_p: float,
    softmax_scale: float,
    causal: bool,
    window_size_left: int,
    window_size_right: int,
    bias: Tensor | None,
    alibi_slopes: Tensor | None,
    return_lse: bool,
    return_softmax: bool,
    how_v3_bf16_cvt: int | None = 1,
    cu_seqlens_q: Tensor | None = None,
    cu_seqlens_kv: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    seqlen_q, seqlen_k = q.shape[1], v.shape[1]
    left = -1 if window_size_left >= seqlen_k else window_size_left
    right = -1 if window_size_right >= seqlen_k else window_size_right
    v3 = (_v3_forward_ok(q, v, dropout_p, bias, alibi_slopes, sliding_window(left, right))
          and cu_seqlens_q is None and cu_seqlens_kv is None)
    q, k, v = [maybe_contiguous(x) for x in (q, k, v)]
    if v3 and seqlen_q > 128:  # aiter: prefer CK for decode cases
        return fmha_v3_fwd(q, k, v, dropout_p, softmax_scale, causal, left, right, return_lse,
                           return_softmax, how_v3_bf16_cvt, None, bias, alibi_slopes, None)
    return mha_fwd(q, k, v, dropout_p, softmax_scale, causal, left, right, return_lse,
                   return_softmax, cu_seqlens_q, cu_seqlens_kv, None, bias, alibi_slopes, None)


def _flash_attn_backward_fake(dout: Tensor, q: Tensor, *args, **kwargs) -> Tensor:
    batch, seqlen_q, heads, _ = q.shape
    return torch.empty((batch, heads, seqlen_q), dtype=torch.float32, device=q.device)


@torch_compile_guard(gen_fake=_flash_attn_backward_fake)
def _flash_attn_backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    softmax_lse: Tensor,
    dq: Tensor | None,
    dk: Tensor | None,
    dv: Tensor | None,
    dbias: Tensor | None,
    dropout_p: float,
    softmax_scale: float,
    causal: bool,
    window_size_left: int,
    window_size_right: int,
    bias: Tensor | None,
    alibi_slopes: Tensor | None,
    deterministic: bool,
    rng_state: Tensor | None = None,
    is_v3_atomic_fp32: bool | None = True,
    how_v3_bf16_cvt: int | None = 1,
) -> Tensor:
    can_v3 = can_impl_fmha_v3_bwd(dout, q, k, v, dk, dv, dbias, dropout_p, causal,
                                  window_size_left, window_size_right, bias, alibi_slopes,
                                  deterministic, is_v3_atomic_fp32)
    dout, q, k, v, out = [maybe_contiguous(x) for x in (dout, q, k, v, out)]
    _, seqlen_q, nhead_q, hdim_q = q.shape
    _, seqlen_k, nhead_k, hdim_v = v.shape
    nmask = not causal and window_size_left == -1 and window_size_right == -1
    swa = sliding_window(window_size_left, window_size_right)
    one_block = get_gfx() == "gfx950" and seqlen_k <= 256 and 64 < hdim_q <= 128 and not swa
    gfx950 = (
        get_gfx() == "gfx950" and alibi_slopes is None and bias is None and dbias is None
        and dropout_p == 0.0 and (not deterministic or one_block) and nhead_q % nhead_k == 0
        and ((64 < hdim_q <= 128) or (hdim_q == 192 and hdim_v == 128 and nmask))
        and hdim_q % 8 == 0
    )
    if (can_v3 or gfx950) and seqlen_q > 16:  # aiter: CK is better for seqlen_q <= 16
        _, _, _, softmax_d = fmha_v3_bwd(
            dout, q, k, v, out, softmax_lse, dropout_p, softmax_scale, causal, window_size_left,
            window_size_right, False if one_block else deterministic,
            False if one_block else is_v3_atomic_fp32, how_v3_bf16_cvt, dq, dk, dv,
            alibi_slopes, rng_state, None)
    else:
        _, _, _, softmax_d = mha_bwd(
            dout, q, k, v, out, softmax_lse, dropout_p, softmax_scale, causal, window_size_left,
            window_size_right, deterministic, dq, dk, dv, dbias, bias, alibi_slopes, rng_state,
            None)
    return softmax_d


class FlashAttnFunc(torch.autograd.Function):
    """aiter's autograd function, head dims already multiples of 8 (no padding modelled)."""

    @staticmethod
    def forward(ctx, q, k, v, dropout_p, softmax_scale, causal, window_size, bias, alibi_slopes,
                deterministic, return_lse, return_softmax, is_grad_enabled,
                is_v3_atomic_fp32=True, how_v3_bf16_cvt=1, cu_seqlens_q=None,
                cu_seqlens_kv=None):
        if softmax_scale is None:
            softmax_scale = q.shape[-1] ** (-0.5)
        out, softmax_lse, s_dmask, rng_state = _flash_attn_forward(
            q, k, v, dropout_p, softmax_scale, causal=causal,
            window_size_left=int(window_size[0]), window_size_right=int(window_size[1]),
            bias=bias, alibi_slopes=alibi_slopes, return_lse=return_lse,
            return_softmax=return_softmax and dropout_p > 0, how_v3_bf16_cvt=how_v3_bf16_cvt,
            cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv)
        ctx.save_for_backward(q, k, v, out, softmax_lse, rng_state)
        ctx.args = (dropout_p, softmax_scale, causal, window_size, bias, alibi_slopes,
                    deterministic, is_v3_atomic_fp32, how_v3_bf16_cvt)
        return (out, softmax_lse) if return_lse else out

    @staticmethod
    def backward(ctx, dout, *args):
        q, k, v, out, softmax_lse, rng_state = ctx.saved_tensors
        (dropout_p, softmax_scale, causal, window_size, bias, alibi_slopes, deterministic,
         atomic_fp32, bf16_cvt) = ctx.args
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        # Looked up as a module global at call time, as in aiter: the guard can replace it.
        _flash_attn_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, None, dropout_p,
                             softmax_scale, causal, int(window_size[0]), int(window_size[1]),
                             bias, alibi_slopes, deterministic, rng_state, atomic_fp32,
                             bf16_cvt)
        return (dq, dk, dv) + (None,) * 14


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), bias=None, alibi_slopes=None, deterministic=True,
                    return_lse=False, return_attn_probs=False, how_v3_bf16_cvt=1,
                    cu_seqlens_q: Tensor | None = None,
                    cu_seqlens_kv: Tensor | None = None):
    return FlashAttnFunc.apply(q, k, v, dropout_p, softmax_scale, causal, window_size, bias,
                               alibi_slopes, deterministic, return_lse, return_attn_probs,
                               torch.is_grad_enabled(), True, how_v3_bf16_cvt, cu_seqlens_q,
                               cu_seqlens_kv)


def _flash_attn_varlen_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    cu_seqlens_q_padded: Tensor | None,
    cu_seqlens_k_padded: Tensor | None,
    max_seqlen_q: int,
    max_seqlen_k: int,
    min_seqlen_q: int,
    dropout_p: float,
    softmax_scale: float,
    causal: bool,
    logits_soft_cap: float = 0.0,
    window_size_left: int = -1,
    window_size_right: int = -1,
    bias: Tensor | None = None,
    alibi_slopes: Tensor | None = None,
    return_lse: bool = False,
    return_softmax: bool = False,
    how_v3_bf16_cvt: int | None = 1,
    block_table: Tensor | None = None,
    out: Tensor | None = None,
    zero_tensors: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    left = -1 if window_size_left >= max_seqlen_k else window_size_left
    right = -1 if window_size_right >= max_seqlen_k else window_size_right
    v3 = (_v3_forward_ok(q, v, dropout_p, bias, alibi_slopes, sliding_window(left, right))
          and cu_seqlens_q_padded is None and cu_seqlens_k_padded is None)
    q, k, v = [maybe_contiguous(x) for x in (q, k, v)]
    if v3:
        return fmha_v3_varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                  min_seqlen_q, dropout_p, softmax_scale, logits_soft_cap,
                                  zero_tensors, causal, left, right, return_lse, return_softmax,
                                  how_v3_bf16_cvt, out, block_table, bias, alibi_slopes, None)
    return mha_varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                          min_seqlen_q, dropout_p, softmax_scale, logits_soft_cap, zero_tensors,
                          causal, left, right, return_lse, return_softmax, out=out,
                          block_table=block_table, bias=bias, alibi_slopes=alibi_slopes,
                          gen=None, cu_seqlens_q_padded=cu_seqlens_q_padded,
                          cu_seqlens_k_padded=cu_seqlens_k_padded)


def _flash_attn_varlen_backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    softmax_lse: Tensor,
    dq: Tensor | None,
    dk: Tensor | None,
    dv: Tensor | None,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float,
    softmax_scale: float,
    causal: bool,
    window_size_left: int,
    window_size_right: int,
    alibi_slopes: Tensor | None,
    deterministic: bool,
    rng_state: Tensor | None = None,
    is_v3_atomic_fp32: bool | None = True,
    how_v3_bf16_cvt: int | None = 1,
    zero_tensors: bool = False,
    cu_seqlens_q_padded: Tensor | None = None,
    cu_seqlens_k_padded: Tensor | None = None,
) -> Tensor:
    left = -1 if window_size_left >= max_seqlen_k else window_size_left
    right = -1 if window_size_right >= max_seqlen_k else window_size_right
    v3 = varlen_v3_backward(q, v, dropout_p, deterministic, alibi_slopes, left, right,
                            is_v3_atomic_fp32)
    dout, q, k, v, out = [maybe_contiguous(x) for x in (dout, q, k, v, out)]
    kernel = fmha_v3_varlen_bwd if v3 else mha_varlen_bwd
    extra = (is_v3_atomic_fp32, how_v3_bf16_cvt) if v3 else ()
    _, _, _, softmax_d = kernel(
        dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
        dropout_p, softmax_scale, zero_tensors, causal, left, right, deterministic, *extra, dq,
        dk, dv, alibi_slopes, rng_state, None, cu_seqlens_q_padded, cu_seqlens_k_padded)
    return softmax_d
