"""``flydsl_flash_attn_varlen_bwd`` of aiter main (ROCm/aiter#4875, ``aiter/ops/flydsl/
fmha_kernels.py`` at the PR head 90efdcb4): the FlyDSL backward for causal varlen self-attention
with q/k 192, v 128, bf16, built for gfx942. Same parameters and return value as aiter's (the
kernel writes ``dq``/``dk``/``dv`` in place and returns them with ``softmax_d``); a plain Python
function, as in aiter. Its math is the fake's fp32 reference; a device other than gfx942 is not
modelled and raises."""

from __future__ import annotations

import fake_aiter_support
import torch


def flydsl_flash_attn_varlen_bwd(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    softmax_lse: torch.Tensor,
    dq: torch.Tensor,
    dk: torch.Tensor,
    dv: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
):
    if fake_aiter_support.DEVICE_ARCH != "gfx942":
        raise NotImplementedError(
            "fake aiter main: the FlyDSL gfx942 varlen backward on a "
            f"{fake_aiter_support.DEVICE_ARCH} device is not modelled")
    return fake_aiter_support.varlen_backward_kernel(
        "flydsl_flash_attn_varlen_bwd", dout, q, k, v, out, cu_seqlens, cu_seqlens,
        softmax_scale=softmax_scale, is_causal=True, dropout_p=0.0, dq=dq, dk=dk, dv=dv,
        max_seqlen_q=max_seqlen_q, deterministic=False)
