"""The replacements for a DeepSeek V3 block's ``attention.inner_attention``
(docs/mla-ck-backward.md); 0.3.0's are built on these.

They keep the name ``inner_attention``, which TorchTitan's tensor-parallel plan addresses. Inputs
aiter cannot take go to the original attention, logged once per shape."""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from titan_rocm.log import log_once
from titan_rocm.workarounds.mla_ck_backward import op
from titan_rocm.workarounds.mla_ck_backward.documents import DocumentSpans, dense_mask
from titan_rocm.workarounds.mla_ck_backward.routing import DTYPES

_DEFAULT_SDPA_BACKENDS = [
    SDPBackend.CUDNN_ATTENTION,
    SDPBackend.FLASH_ATTENTION,
    SDPBackend.MATH,
]


def unsupported_reason(q: Tensor, k: Tensor, v: Tensor, enable_gqa: bool = True) -> str | None:
    """Why aiter flash attention cannot take these ``bhsd`` tensors, or None (without
    ``enable_gqa``, q and k/v must have as many heads)."""
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
    if q.shape[1] != k.shape[1] and not enable_gqa:
        return "q and k/v head counts differ and enable_gqa is False"
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
        reason = unsupported_reason(q, k, v, enable_gqa)
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


def _flex_attention(q: Tensor, k: Tensor, v: Tensor, block_mask: Any, scale: float | None,
                    enable_gqa: bool) -> Tensor:
    """What TorchTitan's ``FlexAttentionWrapper`` would have computed."""
    from torchtitan.models.attention import FlexAttentionWrapper

    return FlexAttentionWrapper._compiled_flex_attn(
        q, k, v, block_mask=block_mask, scale=scale, enable_gqa=enable_gqa
    )


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
        """Causal attention over ``bhsd`` q/k/v (DeepSeek passes ``block_mask`` and ``scale``);
        what aiter cannot take runs TorchTitan's flex attention with ``block_mask``."""
        _refuse_flex_extras(self, score_mod, return_lse)
        reason = self._flex_reason(q, k, v, block_mask)
        if reason is not None:
            if not torch.compiler.is_dynamo_compiling():
                _log_fallback(q, v, reason, "flex attention")
            return _flex_attention(q, k, v, block_mask, scale, enable_gqa)
        return self._attend(q, k, v, block_mask, scale, enable_gqa)

    def _flex_reason(self, q: Tensor, k: Tensor, v: Tensor, block_mask: Any) -> str | None:
        return unsupported_reason(q, k, v)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, block_mask: Any, scale: float | None,
                enable_gqa: bool) -> Tensor:
        return MLAInnerAttention.forward(self, q, k, v, scale=scale, enable_gqa=enable_gqa,
                                         is_causal=True)


class MLAVarlenInnerAttention(MLAFlexInnerAttention):
    """Replaces ``FlexAttentionWrapper`` under ``block_causal`` masks: aiter varlen attention within
    each document (a real ``BlockMask``, e.g. one PP re-split, runs flex attention)."""

    def _flex_reason(self, q: Tensor, k: Tensor, v: Tensor, block_mask: Any) -> str | None:
        if isinstance(block_mask, DocumentSpans):
            return None
        return f"block_mask is a {type(block_mask).__name__}, not titan-rocm's DocumentSpans"

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, block_mask: Any, scale: float | None,
                enable_gqa: bool) -> Tensor:
        batch, _, seqlen, _ = q.shape
        if (batch, seqlen) != (block_mask.batch, block_mask.seqlen):
            raise ValueError(
                f"document spans are for batch {block_mask.batch} x seqlen {block_mask.seqlen}, "
                f"attention got {batch} x {seqlen}"
            )
        return self.within_documents(q, k, v, block_mask.cu_seqlens, block_mask.max_seqlen,
                                     scale=scale, enable_gqa=enable_gqa)

    def within_documents(self, q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor,
                         max_seqlen: int, *, scale: float | None = None,
                         enable_gqa: bool = False) -> Tensor:
        """Causal attention within each document of ``bhsd`` q/k/v: aiter's varlen attention, or
        SDPA under the per-document mask for inputs aiter cannot take."""
        reason = unsupported_reason(q, k, v, enable_gqa)
        batch, heads, seqlen, _ = q.shape
        if reason is not None:
            if not torch.compiler.is_dynamo_compiling():
                _log_fallback(q, v, reason, "PyTorch SDPA with the per-document mask")
            with sdpa_kernel(self.sdpa_backends, set_priority=True):
                return F.scaled_dot_product_attention(
                    q, k, v, attn_mask=dense_mask(cu_seqlens, batch, seqlen), scale=scale,
                    enable_gqa=enable_gqa,
                )

        def packed(t: Tensor) -> Tensor:  # bhsd -> (batch * seqlen, heads, dim), thd
            return t.transpose(1, 2).reshape(batch * seqlen, t.shape[1], t.shape[-1])

        out = op.mla_varlen_attention(
            packed(q), packed(k), packed(v), cu_seqlens, max_seqlen,
            softmax_scale=q.shape[-1] ** -0.5 if scale is None else scale,
        )
        return out.view(batch, seqlen, heads, -1).transpose(1, 2)


def _refuse_flex_extras(module: nn.Module, score_mod: Any, return_lse: bool) -> None:
    if score_mod is not None or return_lse:
        raise NotImplementedError(
            f"{type(module).__name__} (rocm.mla_ck_backward) supports neither score_mod nor "
            "return_lse; TorchTitan's DeepSeek V3 uses neither"
        )


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
