"""TorchTitan main's MLA replacements for its folded ``(T, N, H)`` tokens (:data:`FOLDED`;
pytorch/torchtitan #4121, b5bcd76c), swapped in by :mod:`.seams_tt030`'s ``FoldedSeam``.

The tokens already are varlen's ``thd`` layout, so both kinds go through aiter's varlen entry points
with no packing; docs/mla-ck-backward.md cites the upstream lines."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from torch import Tensor
from torchtitan.models.common.attention import FlexAttention, VarlenAttention
from torchtitan.protocols.module import Module

from titan_rocm.workarounds.mla_ck_backward.batched_tt030 import require_causal, varlen_metadata
from titan_rocm.workarounds.mla_ck_backward.kinds import ROWS, VARLEN, Layout
from titan_rocm.workarounds.mla_ck_backward.module import MLAVarlenInnerAttention

FOLDED_DOCUMENT_MASKS = (
    "inner_attention configs are VarlenAttention.Config subclasses, so TorchTitan's own "
    "get_attention_masks returns its VarlenMetadata over the folded tokens "
    "(create_varlen_metadata_for_document: a document starts where positions reset to 0), "
    "once per batch (per microbatch under PP) outside the compiled model (host syncs: one "
    "nonzero over the tokens and one for the longest document, as TorchTitan's own varlen "
    "attention)"
)
"""How the plan says where the document boundaries come from on folded tokens."""
ROW_LENGTH = "max_context_length"
"""The model config's property that gives :class:`MLAFoldedRowsAttention`'s row length (main's
``Decoder.Config.max_context_length``, ``models/common/decoder.py:129-137``)."""


def _tokens_first(out: Tensor) -> Tensor:
    return out.squeeze(0).transpose(0, 1)


def _one_sequence(t: Tensor) -> Tensor:
    """``(tokens, heads, dim)`` -> ``(1, heads, tokens, dim)``, a view, so packing is a view too."""
    return t.transpose(0, 1).unsqueeze(0)


class _Folded(MLAVarlenInnerAttention):
    """Varlen attention over folded ``(T, N, H)`` tokens."""

    def folded(self, q_TNH: Tensor, k_TNH: Tensor, v_TNH: Tensor, cu_seqlens: Tensor,
               max_seqlen: int, scale: float | None, enable_gqa: bool) -> Tensor:
        """Causal attention within each span of ``cu_seqlens`` (int32 starts, then ``T``);
        returns ``(T, N, v head dim)``."""
        out = self.within_documents(_one_sequence(q_TNH), _one_sequence(k_TNH),
                                    _one_sequence(v_TNH), cu_seqlens, max_seqlen,
                                    scale=scale, enable_gqa=enable_gqa)
        return _tokens_first(out)


class MLAFoldedVarlenAttention(Module, _Folded):
    """In place of main's ``VarlenAttention``/``FlexAttention``: aiter's varlen attention,
    causal within each document of the batch's ``VarlenMetadata``."""

    @dataclass(kw_only=True, slots=True)
    class Config(VarlenAttention.Config):
        """A ``VarlenAttention.Config``: ``Decoder.get_attention_masks`` then returns the
        tokens' ``VarlenMetadata``."""

    def __init__(self, config: Config) -> None:
        # Not VarlenAttention.__init__: it picks a CUDA flash-attention implementation.
        _Folded.__init__(self)
        require_causal(self, config)

    def forward(  # type: ignore[override]
        self,
        q_TNH: Tensor,
        k_TNH: Tensor,
        v_TNH: Tensor,
        *,
        attention_masks: Any,
        scale: float | None = None,
        out_transform: Any = None,
        enable_gqa: bool = False,
        **kwargs: Any,
    ) -> Tensor:
        """Main's ``VarlenAttention`` call; returns ``(tokens, heads, v head dim)``."""
        masks = varlen_metadata(self, attention_masks, out_transform)
        # DeepSeek's self-attention: cu_seq_k is cu_seq_q (create_varlen_metadata_for_document).
        return self.folded(q_TNH, k_TNH, v_TNH, masks.cu_seq_q, masks.max_q, scale, enable_gqa)


def row_offsets(tokens: int, row_length: int, device: torch.device) -> Tensor:
    """int32 ``cu_seqlens`` of ``tokens`` cut into rows of ``row_length`` (the last one may be
    shorter): ``0, L, 2L, ..., tokens``. No host sync."""
    starts = torch.arange(0, tokens + row_length - 1, row_length, dtype=torch.int32,
                          device=device)
    return starts.clamp_(max=tokens)


class MLAFoldedRowsAttention(Module, _Folded):
    """Under ``mla_document_masks = "drop"``: aiter's varlen attention, causal within each row of
    the tokens, across documents."""

    @dataclass(kw_only=True, slots=True)
    class Config(FlexAttention.Config):
        """A ``FlexAttention.Config``: the trainer builds a ``BlockMask``, ignored here."""

        row_length: int = 0
        """Tokens per row: the model's ``max_context_length`` (set by the seam)."""

    def __init__(self, config: Config) -> None:
        _Folded.__init__(self)
        if isinstance(config.row_length, bool) or not isinstance(config.row_length, int) \
                or config.row_length <= 0:
            raise ValueError(f"row_length {config.row_length!r} is not accepted; "
                             "a positive number of tokens (the model's max_context_length)")
        self.row_length = config.row_length

    def forward(  # type: ignore[override]
        self,
        q_TNH: Tensor,
        k_TNH: Tensor,
        v_TNH: Tensor,
        *,
        attention_masks: Any = None,
        scale: float | None = None,
        enable_gqa: bool = False,
        score_mod: Any = None,
        out_transform: Any = None,
        **kwargs: Any,
    ) -> Tensor:
        """Main's ``FlexAttention`` call; returns ``(tokens, heads, v head dim)``."""
        if score_mod is not None or out_transform is not None:
            raise NotImplementedError(f"{type(self).__name__} (rocm.mla_ck_backward) takes "
                                      "neither score_mod nor out_transform; TorchTitan's "
                                      "DeepSeek V3 passes none")
        tokens = q_TNH.shape[0]
        offsets = row_offsets(tokens, self.row_length, q_TNH.device)
        return self.folded(q_TNH, k_TNH, v_TNH, offsets, min(self.row_length, tokens), scale,
                           enable_gqa)


FOLDED = Layout({VARLEN: MLAFoldedVarlenAttention, ROWS: MLAFoldedRowsAttention},
                      dropped=ROWS, sdpa=None)
"""Main's ``(T, N, H)``: per-document and dropped masks both varlen; SDPA not replaced."""


def row_length(model: nn.Module) -> int | None:
    """The model's ``max_context_length`` (None: its config has none)."""
    value = getattr(getattr(model, "config", None), ROW_LENGTH, None)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 \
        else None
