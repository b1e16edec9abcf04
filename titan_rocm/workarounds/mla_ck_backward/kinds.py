"""The attention kinds MLA on aiter tells apart, on either TorchTitan version."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch.nn as nn

DENSE, FLEX_CAUSAL, VARLEN, DROPPED = "sdpa", "flex", "varlen", "dropped"
ROWS = "rows"
"""Document masks dropped on folded tokens: causal within each ``max_context_length`` row, across
documents."""
ATTENTION_LABELS = {
    DENSE: "sdpa (causal): aiter dense attention",
    FLEX_CAUSAL: "flex (causal mask): aiter dense attention",
    VARLEN: "varlen (block_causal mask): aiter varlen attention within each document",
    DROPPED: "flex (block_causal mask dropped): aiter dense causal attention across documents",
    ROWS: "flex (block_causal mask dropped): aiter varlen attention, causal within each "
          "max_context_length row of the folded tokens, across documents",
}
"""How each attention kind shows in plans."""
VARLEN_KINDS = frozenset({VARLEN, ROWS})
"""Kinds that run through aiter's varlen entry points (``thd`` tensors, ``cu_seqlens``)."""
DROPPED_KINDS = (DROPPED, ROWS)
"""Kinds that ignore the per-document masks (``mla_document_masks = "drop"``)."""


@dataclass(frozen=True)
class Layout:
    """The replacements of one q/k/v layout of TorchTitan 0.3.0's API: which module each attention
    kind gets, and which kinds dropped masks and stock SDPA become."""

    replacements: Mapping[str, type[nn.Module]]
    dropped: str
    """The kind of per-document attention under ``mla_document_masks = "drop"``."""
    sdpa: str | None
    """The kind stock ``ScaledDotProductAttention`` gets; None: left as it is."""
