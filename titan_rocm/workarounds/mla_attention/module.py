"""The replacements for a DeepSeek V3 block's ``attention.inner_attention``.

:class:`MLAInnerAttention` takes the call of TorchTitan 0.2.2's
``ScaledDotProductAttentionWrapper`` (``attn_type = "sdpa"``):
``forward(q, k, v, *, scale=None, enable_gqa=False, is_causal=True)``.
:class:`MLAFlexInnerAttention` takes the call of ``FlexAttentionWrapper``
(``attn_type = "flex"``): ``forward(q, k, v, *, score_mod=None, block_mask=None, scale=None,
return_lse=False, enable_gqa=False)``; it runs plain causal attention and ignores
``block_mask`` (the converter uses it only where that is what the mask says, or where the
user accepted it). Tensors are ``bhsd`` (batch, heads, seqlen, head dim) in and out. Both
keep the attribute name ``inner_attention``, which TorchTitan's tensor-parallel plan
(``attention.inner_attention``) addresses.

Inputs aiter cannot take (float32, a head dim not a multiple of 8, q heads not a multiple of
k heads) go to the attention the original wrapper ran (SDPA, or flex attention with its
block mask); outside torch.compile that is logged once per shape.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from titan_rocm.log import log_once
from titan_rocm.workarounds.mla_attention import op
from titan_rocm.workarounds.mla_attention.routing import DTYPES

_DEFAULT_SDPA_BACKENDS = [
    SDPBackend.CUDNN_ATTENTION,
    SDPBackend.FLASH_ATTENTION,
    SDPBackend.MATH,
]


def unsupported_reason(q: Tensor, k: Tensor, v: Tensor) -> str | None:
    """Why aiter flash attention cannot take these ``bhsd`` tensors, or None."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return f"expected 4-d bhsd q/k/v, got {q.dim()}-d/{k.dim()}-d/{v.dim()}-d"
    dtype = str(q.dtype).removeprefix("torch.")
    if dtype not in DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return (
            f"dtype {q.dtype}/{k.dtype}/{v.dtype}: aiter flash attention takes "
            f"{' or '.join(DTYPES)}"
        )
    for name, dim in (("q/k", q.shape[-1]), ("v", v.shape[-1])):
        if dim % 8:
            return f"{name} head dim {dim} is not a multiple of 8"
    if q.shape[-1] != k.shape[-1]:
        return f"q head dim {q.shape[-1]} != k head dim {k.shape[-1]}"
    if q.shape[1] % k.shape[1] or k.shape[1] != v.shape[1]:
        return f"heads q {q.shape[1]}, k {k.shape[1]}, v {v.shape[1]} do not group"
    return None


class MLAInnerAttention(nn.Module):
    """aiter flash attention forward; backward routed per call (see ``routing``)."""

    def __init__(self, sdpa_backends: list[SDPBackend] | None = None) -> None:
        super().__init__()
        # Kept for the SDPA fallback, as the replaced wrapper had them.
        self.sdpa_backends = list(sdpa_backends or _DEFAULT_SDPA_BACKENDS)

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        scale: float | None = None,
        enable_gqa: bool = False,
        is_causal: bool = True,
    ) -> Tensor:
        """Attention over ``bhsd`` q/k/v; returns ``bhsd`` output with v's head dim."""
        reason = unsupported_reason(q, k, v)
        if reason is None and q.shape[1] != k.shape[1] and not enable_gqa:
            reason = "q and k/v head counts differ and enable_gqa is False"
        if reason is not None:
            if not torch.compiler.is_dynamo_compiling():  # logging breaks a fullgraph trace
                _log_fallback(q, v, reason)
            with sdpa_kernel(self.sdpa_backends, set_priority=True):
                return F.scaled_dot_product_attention(
                    q, k, v, scale=scale, is_causal=is_causal, enable_gqa=enable_gqa
                )
        softmax_scale = q.shape[-1] ** -0.5 if scale is None else scale
        out = op.mla_flash_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            softmax_scale=softmax_scale,
            causal=is_causal,
        )
        return out.transpose(1, 2)


class MLAFlexInnerAttention(MLAInnerAttention):
    """Replaces ``FlexAttentionWrapper``: aiter causal flash attention, ``block_mask`` unused."""

    def forward(  # type: ignore[override]
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        score_mod: Any = None,
        block_mask: Any = None,
        scale: float | None = None,
        return_lse: bool = False,
        enable_gqa: bool = False,
    ) -> Tensor:
        """Causal attention over ``bhsd`` q/k/v (DeepSeek passes ``block_mask`` and ``scale``)."""
        if score_mod is not None or return_lse:
            raise NotImplementedError(
                "MLAFlexInnerAttention (rocm.mla_ck_backward) supports neither score_mod nor "
                "return_lse; TorchTitan's DeepSeek V3 uses neither"
            )
        reason = unsupported_reason(q, k, v)
        if reason is not None:
            from torchtitan.models.attention import FlexAttentionWrapper

            if not torch.compiler.is_dynamo_compiling():
                _log_fallback(q, v, reason, "flex attention")
            return FlexAttentionWrapper._compiled_flex_attn(
                q, k, v, block_mask=block_mask, scale=scale, enable_gqa=enable_gqa
            )
        return super().forward(q, k, v, scale=scale, enable_gqa=enable_gqa, is_causal=True)


def _log_fallback(q: Tensor, v: Tensor, reason: str, runs: str = "PyTorch SDPA") -> None:
    key = (tuple(q.shape), tuple(v.shape), q.dtype, reason, runs)
    log_once(
        f"mla_fallback:{key!r}",
        logging.WARNING,
        "titan-rocm: mla_ck_backward: q %s, v %s (%s) runs %s, not aiter: %s",
        tuple(q.shape),
        tuple(v.shape),
        q.dtype,
        runs,
        reason,
    )
