"""Fake ``aiter.ops.mha`` of aiter main: ROCm/aiter e4048607 (2026-08-22), and in the ``main``
generation also ROCm/aiter#4875, merged after it (the ``e4048607`` generation is this module
without it: ``_FLYDSL_VARLEN_BACKWARD``, from ``aiter._fake.CHOICE``).

Names, parameter lists, wrapper shapes and dispatch gates as in e4048607's
``aiter/ops/mha.py``. Against PyPI 0.1.7 (``../pypi_0_1_7``): the kernels and
``_flash_attn_forward`` take ``sink_size``, fp8 descales and ``sink_ptr`` (from v0.1.8), the
backwards ``sink``/``d_sink`` (from v0.1.12); ``_flash_attn_backward`` marks only
``dq``/``dk``/``dv`` mutated (from v0.1.9.post1). Gates (read in that file):

- ``_flash_attn_forward`` (``can_impl_fmha_v3_fwd``): ``get_gfx() in ("gfx942", "gfx950")``,
  q/k 128 with v 128 or q/k 192 with v 128, bf16, no dropout/bias/alibi/window/cu_seqlens, and
  ``seqlen_q > 128``; else CK ``mha_fwd``. Earlier branches (gfx942 native hdim 64, gfx950
  OPUS for calls without lse, gfx1250 ASM) are not modelled: a call they would take raises.
- ``can_impl_fmha_v3_bwd``: as 0.1.7 (gfx942 needs ``hdim_q == hdim_v``).
- ``_flash_attn_backward``'s gfx950 closure: ``64 < hdim_q <= 128`` or q/k 192 with v 128
  (causal too, since v0.1.11), no window; fmha_v3 when accepted and ``seqlen_q > 16``.
- ``_flash_attn_varlen_forward``: the forward gate without a seqlen threshold, and
  ``logits_soft_cap == 0``; ``_flash_attn_varlen_backward``: ``hdim_q == hdim_v`` everywhere.
- ``main`` only, #4875 (``can_impl_fmha_bwd_flydsl`` in ``_flash_attn_varlen_backward``, read at
  the PR head 90efdcb4): before both fmha_v3 gates, ``get_gfx() == "gfx942"``, q/k 192 with
  v 128, causal, self-attention (one ``cu_seqlens`` tensor for q and k, equal max lengths), no
  GQA/dropout/alibi/window/sink/padded ``cu_seqlens``, bf16 and contiguous, and FlyDSL installed
  send the call to ``flydsl_flash_attn_varlen_bwd``; ``deterministic`` is not read.

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

from aiter._fake import CHOICE
from aiter.jit.utils.chip_info import get_gfx
from aiter.jit.utils.torch_guard import torch_compile_guard

_kernel = make_kernel("main")
_FLYDSL_VARLEN_BACKWARD = CHOICE == "main"
"""ROCm/aiter#4875 is in this aiter (not in e4048607)."""


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
    sink_size: int,
    return_softmax_lse: bool,
    return_dropout_randval: bool,
    cu_seqlens_q: Tensor | None = None,
    cu_seqlens_kv: Tensor | None = None,
    out: Tensor | None = None,
    bias: Tensor | None = None,
    alibi_slopes: Tensor | None = None,
    q_descale: Tensor | None = None,
    k_descale: Tensor | None = None,
    v_descale: Tensor | None = None,
    sink_ptr: Tensor | None = None,
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
    q_descale: Tensor | None = None,
    k_descale: Tensor | None = None,
    v_descale: Tensor | None = None,
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
    sink_size: int,
    return_softmax_lse: bool,
    return_dropout_randval: bool,
    out: Tensor | None = None,
    block_table: Tensor | None = None,
    bias: Tensor | None = None,
    alibi_slopes: Tensor | None = None,
    q_descale: Tensor | None = None,
    k_descale: Tensor | None = None,
    v_descale: Tensor | None = None,
    gen: Generator | None = None,
    cu_seqlens_q_padded: Tensor | None = None,
    cu_seqlens_k_padded: Tensor | None = None,
    sink_ptr: Tensor | None = None,
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
    q_descale: Tensor | None = None,
    k_descale: Tensor | None = None,
    v_descale: Tensor | None = None,
    gen: Generator | None = None,
    cu_seqlens_q_padded: Tensor | None = None,
    cu_seqlens_k_padded: Tensor | None = None,
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
    sink: Tensor | None = None,
    d_sink: Tensor | None = None,
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
    sink: Tensor | None = None,
    d_sink: Tensor | None = None,
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
    return (get_gfx() in ("gfx942", "gfx950") and alibi_slopes is None and bias is None
            and dropout_p == 0.0 and hdim_v == 128 and hdim_q in (128, 192)
            and q.shape[-2] % v.shape[-2] == 0 and not swa and q.dtype == torch.bfloat16)


def _unmodelled(q, v, return_lse: bool) -> None:
    # Branches main takes before fmha_v3: gfx942's native hdim-64 forward, gfx950's OPUS
    # forward (only for calls without lse), gfx1250's ASM. The fake does not model them.
    hdim_q, hdim_v = q.shape[-1], v.shape[-1]
    if ((get_gfx() == "gfx942" and hdim_q == hdim_v == 64)
            or (get_gfx() == "gfx950" and not return_lse and q.dtype == torch.bfloat16)
            or get_gfx() == "gfx1250"):
        raise NotImplementedError("fake aiter main: this forward branch is not modelled")


def _flash_attn_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    dropout_p: float,
    softmax_scale: float,
    causal: bool,
    window_size_left: int,
    window_size_right: int,
    sink_size: int,
    bias: Tensor | None,
    alibi_slopes: Tensor | None,
    q_descale: Tensor | None,
    k_descale: Tensor | None,
    v_descale: Tensor | None,
    return_lse: bool,
    return_softmax: bool,
    how_v3_bf16_cvt: int | None = 1,
    cu_seqlens_q: Tensor | None = None,
    cu_seqlens_kv: Tensor | None = None,
    sink_ptr: Tensor | None = None,
    out: Tensor | None = None,
    num_splits: int = 0,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    _unmodelled(q, v, return_lse)
    seqlen_q, seqlen_k = q.shape[1], v.shape[1]
    left = -1 if window_size_left >= seqlen_k else window_size_left
    right = -1 if window_size_right >= seqlen_k else window_size_right
    v3 = (_v3_forward_ok(q, v, dropout_p, bias, alibi_slopes, sliding_window(left, right))
          and cu_seqlens_q is None and cu_seqlens_kv is None)
    q, k, v = [maybe_contiguous(x) for x in (q, k, v)]
    if v3 and seqlen_q > 128:  # aiter: prefer CK for decode cases
        return fmha_v3_fwd(q, k, v, dropout_p, softmax_scale, causal, left, right, return_lse,
                           return_softmax, how_v3_bf16_cvt, out, bias, alibi_slopes, q_descale,
                           k_descale, v_descale, None)
    return mha_fwd(q, k, v, dropout_p, softmax_scale, causal, left, right, sink_size, return_lse,
                   return_softmax, cu_seqlens_q, cu_seqlens_kv, out, bias, alibi_slopes,
                   q_descale, k_descale, v_descale, sink_ptr, None)


def _flash_attn_backward_fake(dout: Tensor, q: Tensor, *args, **kwargs) -> Tensor:
    batch, seqlen_q, heads, _ = q.shape
    return torch.empty((batch, heads, seqlen_q), dtype=torch.float32, device=q.device)


@torch_compile_guard(mutates_args=["dq", "dk", "dv"], gen_fake=_flash_attn_backward_fake)
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
    sink: Tensor | None = None,
    d_sink: Tensor | None = None,
) -> Tensor:
    can_v3 = can_impl_fmha_v3_bwd(dout, q, k, v, dk, dv, dbias, dropout_p, causal,
                                  window_size_left, window_size_right, bias, alibi_slopes,
                                  deterministic, is_v3_atomic_fp32)
    dout, q, k, v, out = [maybe_contiguous(x) for x in (dout, q, k, v, out)]
    _, seqlen_q, nhead_q, hdim_q = q.shape
    _, seqlen_k, nhead_k, hdim_v = v.shape
    swa = sliding_window(window_size_left, window_size_right)
    one_block = get_gfx() == "gfx950" and seqlen_k <= 256 and 64 < hdim_q <= 128
    gfx950 = (
        get_gfx() == "gfx950" and alibi_slopes is None and bias is None and dbias is None
        and dropout_p == 0.0 and (not deterministic or one_block) and nhead_q % nhead_k == 0
        and ((64 < hdim_q <= 128) or (hdim_q == 192 and hdim_v == 128))
        and hdim_q % 8 == 0 and not swa
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
            None, sink, d_sink)
    return softmax_d


class FlashAttnFunc(torch.autograd.Function):
    """aiter's autograd function, head dims already multiples of 8 (no padding modelled)."""

    @staticmethod
    def forward(ctx, q, k, v, dropout_p, softmax_scale, causal, window_size, bias, alibi_slopes,
                deterministic, return_lse, return_softmax, is_grad_enabled,
                is_v3_atomic_fp32=True, how_v3_bf16_cvt=1, cu_seqlens_q=None,
                cu_seqlens_kv=None, sink_ptr=None, num_splits=0):
        if softmax_scale is None:
            softmax_scale = q.shape[-1] ** (-0.5)
        out, softmax_lse, s_dmask, rng_state = _flash_attn_forward(
            q, k, v, dropout_p, softmax_scale, causal=causal,
            window_size_left=int(window_size[0]), window_size_right=int(window_size[1]),
            sink_size=int(window_size[2]) if len(window_size) == 3 else 0, bias=bias,
            alibi_slopes=alibi_slopes, q_descale=None, k_descale=None, v_descale=None,
            return_lse=return_lse, return_softmax=return_softmax and dropout_p > 0,
            how_v3_bf16_cvt=how_v3_bf16_cvt, cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_kv=cu_seqlens_kv, sink_ptr=sink_ptr, num_splits=num_splits)
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
                             bf16_cvt, sink=None, d_sink=None)
        return (dq, dk, dv) + (None,) * 16


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1, 0), bias=None, alibi_slopes=None,
                    deterministic=True, return_lse=False, return_attn_probs=False,
                    how_v3_bf16_cvt=1, cu_seqlens_q: Tensor | None = None,
                    cu_seqlens_kv: Tensor | None = None, sink_ptr: Tensor | None = None,
                    num_splits: int = 0):
    return FlashAttnFunc.apply(q, k, v, dropout_p, softmax_scale, causal, window_size, bias,
                               alibi_slopes, deterministic, return_lse, return_attn_probs,
                               torch.is_grad_enabled(), True, how_v3_bf16_cvt, cu_seqlens_q,
                               cu_seqlens_kv, sink_ptr, num_splits)


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
    sink_size: int = 0,
    bias: Tensor | None = None,
    alibi_slopes: Tensor | None = None,
    q_descale: Tensor | None = None,
    k_descale: Tensor | None = None,
    v_descale: Tensor | None = None,
    return_lse: bool = False,
    return_softmax: bool = False,
    how_v3_bf16_cvt: int | None = 1,
    block_table: Tensor | None = None,
    out: Tensor | None = None,
    zero_tensors: bool = False,
    sink_ptr: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    _unmodelled(q, v, return_lse)
    left = -1 if window_size_left >= max_seqlen_k else window_size_left
    right = -1 if window_size_right >= max_seqlen_k else window_size_right
    v3 = (_v3_forward_ok(q, v, dropout_p, bias, alibi_slopes, sliding_window(left, right))
          and logits_soft_cap == 0.0)
    q, k, v = [maybe_contiguous(x) for x in (q, k, v)]
    if v3:
        return fmha_v3_varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                  min_seqlen_q, dropout_p, softmax_scale, logits_soft_cap,
                                  zero_tensors, causal, left, right, return_lse, return_softmax,
                                  how_v3_bf16_cvt, out, block_table, bias, alibi_slopes,
                                  q_descale, k_descale, v_descale, None, cu_seqlens_q_padded,
                                  cu_seqlens_k_padded)
    return mha_varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                          min_seqlen_q, dropout_p, softmax_scale, logits_soft_cap, zero_tensors,
                          causal, left, right, sink_size, return_lse, return_softmax, out=out,
                          block_table=block_table, bias=bias, alibi_slopes=alibi_slopes,
                          q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
                          gen=None, cu_seqlens_q_padded=cu_seqlens_q_padded,
                          cu_seqlens_k_padded=cu_seqlens_k_padded, sink_ptr=sink_ptr)


def can_impl_fmha_bwd_flydsl(dout, q, k, v, out, dq, dk, dv, cu_seqlens_q, cu_seqlens_k,
                             max_seqlen_q, max_seqlen_k, dropout_p, causal, left, right,
                             alibi_slopes, cu_seqlens_q_padded, cu_seqlens_k_padded, sink,
                             d_sink) -> bool:
    """#4875's ``can_impl_fmha_bwd_flydsl`` (q/k 192, v 128 causal varlen self-attention on
    what ``get_gfx()`` calls gfx942): a closure inside ``_flash_attn_varlen_backward`` in aiter,
    its arguments passed here. Its name is the marker titan-rocm reads in aiter's files."""
    from aiter.ops.flydsl.utils import is_flydsl_available

    return (get_gfx() == "gfx942" and alibi_slopes is None and dropout_p == 0.0
            and q.shape[-1] == 192 and v.shape[-1] == 128 and q.shape[-2] == v.shape[-2]
            and not sliding_window(left, right) and causal and sink is None and d_sink is None
            and cu_seqlens_q_padded is None and cu_seqlens_k_padded is None
            and cu_seqlens_q.data_ptr() == cu_seqlens_k.data_ptr()
            and max_seqlen_q == max_seqlen_k
            and all(x.dtype == torch.bfloat16 for x in (q, k, v, out, dout))
            and all(x.is_contiguous() for x in (q, k, v, out, dout))
            and all(x is None or x.is_contiguous() for x in (dq, dk, dv))
            and is_flydsl_available())


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
    sink: Tensor | None = None,
    d_sink: Tensor | None = None,
) -> Tensor:
    left = -1 if window_size_left >= max_seqlen_k else window_size_left
    right = -1 if window_size_right >= max_seqlen_k else window_size_right
    v3 = varlen_v3_backward(q, v, dropout_p, deterministic, alibi_slopes, left, right,
                            is_v3_atomic_fp32)
    dout, q, k, v, out = [maybe_contiguous(x) for x in (dout, q, k, v, out)]
    # Evaluated after maybe_contiguous, as in aiter: the gate reads contiguity.
    if _FLYDSL_VARLEN_BACKWARD and can_impl_fmha_bwd_flydsl(
            dout, q, k, v, out, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
            max_seqlen_k, dropout_p, causal, left, right, alibi_slopes, cu_seqlens_q_padded,
            cu_seqlens_k_padded, sink, d_sink):
        from aiter.ops.flydsl.fmha_kernels import flydsl_flash_attn_varlen_bwd

        _, _, _, softmax_d = flydsl_flash_attn_varlen_bwd(
            dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, max_seqlen_q,
            max_seqlen_k, softmax_scale)
        return softmax_d
    args = (dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
            max_seqlen_k, dropout_p, softmax_scale, zero_tensors, causal, left, right,
            deterministic)
    if v3:
        _, _, _, softmax_d = fmha_v3_varlen_bwd(
            *args, is_v3_atomic_fp32, how_v3_bf16_cvt, dq, dk, dv, alibi_slopes, rng_state, None,
            cu_seqlens_q_padded, cu_seqlens_k_padded)
    else:
        _, _, _, softmax_d = mha_varlen_bwd(
            *args, dq, dk, dv, alibi_slopes, rng_state, None, cu_seqlens_q_padded,
            cu_seqlens_k_padded, sink=sink, d_sink=d_sink)
    return softmax_d
