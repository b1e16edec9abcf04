"""TorchTitan main's MLA replacements for its folded ``(T, N, H)`` tokens (:data:`FOLDED`),
swapped in by :mod:`.seams_tt030`'s ``FoldedSeam`` (pytorch/torchtitan b5bcd76c, paths under
``torchtitan/``):

- #4121 (73aed7f6) folds the batch into the token dimension: tokens and ``positions`` are
  ``[T]``, hidden states ``[T, D]``. DeepSeek's ``Attention.forward(x, attention_masks,
  positions)`` (``models/deepseek_v3/model.py:93-151``) views q as ``(T, N, 192)``, builds k
  ``(T, N, 192)`` and v ``(T, N, 128)`` and calls ``inner_attention(q, k, v,
  attention_masks=..., scale=...)`` (``model.py:147-149``).
- The inner attentions take ``(T, N, H)``: ``FlexAttention.forward(q_TNH, k_TNH, v_TNH, *,
  attention_masks: BlockMask, ...)`` adds a kernel batch of 1 at the kernel
  (``models/common/attention.py:313-362``); ``VarlenAttention.forward(q_TNH, k_TNH, v_TNH, *,
  attention_masks: VarlenMetadata, ...)`` hands them to ``varlen_attn`` as they are
  (``attention.py:137-221``). ``ScaledDotProductAttention`` still reads ``(B, L, N, H)``
  (``attention.py:367-426``) and language models refuse it (``models/common/config_utils.py:
  97-101``), so it is not replaced here.
- The masks: ``Decoder.get_attention_masks(positions)`` with ``positions`` ``[T]``
  (``models/common/decoder.py:342-360``) dispatches on the first attention's inner-attention
  config class, as on 0.3.0: a ``(1, T, T)`` ``BlockMask`` for ``FlexAttention.Config``,
  ``create_varlen_metadata_for_document(positions)`` for ``VarlenAttention.Config``
  (``attention.py:576-640``: the document starts, where ``positions`` is 0, then ``T``; the
  longest document by one ``.item()``). The trainer builds them once per batch, and under
  pipeline parallelism once per microbatch from that microbatch's own positions
  (``trainer.py:700-722``, ``804-822``): nothing splits them.
- Tensor parallelism keys the inner attention's sharding config on ``q_TNH``/``k_TNH``/``v_TNH``
  (``models/common/decoder_sharding.py:263-301``); op SAC saves ``_get_default_save_ops()``, as
  on 0.3.0.

The folded seam is the batched one (configs of titan-rocm's own in the model's copy of its
config tree) with replacements that take ``(T, N, H)``. The tokens already are varlen's
``thd`` layout, so both go through aiter's varlen entry points with cumulative sequence
lengths, no packing: :class:`MLAFoldedVarlenAttention` within each document of TorchTitan's
``VarlenMetadata``; :class:`MLAFoldedRowsAttention` (``mla_document_masks = "drop"``) causal
within each ``max_context_length`` row of the tokens (a folded batch of rows of equal length is
varlen with ``cu_seqlens`` at multiples of the row length). The routing is the varlen path's
(:mod:`.routing`, layout ``thd``).
"""

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
"""The model config's property that :class:`MLAFoldedRowsAttention`'s rows are as long as
(main's ``Decoder.Config.max_context_length``, ``models/common/decoder.py:129-137``: the first
attention's RoPE length, which ``update_from_config`` sets to ``training.max_context_length``)."""


def _tokens_first(out: Tensor) -> Tensor:
    """``(1, heads, tokens, dim)`` -> ``(tokens, heads, dim)``, a view."""
    return out.squeeze(0).transpose(0, 1)


def _one_sequence(t: Tensor) -> Tensor:
    """``(tokens, heads, dim)`` -> ``(1, heads, tokens, dim)``, a view: the folded tokens as
    one sequence, which :meth:`~.module.MLAVarlenInnerAttention.within_documents` cuts by
    ``cu_seqlens`` (its packing is then a view again)."""
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
    """In place of main's ``FlexAttention``/``VarlenAttention`` under ``mla_document_masks =
    "drop"``: aiter's varlen attention, causal within each ``row_length`` row of the tokens,
    across documents; the masks are ignored."""

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
