"""The replacement for a DeepSeek V3 block's ``attention.inner_attention``.

Same call as TorchTitan 0.2.2's ``ScaledDotProductAttentionWrapper``:
``forward(q, k, v, *, scale=None, enable_gqa=False, is_causal=True)`` with ``bhsd`` tensors
(batch, heads, seqlen, head dim), returning ``bhsd``. It keeps the attribute name
``inner_attention`` so TorchTitan's tensor-parallel plan (``attention.inner_attention``)
still addresses it.

Inputs aiter cannot take (float32, a head dim not a multiple of 8, q heads not a multiple of
k heads) go to PyTorch SDPA exactly as the original wrapper would run them; outside
torch.compile that is logged once per shape.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from titan_rocm.workarounds.mla_attention import op
from titan_rocm.workarounds.mla_attention.routing import DTYPES

log = logging.getLogger("titan_rocm")

_fallbacks_logged: set[tuple] = set()

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


def _log_fallback(q: Tensor, v: Tensor, reason: str) -> None:
    key = (tuple(q.shape), tuple(v.shape), q.dtype, reason)
    if key in _fallbacks_logged:
        return
    _fallbacks_logged.add(key)
    log.warning(
        "titan-rocm: mla_ck_backward: q %s, v %s (%s) runs PyTorch SDPA, not aiter: %s",
        tuple(q.shape),
        tuple(v.shape),
        q.dtype,
        reason,
    )
