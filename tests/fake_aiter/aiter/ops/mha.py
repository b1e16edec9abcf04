"""Fake ``aiter.ops.mha``: aiter's names, parameter lists and dispatch; fp32 reference kernels.

See tests/fake_aiter/README.md for what is faithful and what is simplified.
"""

from __future__ import annotations

import torch
from torch import Generator, Tensor

from aiter import _fake
from aiter.jit.utils.chip_info import get_gfx
from aiter.jit.utils.torch_guard import torch_compile_guard

__all__ = ["flash_attn_func", "mha_fwd", "mha_bwd", "fmha_v3_fwd", "fmha_v3_bwd"]


def maybe_contiguous(x):
    return x.contiguous() if x is not None and x.stride(-1) != 1 else x


# ---- reference math (fp32) --------------------------------------------------------------


def _scores(q, k, softmax_scale, causal):
    # q: (b, sq, hq, d), k: (b, sk, hk, d) -> (b, hq, sq, sk), bottom-right causal mask.
    qf = q.float().transpose(1, 2)
    kf = k.float().transpose(1, 2)
    if qf.shape[1] != kf.shape[1]:
        kf = kf.repeat_interleave(qf.shape[1] // kf.shape[1], dim=1)
    s = qf @ kf.transpose(-1, -2) * softmax_scale
    if causal:
        sq, sk = s.shape[-2], s.shape[-1]
        i = torch.arange(sq).unsqueeze(1)
        j = torch.arange(sk).unsqueeze(0)
        s = s.masked_fill(j > i + sk - sq, float("-inf"))
    return s


def _attend(q, k, v, softmax_scale, causal):
    s = _scores(q, k, softmax_scale, causal)
    vf = v.float().transpose(1, 2)
    if vf.shape[1] != s.shape[1]:
        vf = vf.repeat_interleave(s.shape[1] // vf.shape[1], dim=1)
    lse = torch.logsumexp(s, dim=-1).contiguous()
    out = (torch.softmax(s, dim=-1) @ vf).transpose(1, 2)
    return out, lse


def _attend_backward(dout, q, k, v, softmax_scale, causal):
    # Closed form (custom-op kernels run below autograd, so no autograd here).
    s = _scores(q, k, softmax_scale, causal)
    heads, heads_k = s.shape[1], k.shape[2]
    rep = heads // heads_k
    p = torch.softmax(s, dim=-1)
    do = dout.float().transpose(1, 2)
    qf = q.float().transpose(1, 2)
    kf = k.float().transpose(1, 2).repeat_interleave(rep, dim=1)
    vf = v.float().transpose(1, 2).repeat_interleave(rep, dim=1)
    dv = p.transpose(-1, -2) @ do
    dp = do @ vf.transpose(-1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdim=True))
    dq = ds @ kf * softmax_scale
    dk = ds.transpose(-1, -2) @ qf * softmax_scale

    def fold(t):  # sum the q heads that share a k/v head
        b, _, sl, d = t.shape
        return t.view(b, heads_k, rep, sl, d).sum(2).transpose(1, 2)

    return dq.transpose(1, 2), fold(dk), fold(dv)


def _check(dropout_p, bias, alibi_slopes):
    if dropout_p != 0.0:
        raise NotImplementedError("fake aiter: dropout is not modelled")
    if bias is not None or alibi_slopes is not None:
        raise NotImplementedError("fake aiter: bias/alibi are not modelled")


def _forward(name, q, k, v, dropout_p, softmax_scale, is_causal, return_lse, out, bias,
             alibi_slopes, **details):
    _check(dropout_p, bias, alibi_slopes)
    _fake.record(
        name,
        q_shape=tuple(q.shape),
        v_shape=tuple(v.shape),
        dtype=q.dtype,
        causal=is_causal,
        softmax_scale=softmax_scale,
        **details,
    )
    ref, lse = _attend(q, k, v, softmax_scale, is_causal)
    result = ref.to(q.dtype).contiguous()  # aiter allocates a dense bshd output
    if out is not None:
        out.copy_(result)
        result = out
    if not return_lse:
        lse = torch.empty((0,), dtype=torch.float32, device=q.device)
    p = torch.empty((0,), device=q.device)
    rng_state = torch.zeros((2,), dtype=torch.int64, device=q.device)
    return result, lse, p, rng_state


def _backward(name, dout, q, k, v, out, softmax_scale, is_causal, dropout_p, dq, dk, dv,
              bias, alibi_slopes, **details):
    _check(dropout_p, bias, alibi_slopes)
    _fake.record(
        name,
        q_shape=tuple(q.shape),
        k_shape=tuple(k.shape),
        v_shape=tuple(v.shape),
        dout_shape=tuple(dout.shape),
        dtype=q.dtype,
        causal=is_causal,
        softmax_scale=softmax_scale,
        **details,
    )
    gq, gk, gv = _attend_backward(dout, q, k, v, softmax_scale, is_causal)
    dq = torch.empty_like(q) if dq is None else dq
    dk = torch.empty_like(k) if dk is None else dk
    dv = torch.empty_like(v) if dv is None else dv
    dq.copy_(gq)
    dk.copy_(gk)
    dv.copy_(gv)
    softmax_d = (dout.float() * out.float()).sum(-1).transpose(1, 2).contiguous()
    return dq, dk, dv, softmax_d


# ---- kernels (aiter: @compile_ops bindings) ---------------------------------------------


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
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return _forward("mha_fwd", q, k, v, dropout_p, softmax_scale, is_causal,
                    return_softmax_lse, out, bias, alibi_slopes)


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
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return _forward("fmha_v3_fwd", q, k, v, dropout_p, softmax_scale, is_causal,
                    return_softmax_lse, out, bias, alibi_slopes)


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
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return _backward("mha_bwd", dout, q, k, v, out, softmax_scale, is_causal, dropout_p,
                     dq, dk, dv, bias, alibi_slopes, deterministic=deterministic)


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
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    if get_gfx() != _fake.DEVICE_ARCH or (_fake.DEVICE_ARCH == "gfx942" and q.shape[-1] == 192):
        _fake.record("fmha_v3_bwd:failed", q_shape=tuple(q.shape), v_shape=tuple(v.shape))
        raise RuntimeError("invalid argument for fmha_v3_bwd")
    return _backward("fmha_v3_bwd", dout, q, k, v, out, softmax_scale, is_causal, dropout_p,
                     dq, dk, dv, None, alibi_slopes, deterministic=deterministic)


# ---- dispatch (aiter: Python) -------------------------------------------------------------


def _flash_attn_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout_p: float,
    softmax_scale: float,
    causal: bool,
    window_size_left: int,
    window_size_right: int,
    sink_size: int,
    bias: torch.Tensor | None,
    alibi_slopes: torch.Tensor | None,
    q_descale: torch.Tensor | None,
    k_descale: torch.Tensor | None,
    v_descale: torch.Tensor | None,
    return_lse: bool,
    return_softmax: bool,
    how_v3_bf16_cvt: int | None = 1,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_kv: torch.Tensor | None = None,
    sink_ptr: Tensor | None = None,
    out: torch.Tensor | None = None,
    num_splits: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    _, seqlen_q, nhead_q, hdim_q = q.shape
    _, _, nhead_k, hdim_v = v.shape
    v3 = (
        get_gfx() in ("gfx942", "gfx950")
        and alibi_slopes is None
        and bias is None
        and dropout_p == 0.0
        and ((hdim_q == 128 and hdim_v == 128) or (hdim_q == 192 and hdim_v == 128))
        and nhead_q % nhead_k == 0
        and q.dtype == torch.bfloat16
    )
    q, k, v = [maybe_contiguous(x) for x in (q, k, v)]
    if v3 and seqlen_q > 128:
        return fmha_v3_fwd(q, k, v, dropout_p, softmax_scale, causal, window_size_left,
                           window_size_right, return_lse, return_softmax, how_v3_bf16_cvt,
                           out, bias, alibi_slopes, q_descale, k_descale, v_descale, None)
    return mha_fwd(q, k, v, dropout_p, softmax_scale, causal, window_size_left,
                   window_size_right, sink_size, return_lse, return_softmax, cu_seqlens_q,
                   cu_seqlens_kv, out, bias, alibi_slopes, q_descale, k_descale, v_descale,
                   sink_ptr, None)


def can_impl_fmha_v3_bwd(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dk: torch.Tensor | None,
    dv: torch.Tensor | None,
    dbias: torch.Tensor | None,
    dropout_p: float,
    causal: bool,
    window_size_left: int,
    window_size_right: int,
    bias: torch.Tensor | None,
    alibi_slopes: torch.Tensor | None,
    deterministic: bool,
    is_v3_atomic_fp32: bool | None = True,
) -> bool:
    _, _, nhead_q, hdim_q = q.shape
    _, _, nhead_k, hdim_v = v.shape
    ret = get_gfx() == "gfx942"
    ret &= alibi_slopes is None
    ret &= bias is None
    ret &= dbias is None
    ret &= dropout_p == 0.0
    ret &= not deterministic
    ret &= hdim_q == hdim_v
    ret &= nhead_q % nhead_k == 0
    ret &= 64 <= hdim_q <= 192 and hdim_q % 8 == 0
    return bool(ret)


def _flash_attn_backward_fake(*args, **kwargs):
    raise NotImplementedError  # aiter's gen_fake; unused by the fake guard


@torch_compile_guard(mutates_args=["dq", "dk", "dv"], gen_fake=_flash_attn_backward_fake)
def _flash_attn_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    softmax_lse: torch.Tensor,
    dq: torch.Tensor | None,
    dk: torch.Tensor | None,
    dv: torch.Tensor | None,
    dbias: torch.Tensor | None,
    dropout_p: float,
    softmax_scale: float,
    causal: bool,
    window_size_left: int,
    window_size_right: int,
    bias: torch.Tensor | None,
    alibi_slopes: torch.Tensor | None,
    deterministic: bool,
    rng_state: torch.Tensor | None = None,
    is_v3_atomic_fp32: bool | None = True,
    how_v3_bf16_cvt: int | None = 1,
    sink: Tensor | None = None,
    d_sink: Tensor | None = None,
) -> torch.Tensor:
    can_v3 = can_impl_fmha_v3_bwd(dout, q, k, v, dk, dv, dbias, dropout_p, causal,
                                  window_size_left, window_size_right, bias, alibi_slopes,
                                  deterministic, is_v3_atomic_fp32)
    dout, q, k, v, out = [maybe_contiguous(x) for x in (dout, q, k, v, out)]
    _, seqlen_q, nhead_q, hdim_q = q.shape
    _, _, nhead_k, hdim_v = v.shape
    gfx950 = (
        get_gfx() == "gfx950"
        and alibi_slopes is None
        and bias is None
        and dbias is None
        and dropout_p == 0.0
        and not deterministic
        and nhead_q % nhead_k == 0
        and ((64 < hdim_q <= 128) or (hdim_q == 192 and hdim_v == 128))
        and hdim_q % 8 == 0
    )
    if (can_v3 or gfx950) and seqlen_q > 16:
        _dq, _dk, _dv, softmax_d = fmha_v3_bwd(
            dout, q, k, v, out, softmax_lse, dropout_p, softmax_scale, causal,
            window_size_left, window_size_right, deterministic, is_v3_atomic_fp32,
            how_v3_bf16_cvt, dq, dk, dv, alibi_slopes, rng_state, None)
    else:
        _dq, _dk, _dv, softmax_d = mha_bwd(
            dout, q, k, v, out, softmax_lse, dropout_p, softmax_scale, causal,
            window_size_left, window_size_right, deterministic, dq, dk, dv, dbias, bias,
            alibi_slopes, rng_state, None, sink, d_sink)
    return softmax_d


class FlashAttnFunc(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, dropout_p, softmax_scale, causal, window_size, bias,
                alibi_slopes, deterministic, return_lse, return_softmax, is_grad_enabled,
                is_v3_atomic_fp32=True, how_v3_bf16_cvt=1, cu_seqlens_q=None,
                cu_seqlens_kv=None, sink_ptr=None, num_splits=0):
        is_grad = is_grad_enabled and any(x.requires_grad for x in (q, k, v))
        if softmax_scale is None:
            softmax_scale = q.shape[-1] ** (-0.5)
        out, softmax_lse, s_dmask, rng_state = _flash_attn_forward(
            q, k, v, dropout_p, softmax_scale, causal=causal,
            window_size_left=int(window_size[0]), window_size_right=int(window_size[1]),
            sink_size=int(window_size[2]) if len(window_size) == 3 else 0, bias=bias,
            alibi_slopes=alibi_slopes, q_descale=None, k_descale=None, v_descale=None,
            return_lse=return_lse, return_softmax=return_softmax and dropout_p > 0)
        if is_grad:
            assert return_lse
            ctx.save_for_backward(q, k, v, out, softmax_lse, rng_state)
            ctx.dropout_p = dropout_p
            ctx.softmax_scale = softmax_scale
            ctx.causal = causal
            ctx.window_size = window_size
            ctx.bias = bias
            ctx.alibi_slopes = alibi_slopes
            ctx.deterministic = deterministic
            ctx.is_v3_atomic_fp32 = is_v3_atomic_fp32
            ctx.how_v3_bf16_cvt = how_v3_bf16_cvt
        result = [out]
        if return_lse:
            result.append(softmax_lse)
        if return_softmax:
            result.append(s_dmask)
        return result[0] if len(result) == 1 else tuple(result)

    @staticmethod
    def backward(ctx, dout, *args):
        q, k, v, out, softmax_lse, rng_state = ctx.saved_tensors
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        # Looked up as a module global at call time, as in aiter: the guard can replace it.
        _flash_attn_backward(
            dout, q, k, v, out, softmax_lse, dq, dk, dv, None, ctx.dropout_p,
            ctx.softmax_scale, ctx.causal, int(ctx.window_size[0]), int(ctx.window_size[1]),
            ctx.bias, ctx.alibi_slopes, ctx.deterministic, rng_state, ctx.is_v3_atomic_fp32,
            ctx.how_v3_bf16_cvt, sink=None, d_sink=None)
        return (dq, dk, dv) + (None,) * 16


def flash_attn_func(
    q,
    k,
    v,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1, 0),
    bias=None,
    alibi_slopes=None,
    deterministic=True,
    return_lse=False,
    return_attn_probs=False,
    how_v3_bf16_cvt=1,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_kv: torch.Tensor | None = None,
    sink_ptr: Tensor | None = None,
    num_splits: int = 0,
):
    return FlashAttnFunc.apply(
        q, k, v, dropout_p, softmax_scale, causal, window_size, bias, alibi_slopes,
        deterministic, return_lse, return_attn_probs, torch.is_grad_enabled(), True,
        how_v3_bf16_cvt, cu_seqlens_q, cu_seqlens_kv, sink_ptr, num_splits)
