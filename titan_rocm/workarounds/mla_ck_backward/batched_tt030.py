"""TorchTitan 0.3.0's MLA replacements for its ``(batch, seqlen, heads, dim)`` q/k/v
(:data:`BATCHED`), swapped in by :mod:`.seams_tt030`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch.nn as nn
from torch import Tensor
from torchtitan.models.common.attention import (
    FlexAttention,
    ScaledDotProductAttention,
    VarlenAttention,
    VarlenMetadata,
)
from torchtitan.protocols.module import Module

from titan_rocm.workarounds.mla_ck_backward.kinds import DENSE, DROPPED, VARLEN, Layout
from titan_rocm.workarounds.mla_ck_backward.module import MLAInnerAttention, MLAVarlenInnerAttention

CAUSAL_WINDOW = (-1, 0)
"""``VarlenAttention.Config.window_size`` of causal attention (the only one replaced)."""


class MLAVarlenAttention(Module, MLAVarlenInnerAttention):
    """In place of ``VarlenAttention``/``FlexAttention``: aiter's varlen attention, causal
    within each document of the batch's ``VarlenMetadata``."""

    @dataclass(kw_only=True, slots=True)
    class Config(VarlenAttention.Config):
        """A ``VarlenAttention.Config``: ``Decoder.get_attention_masks`` then returns the
        batch's ``VarlenMetadata``."""

    def __init__(self, config: Config) -> None:
        # Not VarlenAttention.__init__: it picks a CUDA flash-attention implementation.
        MLAVarlenInnerAttention.__init__(self)
        require_causal(self, config)

    def forward(  # type: ignore[override]
        self,
        q_BLNH: Tensor,
        k_BLNH: Tensor,
        v_BLNH: Tensor,
        *,
        attention_masks: Any,
        scale: float | None = None,
        out_transform: Any = None,
        enable_gqa: bool = False,
        **kwargs: Any,
    ) -> Tensor:
        """``VarlenAttention``'s call; returns ``(batch, seqlen, heads, v head dim)``."""
        masks = varlen_metadata(self, attention_masks, out_transform)
        # DeepSeek's self-attention: cu_seq_k is cu_seq_q (create_varlen_metadata_for_document).
        out = self.within_documents(
            q_BLNH.transpose(1, 2), k_BLNH.transpose(1, 2), v_BLNH.transpose(1, 2),
            masks.cu_seq_q, masks.max_q, scale=scale, enable_gqa=enable_gqa,
        )
        return out.transpose(1, 2)


def require_causal(module: nn.Module, config: Any) -> None:
    """Refuse a varlen config whose window is not causal (the only one replaced)."""
    if tuple(config.window_size) != CAUSAL_WINDOW:
        raise ValueError(f"window_size {config.window_size} is not accepted; "
                         f"{type(module).__name__} is causal: {CAUSAL_WINDOW}")


def varlen_metadata(module: nn.Module, attention_masks: Any, out_transform: Any) -> Any:
    """``attention_masks`` as the ``VarlenMetadata`` a varlen replacement reads.

    Raises NotImplementedError for an ``out_transform``, TypeError for other masks."""
    if out_transform is not None:
        raise NotImplementedError(f"{type(module).__name__} (rocm.mla_ck_backward) does not "
                                  "take out_transform; TorchTitan's DeepSeek V3 passes none")
    if not isinstance(attention_masks, VarlenMetadata):
        raise TypeError(f"attention_masks must be TorchTitan's VarlenMetadata, got "
                        f"{type(attention_masks).__name__}")
    return attention_masks


class MLASdpaAttention(Module, MLAInnerAttention):
    """In place of ``ScaledDotProductAttention``: aiter dense attention (no masks)."""

    ignores_masks: ClassVar[bool] = False
    """Masks are refused, as ``ScaledDotProductAttention`` refuses them."""

    @dataclass(kw_only=True, slots=True)
    class Config(ScaledDotProductAttention.Config):
        """A ``ScaledDotProductAttention.Config``: the trainer builds no masks for it."""

    def __init__(self, config: Any) -> None:
        MLAInnerAttention.__init__(self)

    def forward(  # type: ignore[override]
        self,
        q_BLNH: Tensor,
        k_BLNH: Tensor,
        v_BLNH: Tensor,
        *,
        attention_masks: Any = None,
        scale: float | None = None,
        enable_gqa: bool = False,
        is_causal: bool = True,
        **kwargs: Any,
    ) -> Tensor:
        """``ScaledDotProductAttention``'s call (``FlexAttention``'s, when masks are ignored)."""
        if attention_masks is not None and not self.ignores_masks:
            raise ValueError(f"{type(self).__name__} takes no attention_masks")
        out = MLAInnerAttention.forward(self, q_BLNH.transpose(1, 2), k_BLNH.transpose(1, 2),
                                        v_BLNH.transpose(1, 2), scale=scale,
                                        enable_gqa=enable_gqa, is_causal=is_causal)
        return out.transpose(1, 2)


class MLADroppedMasksAttention(MLASdpaAttention):
    """In place of ``FlexAttention``/``VarlenAttention`` under ``mla_document_masks = "drop"``:
    aiter dense causal attention across documents; the masks are ignored."""

    ignores_masks = True

    @dataclass(kw_only=True, slots=True)
    class Config(FlexAttention.Config):
        """A ``FlexAttention.Config``: the trainer builds a ``BlockMask`` (which pipeline
        parallelism splits per microbatch), ignored here."""


BATCHED = Layout({VARLEN: MLAVarlenAttention, DENSE: MLASdpaAttention,
                  DROPPED: MLADroppedMasksAttention}, dropped=DROPPED, sdpa=DENSE)
"""TorchTitan 0.3.0's ``(batch, seqlen, heads, dim)`` (there is no causal-only Flex mask)."""
